"""Scheduler-process state: per-request timestamps on ``Req`` and the current prefill forward.

Per-request state lives on the ``Req`` object (``req._mmtrace``), so it dies with the request.
The forward context is shared by the traces of its requests until its result is processed, where GPU
events are read: ``copy_done`` has been synchronized there, so reading them adds no host sync. It
holds those traces, never the ``Req`` objects: a ``Req -> trace -> forward -> Req`` cycle would keep a
request aborted mid-prefill (and its image tensors) alive until Python's cyclic GC ran.
"""

from __future__ import annotations

import time
from typing import Any

from ... import config, runtime, switch
from .. import cuda_marks

now = time.perf_counter
_ship = switch.gate("ship")


class ReqTrace:
    """One request's scheduler timestamps. Before the first token's hand-off the hooks only store
    times and the few values that change later; the events are built after it (``batch_result``)."""

    __slots__ = (
        "rid",
        "t_recv",
        "t_enqueue",
        "t_match0",
        "t_match1",
        "admitted",
        "admission",
        "first_token",
        "fwd",
        "vit_skipped",
    )

    def __init__(self, t_recv: float, t_enqueue: float, rid: str) -> None:
        self.rid = rid
        self.t_recv = t_recv
        self.t_enqueue = t_enqueue
        self.t_match0: float | None = None
        self.t_match1: float | None = None
        self.admitted = False
        self.admission: tuple[int, int] | None = None
        """(cached tokens, prefix length) as read at admission, until its ``scheduler.queue`` and
        ``scheduler.prefix_match`` events are built (the match's times are ``t_match0``/``t_match1``)."""
        self.first_token = False
        self.fwd: FwdCtx | None = None  # the last prefill forward, until its result is processed
        self.vit_skipped = 0  # images whose encoder run the radix prefix made unnecessary


class Clock:
    """Host timestamps, or CUDA event marks on the current stream when the forward runs on a GPU.

    Each CUDA call costs 10-30 µs of the scheduler thread's CPU on the H200
    (``benchmarks/results/marks-h200-20261201/``), so a forward makes as few as its stages need: the
    first mark is also the reference that places the others on the host timeline (taken with the
    host time right after it), and ``mark_on`` lets a stage that starts where the last one ended
    share its mark.
    """

    __slots__ = ("marks", "ref", "t_ref", "last", "_host")

    def __init__(self) -> None:
        self.marks: cuda_marks.Marks | None = None
        self.ref: int | None = None
        self.t_ref = 0.0
        self.last: int | float | None = None
        """The last mark, until ``run_batch`` returns (``mark_on``)."""
        self._host: dict[int, float] | None = None
        if config.get().gpu_timing and switch.on("cuda_events"):
            self.marks = cuda_marks.device_marks()

    def mark(self) -> int | float:
        marks = self.marks
        if marks is not None:
            m = marks.mark()
            if m is not None:
                if self.ref is None:
                    self.ref, self.t_ref = m, now()
                self.last = m
                return m
            if self.ref is None:
                self.marks = None  # no reference (graph capture, a failed call): the forward is host-timed
        self.last = t = now()
        return t

    def mark_on(self, prev: int | float | None) -> int | float:
        """``prev`` again when it is still the last mark (no other stage marked since, and the forward
        has not returned): a stage that starts where ``prev``'s ended, with no GPU work launched between
        them, needs no mark of its own. A new mark otherwise."""
        return prev if prev is not None and prev is self.last else self.mark()

    def host(self, mark: int | float) -> float:
        """A mark on the host timeline (CUDA marks: offset from the reference mark, read once each)."""
        if isinstance(mark, float):
            return mark
        assert self.marks is not None and self.ref is not None
        if mark == self.ref:
            return self.t_ref
        if self._host is None:
            self._host = {}
        elif (t := self._host.get(mark)) is not None:
            return t
        s = self.marks.elapsed_s(self.ref, mark)
        if isinstance(s, str):
            raise ValueError(f"CUDA mark {s}")  # contained and counted by the hook's guard
        t = self._host[mark] = self.t_ref + s
        return t

    @property
    def name(self) -> str:
        return "cuda" if self.marks is not None else "host"


class FwdCtx:
    """What the hooks inside one prefill forward measured."""

    __slots__ = (
        "rids",
        "traces",
        "t0",
        "t1",
        "clock",
        "fwd",
        "sample",
        "t_sample_end",
        "embed",
        "vit",
        "needs_embed",
        "hash_to_rids",
        "batch_size",
    )

    def __init__(self, traces: list[ReqTrace], t0: float, batch_size: int) -> None:
        self.traces = traces  # the requests' traces, not the Req objects (see the module docstring)
        self.batch_size = batch_size
        self.rids = tuple(tr.rid for tr in traces)
        self.t0 = t0
        self.t1 = t0
        self.clock = Clock()
        self.fwd: tuple[Any, Any] | None = None
        self.sample: tuple[Any, Any] | None = None
        self.t_sample_end: float | None = None  # host time; sampling may run after run_batch (overlap)
        self.embed: tuple[Any, Any] | None = None
        self.vit: list[tuple[Any, Any, list[int]]] = []
        self.needs_embed: dict[str, int] = {}  # rid -> images overlapping this extend
        self.hash_to_rids: dict[int, list[str]] = {}


current: FwdCtx | None = None
"""The last prefill forward launched on the scheduler thread; reset by every ``run_batch``.

It outlives ``run_batch`` because the overlap scheduler samples after ``run_batch`` returns."""

last_recv_start = 0.0
last_stream_end = 0.0
"""When the scheduler last finished handing outputs to the detokenizer (``stream_output``)."""


def emit(rids: Any, stage: str, t0: float, t1: float, clock: str = "host", attrs: dict[str, Any] | None = None) -> None:
    box = runtime.outbox
    if box is not None and _ship.on:
        box.add(rids, stage, t0, t1, clock, attrs)
