"""ModelRunner (scheduler process): the LM forward and first-token sampling of a prefill batch, and
the model's encoders hooked once it is loaded (``model_runner.load_model``).

Marks are CUDA events on the current stream when the model runs on a GPU, host times otherwise;
they are read when the batch result is processed (see ``batch_result``).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace
from typing import Any

from ... import runtime
from ...sinks import nvtx
from ...stages import MODEL_PREFILL, MODEL_SAMPLE
from ..base import HookSpec, guarded, interval, push_batch_range
from . import state as ss

Rids = Callable[[ss.FwdCtx, tuple, dict], tuple[str, ...]]
"""Which requests of the forward a call works for (None: all of them, ``ctx.rids``)."""
Start = Callable[[ss.Clock], Any]
"""The call's first mark: a ``Clock`` method, called unbound on the forward's clock (no frame of ours
between the hook and the clock, on the first token's way)."""


def marked(
    component: str,
    slot: str,
    stage: str,
    rids: Rids | None = None,
    start: Start = ss.Clock.mark,
) -> HookSpec:
    """Mark the first call of a prefill forward into ``ctx.<slot>``, inside an NVTX range for ``rids``."""

    def store(ctx: ss.FwdCtx, m0: Any, m1: Any, args: tuple, kwargs: dict) -> None:
        if getattr(ctx, slot) is None:
            setattr(ctx, slot, (m0, m1))
            if slot == "fwd":
                ctx.clock.fwd_end = m1
            elif slot == "sample":
                ctx.t_sample_end = ss.now()

    return around_forward(component, stage, rids, store, start)


def around_forward(
    component: str,
    stage: str,
    rids: Rids | None,
    store: Callable[[ss.FwdCtx, Any, Any, tuple, dict], None],
    start: Start = ss.Clock.mark,
) -> HookSpec:
    """Clock marks around a call made inside the current prefill forward, handed to ``store``.

    Outside a prefill forward (``ss.current`` is None: every decode step) the call goes straight
    through (``interval``'s ``entered_only``). ``rids`` runs before the call and names the requests
    the call works for (None: every request of the forward): the NVTX range's, and when it names none
    (an embedding call whose images are all in the radix prefix) nothing is marked or stored, for
    marks are CUDA calls on the TTFT path. ``start`` gives the first mark (``Clock.after_forward``:
    sampling shares the forward's end; ``Clock.start``: a host time when the forward adopted an
    earlier reference). A failure before the call leaves no first mark and so nothing stored; either
    way the call runs once and its result or exception passes through.
    """

    def enter(instance: Any, rest: tuple, kwargs: Any) -> Any:
        ctx = ss.current
        if ctx is None:
            return None
        names = ctx.rids if rids is None else rids(ctx, rest, kwargs)
        if not names:
            return None
        m0 = start(ctx.clock)
        return ctx, m0, nvtx.domain is not None and push_batch_range(component, stage, names)

    def leave(st: Any, t0: float, t1: float, instance: Any, rest: tuple, kwargs: Any, result: Any, exc: Any) -> None:
        ctx, m0, pushed = st
        try:
            m1 = ctx.clock.mark()
        finally:
            if pushed:
                guarded(component, nvtx.pop)
        store(ctx, m0, m1, rest, kwargs)

    return interval(component, leave, enter, entered_only=True)


TRANSFORMERS_BACKEND = "sglang.srt.models.transformers"
"""The module of SGLang's transformers-backend classes, which wrap an HF model as ``.model``."""


def _loaded(st, t0, t1, instance, args, kwargs, result: Any, exc: BaseException | None) -> None:
    model = getattr(instance, "model", None)
    if exc is None and model is not None:
        runtime.apply_late("model", type(model), model)
        inner = getattr(model, "model", None)
        if type(model).__module__ == TRANSFORMERS_BACKEND and inner is not None:
            runtime.apply_late("hf_model", type(inner), inner)


PART = "scheduler"  # the switch part that gates these hooks

HOOKS: dict[str, HookSpec] = {
    # set-up, never gated: hooks the loaded model's encoders (the manifest's applies_to = "model")
    "model_runner.load_model": replace(interval("model_runner.load_model", _loaded), gated=False),
    "model_runner.forward": marked("model_runner.forward", "fwd", MODEL_PREFILL, start=ss.Clock.start),
    "model_runner.sample": marked("model_runner.sample", "sample", MODEL_SAMPLE, start=ss.Clock.after_forward),
}

# the arguments each hook reads from its target (registry.READS_OF)
READS: dict[str, tuple[tuple[int | None, str | None], ...]] = {}
