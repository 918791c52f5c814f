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

now = time.perf_counter
_ship = switch.gate("ship")


class ReqTrace:
    __slots__ = ("rid", "t_recv", "t_enqueue", "t_match0", "t_match1", "admitted", "first_token", "fwd", "vit_skipped")

    def __init__(self, t_recv: float, t_enqueue: float, rid: str) -> None:
        self.rid = rid
        self.t_recv = t_recv
        self.t_enqueue = t_enqueue
        self.t_match0: float | None = None
        self.t_match1: float | None = None
        self.admitted = False
        self.first_token = False
        self.fwd: FwdCtx | None = None  # the last prefill forward, until its result is processed
        self.vit_skipped = 0  # images whose encoder run the radix prefix made unnecessary


class Clock:
    """Host timestamps, or CUDA events on the current stream when the forward runs on a GPU."""

    def __init__(self) -> None:
        self.cuda = False
        self.ref: Any = None
        self.t_ref = 0.0
        if config.get().gpu_timing and switch.on("cuda_events"):
            self.cuda = _cuda_ready()
        if self.cuda:
            self.ref = self.mark()
            self.t_ref = now()

    def mark(self) -> Any:
        if self.cuda:
            import torch

            if not torch.cuda.is_current_stream_capturing():
                ev = torch.cuda.Event(enable_timing=True)
                ev.record()
                return ev
        return now()

    def host(self, mark: Any) -> float:
        """A mark on the host timeline (CUDA marks: offset from the reference event)."""
        if isinstance(mark, float):
            return mark
        return self.t_ref + self.ref.elapsed_time(mark) / 1000.0

    @property
    def name(self) -> str:
        return "cuda" if self.cuda else "host"


_cuda_seen = False


def _cuda_ready() -> bool:
    """CUDA initialized in this process (remembered once true: it stays so for the process's life)."""
    global _cuda_seen
    if not _cuda_seen:
        try:
            import torch

            _cuda_seen = torch.cuda.is_available() and torch.cuda.is_initialized()
        except Exception:
            return False
    return _cuda_seen


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
