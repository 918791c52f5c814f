"""ModelRunner (scheduler process): the LM forward and first-token sampling of a prefill batch.

Marks are CUDA events on the current stream when the model runs on a GPU, host times otherwise;
they are read when the batch result is processed (see ``batch_result``).
"""

from __future__ import annotations

from .. import nvtx_ranges
from .. import scheduler_state as ss
from .base import HookSpec, Wrapper, guarded, push_batch_range


def _marked(component: str, slot: str, stage: str) -> HookSpec:
    def make(kind: str) -> Wrapper:
        if kind != "sync":
            raise ValueError(f"{component}: expected a sync target, got {kind}")

        def wrapper(wrapped, instance, args, kwargs):
            ctx = ss.current
            if ctx is None:
                return wrapped(*args, **kwargs)
            pushed = push_batch_range(component, stage, ctx.rids)
            m0 = guarded(component, ctx.clock.mark)
            try:
                return wrapped(*args, **kwargs)
            finally:
                m1 = guarded(component, ctx.clock.mark)
                if pushed:
                    guarded(component, nvtx_ranges.pop)
                if m0 is not None and m1 is not None and getattr(ctx, slot) is None:
                    setattr(ctx, slot, (m0, m1))
                    if slot == "sample":
                        ctx.t_sample_end = ss.now()

        return wrapper

    return HookSpec(component, make=make)


HOOKS: dict[str, HookSpec] = {
    "model_runner.forward": _marked("model_runner.forward", "fwd", "model.prefill"),
    "model_runner.sample": _marked("model_runner.sample", "sample", "model.sample"),
}
