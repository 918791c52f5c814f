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


REF_TTL_S = 0.5
"""How long a forward's reference mark serves the forwards after it (``Clock``). Bounded because the
reference places marks on the host timeline by their GPU-clock offset from it, and the GPU's clock and
``perf_counter`` may drift apart; at 0.5 s, requests that arrive more often than twice a second
(and every forward under load) take no reference mark of their own."""


class Reference:
    """A forward's first mark and its host time: read right after it was recorded (a forward launches
    on an idle GPU when the server is not busy), moved later when a forward finds it early
    (``Clock._settle``). ``taken``: the host time it was recorded at, which its age counts from."""

    __slots__ = ("marks", "seq", "t", "taken")

    def __init__(self, marks: cuda_marks.Marks, seq: int, t: float) -> None:
        self.marks = marks
        self.seq = seq
        self.t = self.taken = t


shared: Reference | None = None
"""The last reference a forward took on this scheduler thread, for the forwards of the next
``REF_TTL_S`` (``Clock``)."""


class Clock:
    """Host timestamps, or CUDA event marks on the current stream when the forward runs on a GPU.

    Each CUDA call costs 10-30 µs of the scheduler thread's CPU on the H200, the first after the GPU
    idled the most (``benchmarks/results/marks-h200-20261201/``, ``record-cost-h200-20261203-2/``), so a
    forward makes as few as its stages need. Marks are placed on the host timeline by their GPU offset
    from a reference mark. A forward that finds a reference taken less than ``REF_TTL_S`` ago (and not
    about to be lapped in the ring) adopts it, and its own start (``start``) is then the host time at
    its launch, not a mark: only the stage ends cost CUDA calls. Otherwise its first mark becomes the
    reference, taken with the host time right after it (the GPU is idle when a forward launches on an
    idle server) and shared with the forwards after it. ``mark_on`` lets a stage that starts where the
    last one ended share its mark.

    An adopted reference is checked against this forward (``_settle``): none of its marks can have run
    on the GPU before the forward was launched, so when the reference places the first of them earlier
    than that launch (the reference was recorded behind queued GPU work, or the clocks drifted), the
    reference's host time moves later by the difference, here and for the forwards that follow.
    """

    __slots__ = ("marks", "ref", "t_start", "first", "last", "_host")

    def __init__(self, t_launch: float) -> None:
        self.marks: cuda_marks.Marks | None = None
        self.ref: Reference | None = None
        self.t_start = t_launch
        self.first: int | None = None
        """This forward's first CUDA mark."""
        self.last: int | float | None = None
        """The last mark, until ``run_batch`` returns (``mark_on``)."""
        self._host: dict[int, float] | None = None
        if config.get().gpu_timing and switch.on("cuda_events"):
            marks = self.marks = cuda_marks.device_marks()
            ref = shared
            if (
                marks is not None
                and ref is not None
                and ref.marks is marks
                and t_launch - ref.taken < REF_TTL_S
                and marks.taken - ref.seq < cuda_marks.RING // 2
            ):
                self.ref = ref

    def start(self) -> int | float:
        """The forward's start: the host time now when it adopted a reference, else its first mark."""
        if self.ref is not None:
            self.last = t = self.t_start = now()
            return t
        return self.mark()

    def mark(self) -> int | float:
        marks = self.marks
        if marks is not None:
            m = marks.mark()
            if m is not None:
                if self.first is None:
                    self.first = m
                    if self.ref is None:
                        global shared
                        self.ref = shared = Reference(marks, m, now())
                self.last = m
                return m
            if self.first is None:
                # no mark of its own (graph capture, a failed call): the forward is host-timed
                self.marks = self.ref = None
        self.last = t = now()
        return t

    def mark_on(self, prev: int | float | None) -> int | float:
        """``prev`` again when it is still the last mark (no other stage marked since, and the forward
        has not returned): a stage that starts where ``prev``'s ended, with no GPU work launched between
        them, needs no mark of its own. A new mark otherwise."""
        return prev if prev is not None and prev is self.last else self.mark()

    def host(self, mark: int | float) -> float:
        """A mark on the host timeline (CUDA marks: offset from the reference, read once each)."""
        if isinstance(mark, float):
            return mark
        ref = self.ref
        assert ref is not None
        known = self._host
        if known is None:
            known = self._host = {}
            self._settle(ref, known)
        t = known.get(mark)
        if t is None:
            t = known[mark] = ref.t + self._offset(ref, mark)
        return t

    def _settle(self, ref: Reference, known: dict[int, float]) -> None:
        """Before the first read: move an adopted reference's host time later when it places this
        forward's first mark before the forward's launch (see the class docstring). A reference the
        forward took itself needs nothing: its host time was read right after it."""
        first = self.first
        if first is None or ref.seq == first:
            return
        t = ref.t + self._offset(ref, first)
        if t < self.t_start:
            ref.t += self.t_start - t
            t = self.t_start
        known[first] = t

    @staticmethod
    def _offset(ref: Reference, mark: int) -> float:
        if mark == ref.seq:
            return 0.0
        s = ref.marks.elapsed_s(ref.seq, mark)
        if isinstance(s, str):
            raise ValueError(f"CUDA mark {s}")  # contained and counted by the hook's guard
        return s

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
        self.clock = Clock(t0)
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
