"""Scheduler (scheduler process): receive, and the prefill forward of each batch (admission).

No hook on ``_add_request_to_queue``: a request's trace is made at its first radix match
(``schedule_batch.new_trace``), from when SGLang itself noted it was received and queued
(``req.time_stats``), one hooked call less on every request's way to its first token."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from ...patch import Direct
from ...stages import MODEL_FORWARD
from ..base import HookSpec, interval
from . import state as ss
from .schedule_batch import admit, scan_images


def _recv_make(kind: str) -> Direct:
    """``recv_requests``: when a call returns requests, remember when it started (their receive start).

    Not an ``interval`` hook: the scheduler polls ``recv_requests`` in a tight loop, thousands of
    times per request, and the generic wrapper's cost, paid on every empty poll, would add up to a
    large share of the scheduler's time per request: this one does only a timestamp and a truth test.
    Nothing here can raise.
    """
    if kind != "sync":
        raise ValueError(f"scheduler.recv_requests: no wrapper for kind {kind!r}")

    def build(func: Callable[..., Any], on: Any, bound: bool) -> Callable[..., Any]:
        def recv_hook(*args, **kwargs):
            if not on:
                return func(*args, **kwargs)
            t0 = ss.now()
            result = func(*args, **kwargs)
            if result:
                ss.last_recv_start = t0
            return result

        return recv_hook

    return Direct(build)


def _run_enter(instance: Any, args: tuple, kwargs: dict) -> Any:
    # Called for every batch, and for a prefill on its first token's way: helpers inlined (no ``arg``).
    ss.current = None
    batch = args[0] if args else kwargs.get("batch")
    mode = getattr(batch, "forward_mode", None)
    if mode is None or not mode.is_extend():
        return None
    t = ss.now()
    traces = []
    # --enable-mixed-chunk: a prefill batch also carries running requests' decode steps. A request
    # whose last chunk's result is not processed yet (overlap) has no first token on record, though
    # this step decodes it: it is no part of the prefill.
    decoding = {id(r) for r in batch.decoding_reqs} if getattr(batch, "decoding_reqs", None) else ()
    for r in batch.reqs:
        tr = getattr(r, "_mmtrace", None)
        if tr is not None and not tr.first_token and not (decoding and id(r) in decoding):
            if not tr.admitted:
                admit(r, tr, t)
            traces.append(tr)
    if not traces:
        return None
    ctx = ss.FwdCtx(traces, t, len(batch.reqs))
    mm_inputs = getattr(batch, "multimodal_inputs", None)
    if mm_inputs and any(mm_inputs):  # a text prefill makes no call for it
        scan_images(ctx, batch)
    for tr in traces:  # the overlap scheduler processes a copy of the batch: keep it on the requests' traces
        if tr.fwd is None:
            tr.fwd = ctx
        else:
            tr.fwd_next = ctx  # the next chunk, launched before the last one's result was processed
    ss.current = ctx
    return ctx


def _run_exit(st, t0, t1, instance, args, kwargs, result, exc) -> None:
    # times only: the forward's events are built with its result, after the hand-off (batch_result)
    st.t0, st.t1 = t0, t1
    st.clock.last = None  # a sampling SGLang delays past run_batch takes a mark of its own


def _forward_detail(instance: Any, args: tuple, kwargs: dict) -> tuple[str, ...] | None:
    ctx = ss.current  # set by _run_enter, which runs before the range is pushed
    return tuple(ctx.rids) if ctx is not None else None


PART = "scheduler"  # the switch part that gates these hooks

HOOKS: dict[str, HookSpec] = {
    "scheduler.recv_requests": HookSpec("scheduler.recv_requests", make=_recv_make),
    # entered_only: a decode batch (every step of every request) only resets ``ss.current``
    "scheduler.run_batch": interval(
        "scheduler.run_batch", _run_exit, _run_enter, nvtx=(MODEL_FORWARD, _forward_detail), entered_only=True
    ),
}

# the arguments each hook reads from its target (registry.READS_OF)
READS: dict[str, tuple[tuple[int | None, str | None], ...]] = {
    "scheduler.run_batch": ((0, "batch"),),
}
