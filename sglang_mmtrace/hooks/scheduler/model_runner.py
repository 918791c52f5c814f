"""ModelRunner (scheduler process): the LM forward and first-token sampling of a prefill batch.

Marks are CUDA events on the current stream when the model runs on a GPU, host times otherwise;
they are read when the batch result is processed (see ``batch_result``).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from ... import telemetry
from ...patch import Direct
from ...sinks import nvtx
from ...telemetry import contained, maybe_inject
from ..base import HookSpec, guarded, push_batch_range
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
    through. ``rids`` runs before the call and names the requests the call works for (None: every
    request of the forward): the NVTX range's, and when it names none (an embedding call whose
    images are all in the radix prefix) nothing is marked or stored, for marks are CUDA calls on the
    TTFT path. ``start`` gives the first mark (``Clock.after_forward``: sampling shares the forward's
    end; ``Clock.start``: a host time when the forward adopted an earlier reference). The plugin code
    runs in guarded blocks inlined as in ``base.interval`` (names, range and first mark before the
    call; second mark, pop and store after it), not one ``guarded`` call per step: these wrappers run
    inside the forward, on the TTFT path, where every frame counts. A failure before the call leaves
    no first mark and so nothing stored; either way the call runs once and its result or exception
    passes through.
    """

    def make(kind: str) -> Direct:
        if kind != "sync":
            raise ValueError(f"{component}: expected a sync target, got {kind}")

        def build(func: Callable[..., Any], on: Any, bound: bool) -> Callable[..., Any]:
            def forward_hook(*args, **kwargs):
                ctx = ss.current
                if ctx is None or not on:
                    return func(*args, **kwargs)
                rest = args[1:] if bound else args
                pushed = False
                m0: Any = None
                try:
                    if telemetry.armed is not False:
                        maybe_inject(component)
                    if names := ctx.rids if rids is None else rids(ctx, rest, kwargs):
                        pushed = nvtx.domain is not None and push_batch_range(component, stage, names)
                        m0 = start(ctx.clock)
                except Exception as e:
                    contained(component, e)
                try:
                    return func(*args, **kwargs)
                finally:
                    m1: Any = None
                    if m0 is not None:
                        try:
                            if telemetry.armed is not False:
                                maybe_inject(component)
                            m1 = ctx.clock.mark()
                        except Exception as e:
                            contained(component, e)
                    if pushed:
                        guarded(component, nvtx.pop)
                    if m0 is not None and m1 is not None:
                        try:
                            store(ctx, m0, m1, rest, kwargs)
                        except Exception as e:
                            contained(component, e)

            return forward_hook

        return Direct(build)

    return HookSpec(component, make=make)


PART = "scheduler"  # the switch part that gates these hooks

HOOKS: dict[str, HookSpec] = {
    "model_runner.forward": marked("model_runner.forward", "fwd", "model.prefill", start=ss.Clock.start),
    "model_runner.sample": marked("model_runner.sample", "sample", "model.sample", start=ss.Clock.after_forward),
}

# the arguments each hook reads from its target (registry.READS_OF)
READS: dict[str, tuple[tuple[int | None, str | None], ...]] = {}
