"""DetokenizerManager (detokenizer process): the first output of each request detokenized."""

from __future__ import annotations

from typing import Any

from ... import runtime
from ...stages import DETOKENIZE
from ..base import HookSpec, arg, interval
from ..scheduler import state as ss


def _enter(instance: Any, args: tuple, kwargs: dict) -> Any:
    box = runtime.outbox
    if box is not None:
        box.flush_pending()  # the previous batch's events: SGLang has sent its text on by now
    recv_obj = arg(args, kwargs, 0, "recv_obj")
    status = getattr(instance, "decode_status", None)
    rids = getattr(recv_obj, "rids", None) or ()
    if status is None:
        return None
    first = tuple(rid for rid in rids if rid not in status)
    return (first, len(rids)) if first else None


def _exit(st, t0, t1, instance, args, kwargs, result, exc) -> None:
    first, n = st
    ss.emit(first, DETOKENIZE, t0, t1, attrs={"batch_size": n})


def _detail(instance: Any, args: tuple, kwargs: dict) -> tuple[str, ...] | None:
    st = _enter(instance, args, kwargs)
    return tuple(st[0]) if st else None


PART = "detokenizer"  # the switch part that gates these hooks

HOOKS: dict[str, HookSpec] = {
    # entered_only: a batch with no request's first output (every later step) goes straight through
    "detokenizer.handle_batch": interval(
        "detokenizer.handle_batch", _exit, _enter, nvtx=(DETOKENIZE, _detail), entered_only=True
    ),
}

# the arguments each hook reads from its target (registry.READS_OF)
READS: dict[str, tuple[tuple[int | None, str | None], ...]] = {
    "detokenizer.handle_batch": ((0, "recv_obj"),),
}
