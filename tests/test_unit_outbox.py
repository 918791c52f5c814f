"""The outbox's queue when two threads flush it (the scheduler's thread at ``scheduler.output`` and
the control thread's heartbeat): no event is lost, none is sent twice, nothing raises.

The interleaving is forced with a deque that lets "the other thread" take the last event between
the flushing thread's check and its pop: a real race hits that window too rarely for a test."""

from __future__ import annotations

import collections
import pickle
import threading
from typing import Any

import pytest

from sglang_mmtrace import telemetry
from sglang_mmtrace.join.outbox import Outbox


class _Sock:
    def __init__(self) -> None:
        self.sent: list[Any] = []

    def send(self, data: bytes, flags: int = 0) -> None:
        self.sent.append(pickle.loads(data))


class _RacedDeque(collections.deque):
    """The other flusher takes the last event just before this thread pops it."""

    def __init__(self, *a: Any) -> None:
        super().__init__(*a)
        self.stolen: list[Any] = []

    def popleft(self) -> Any:
        if len(self) == 1 and not self.stolen:
            self.stolen.append(super().popleft())
        return super().popleft()


def _events(sock: _Sock) -> list[str]:
    return [ev[1] for msg in sock.sent if msg[0] == "ev" for ev in msg[3]]


@pytest.fixture
def box() -> tuple[Outbox, _Sock]:
    pytest.importorskip("zmq")
    b, sock = Outbox("inproc://unused", "scheduler"), _Sock()
    b._sock = sock
    return b, sock


def test_losing_the_race_for_the_last_event_sends_the_others(box: tuple[Outbox, _Sock]) -> None:
    b, sock = box
    q = b._q = _RacedDeque()
    for stage in ("scheduler.recv", "scheduler.queue", "scheduler.prefix_match"):
        b.add("r1", stage, 1.0, 2.0)
    errors = dict(telemetry.errors)
    b.flush()
    assert _events(sock) == ["scheduler.recv", "scheduler.queue"]
    assert [ev[1] for ev in q.stolen] == ["scheduler.prefix_match"]  # went with the other thread's message
    assert not q and dict(telemetry.errors) == errors


def test_two_threads_flushing_send_each_event_once(box: tuple[Outbox, _Sock]) -> None:
    b, sock = box
    n = 20000
    for i in range(n):
        b.add(f"r{i}", "model.forward", 0.0, 1.0)
    start = threading.Barrier(2)

    def flush() -> None:
        start.wait()
        b.flush(heartbeat=True)

    threads = [threading.Thread(target=flush) for _ in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    rids = [ev[0] for msg in sock.sent if msg[0] == "ev" for ev in msg[3]]
    assert sorted(rids) == sorted(f"r{i}" for i in range(n)) and not b._q
    assert [msg[0] for msg in sock.sent].count("hb") == 2
