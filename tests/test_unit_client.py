"""The API process's hand-over of finished requests to the collector (``join/client.py``), on a real
ZMQ socket: a PULL socket bound here stands where the collector process listens."""

from __future__ import annotations

import gc
import pickle
from collections.abc import Iterator
from pathlib import Path
from types import SimpleNamespace

import pytest
import zmq

from sglang_mmtrace.join import ipc
from sglang_mmtrace.join.client import CollectorClient
from sglang_mmtrace.join.context import ApiTrace, HttpCtx, from_wire


@pytest.fixture
def wired(tmp_path: Path) -> Iterator[tuple[CollectorClient, zmq.Socket]]:
    addresses = ipc.addresses(str(tmp_path))
    pull = zmq.Context.instance().socket(zmq.PULL)
    pull.setsockopt(zmq.LINGER, 0)
    pull.bind(addresses[0])
    client = CollectorClient.attach(*addresses)
    yield client, pull
    client.close()
    pull.close()


def exchange(rids: list[str]) -> HttpCtx:
    """An HTTP exchange with one trace per rid, linked both ways as the TokenizerManager hook links them."""
    http = HttpCtx(1.0, "/v1/chat/completions")
    for rid in rids:
        trace = ApiTrace(rid, http, "m", 1.0)
        trace.add("tokenize", 1.1, 1.2)
        http.traces.append(trace)
    return http


def alive(ids: set[int]) -> list[ApiTrace]:
    """Which of these traces the collector still tracks (the received copies are other objects)."""
    return [o for o in gc.get_objects() if type(o) is ApiTrace and id(o) in ids]


def test_a_finished_exchange_is_shipped_once_and_freed_without_the_garbage_collector(
    wired: tuple[CollectorClient, zmq.Socket],
) -> None:
    """Both traces arrive with their exchange; afterwards no reference cycle keeps them: with the
    collector disabled they are gone as soon as the last reference is dropped."""
    client, pull = wired
    gc.collect()
    gc.disable()
    try:
        http = exchange(["cyc-a", "cyc-b"])
        client.finish_http(http)
        client.finish_http(http)  # the middleware's ``finally`` calls it again: nothing more is sent
        assert pull.poll(5000), "nothing shipped"
        kind, _process, _pid, (wires, _health) = pickle.loads(pull.recv())
        assert kind == "api" and not pull.poll(200), "shipped twice"
        shipped = [from_wire(w) for w in wires]
        assert [t.rid for t in shipped] == ["cyc-a", "cyc-b"]
        assert all(t.http is not None and t.http.path == "/v1/chat/completions" for t in shipped)
        assert all(t.closed and t.http is None for t in http.traces)
        ids = {id(t) for t in http.traces}
        assert len(alive(ids)) == 2
        del http
        assert alive(ids) == [], "a reference cycle kept the finished traces alive"
    finally:
        gc.enable()


def test_dispatch_is_read_from_sglangs_own_notes_at_the_hand_over(wired: tuple[CollectorClient, zmq.Socket]) -> None:
    """No hook times ``_send_one_request``: SGLang notes its start and end in the rid's time stats
    (``api_server_dispatch_time``/``_finish_time``) and marks the rid's state dispatched, read when the
    request is handed over. A request whose dispatch did not finish (it raised) has no ``dispatch``
    stage and did not reach the scheduler. The prefix request of a parallel sampling is sent with the
    prompt's time stats: it reached the scheduler (its own flag) with no ``dispatch`` of its own, and
    the prompt, never sent itself, did not, though its time stats hold the prefix request's times. A
    release whose state has no flag (0.5.18, 0.5.19) goes by the times. The trace lets go of the state."""
    client, pull = wired
    names = ["sent", "failed", "prefix", "prompt", "no_flag", "bare"]
    http = exchange(names)
    sent_times = SimpleNamespace(api_server_dispatch_time=1.3, api_server_dispatch_finish_time=1.35)
    unsent = SimpleNamespace(api_server_dispatch_time=0.0, api_server_dispatch_finish_time=0.0)
    states = {
        "sent": SimpleNamespace(dispatched=True, time_stats=sent_times),
        "failed": SimpleNamespace(
            dispatched=False,
            time_stats=SimpleNamespace(api_server_dispatch_time=1.3, api_server_dispatch_finish_time=0.0),
        ),
        "prefix": SimpleNamespace(dispatched=True, time_stats=unsent),
        "prompt": SimpleNamespace(dispatched=False, time_stats=sent_times),
        "no_flag": SimpleNamespace(time_stats=sent_times),
    }
    for trace in http.traces:
        trace.sglang_state = states.get(trace.rid)
    client.finish_http(http)
    assert pull.poll(5000), "nothing shipped"
    _kind, _process, _pid, (wires, _health) = pickle.loads(pull.recv())
    shipped = {t.rid: t for t in map(from_wire, wires)}
    dispatch = {rid: [(e.t0, e.t1) for e in t.events if e.name == "dispatch"] for rid, t in shipped.items()}
    assert dispatch == {
        "sent": [(1.3, 1.35)],
        "failed": [],
        "prefix": [],
        "prompt": [],
        "no_flag": [(1.3, 1.35)],
        "bare": [],
    }
    assert {rid for rid, t in shipped.items() if t.dispatched} == {"sent", "prefix", "no_flag"}
    assert all(t.sglang_state is None for t in http.traces)
