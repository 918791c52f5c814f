"""The scheduler-side state never keeps a ``Req`` alive past SGLang's own references.

A request aborted between its prefill launch and the processing of that result leaves the plugin's
forward context behind. If that context held the ``Req`` (``Req -> trace -> forward -> Req``), the
request and its image tensors would wait for Python's cyclic GC, which the scheduler runs rarely:
the plugin-on scheduler's RSS swung by hundreds of MiB in the 10k soak
(``benchmarks/results/reliability/soak10k-paired``). These tests run with the GC off, so only
reference counting can free the request.
"""

from __future__ import annotations

import gc
import weakref
from collections.abc import Iterator
from types import SimpleNamespace
from typing import Any

import pytest

from sglang_mmtrace import runtime
from sglang_mmtrace.hooks.scheduler import batch_result, schedule_batch, scheduler
from sglang_mmtrace.hooks.scheduler import state as ss


class Req:
    """The attributes of SGLang's ``Req`` the scheduler hooks read."""

    def __init__(self, rid: str) -> None:
        self.rid = rid
        self.output_ids: list[int] = []
        self.origin_input_ids = list(range(12))  # read at admission (``scheduler.run_batch``)
        self.pixels = bytearray(1 << 20)  # stands for the request's image tensors
        self.time_stats = SimpleNamespace(scheduler_recv_time=ss.now(), wait_queue_entry_time=ss.now())

    def finished(self) -> bool:
        return False


class Box:
    def __init__(self) -> None:
        self.sent: list[tuple[Any, ...]] = []

    def add(self, rids: Any, stage: str, t0: float, t1: float, clock: str = "host", attrs: Any = None) -> None:
        self.sent.append((rids, stage, t0, t1, clock, attrs or {}))


@pytest.fixture
def box(monkeypatch: pytest.MonkeyPatch) -> Iterator[Box]:
    b = Box()
    monkeypatch.setattr(runtime, "outbox", b)
    monkeypatch.setattr(ss, "current", None)
    ss.Clock(0.0)  # the first one imports torch, whose import leaves cycles that hold the importing frames
    gc.collect()
    gc.disable()
    try:
        yield b
    finally:
        gc.enable()


def admit(req: Req) -> None:
    match = schedule_batch.HOOKS["schedule_batch.match"].make("sync")  # the first match makes the trace
    match(lambda: None, req, (), {})
    assert req._mmtrace.rid == req.rid  # type: ignore[attr-defined]


def prefill(reqs: list[Req]) -> SimpleNamespace:
    batch = SimpleNamespace(reqs=reqs, forward_mode=SimpleNamespace(is_extend=lambda: True))
    run = scheduler.HOOKS["scheduler.run_batch"].make("sync")
    assert run(lambda b: "result", None, (batch,), {}) == "result"
    return batch


def test_a_request_dropped_before_its_prefill_result_is_freed_by_refcount(box: Box) -> None:
    a, b = Req("A"), Req("B")
    admit(a)
    admit(b)
    batch = prefill([a, b])
    assert ss.current is not None and ss.current.rids == ("A", "B")
    gone = weakref.ref(a)
    # SGLang aborts A before the result is processed: it drops the batch and its own references.
    batch.reqs = [b]
    del a
    assert gone() is None, f"the plugin keeps the aborted Req alive: {gc.get_referrers(gone())}"
    assert box.sent == []  # the requests' and the forward's events: with its result


def test_a_processed_prefill_leaves_no_cycle_behind(box: Box) -> None:
    reqs = [Req("A"), Req("B")]
    for req in reqs:
        admit(req)
    batch = prefill(reqs)
    for req in reqs:
        req.output_ids = [7]
    del req
    process = batch_result.HOOKS["batch_result.prefill"].make("sync")
    assert process(lambda bt, res: res, None, (batch, "res"), {}) == "res"
    assert ss.current is None
    refs = [weakref.ref(r) for r in reqs]
    del reqs, batch
    assert [w() for w in refs] == [None, None]
    assert gc.collect() == 0, "the processed forward left a reference cycle (trace <-> forward) for the GC"
    stages = [e[1] for e in box.sent]
    assert stages.count("model.forward") == 1 and "scheduler.output" in stages
