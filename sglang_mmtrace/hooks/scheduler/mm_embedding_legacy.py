"""Multimodal embedding in the model, legacy split (scheduler process; SGLang 0.5.17).

0.5.17 has no ``prepare_mm_inputs``: ``general_mm_embed_routine`` (which receives the
``forward_batch``) calls ``embed_mm_inputs`` (which does not) for the whole multimodal part (the
embedding-cache lookups, the vision encoder for the misses, the host-synchronising
``_adjust_embedding_length``, the scatter into the LM input embeddings). So the batch is scanned
in the routine, before the original runs (it clears ``forward_batch.mm_inputs``), and
``embed_mm_inputs`` is timed with the forward's clock (CUDA events on the current stream).
``model.vision_encoder`` keeps its 0.5.23 hook (``get_image_feature``, same target and semantics).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from ... import telemetry
from ...patch import Direct
from ...telemetry import contained, maybe_inject
from ..base import HookSpec, arg
from . import mm_embedding
from . import state as ss
from .model_runner import marked


def _routine_make(kind: str) -> Direct:
    """``general_mm_embed_routine``: scan an extend batch before the original runs (it clears
    ``forward_batch.mm_inputs``), as on 0.5.23; 0.5.17's routine also runs for decode and verify.

    Built into the target's replacement (``Direct``), the scan inlined: the routine runs in every
    forward, a text request's prefill included, where the generic wrapper's frames cost more than the
    scan of a batch with no images."""
    component = "mm_embedding_legacy.routine"
    if kind != "sync":
        raise ValueError(f"{component}: expected a sync target, got {kind}")

    def build(func: Callable[..., Any], on: Any, bound: bool) -> Callable[..., Any]:
        def routine_hook(*args, **kwargs):
            ctx = ss.current
            if ctx is not None and on:
                try:
                    if telemetry.armed is not False:
                        maybe_inject(component)
                    forward_batch = arg(args[1:] if bound else args, kwargs, 1, "forward_batch")
                    mode = getattr(forward_batch, "forward_mode", None)
                    if mode is not None and not mode.is_decode() and not mode.is_target_verify():
                        mm_embedding.scan_batch(ctx, forward_batch)
                except Exception as e:
                    contained(component, e)
            return func(*args, **kwargs)

        return routine_hook

    return Direct(build)


PART = "scheduler"  # the switch part that gates these hooks

HOOKS: dict[str, HookSpec] = {
    "mm_embedding_legacy.routine": HookSpec("mm_embedding_legacy.routine", make=_routine_make),
    # the batch was scanned by the routine hook: only mark the embedding call
    "mm_embedding_legacy.embed": marked("mm_embedding_legacy.embed", "embed", "model.embed", mm_embedding.needs_embed),
}

# the arguments each hook reads from its target (registry.READS_OF)
READS: dict[str, tuple[tuple[int | None, str | None], ...]] = {
    "mm_embedding_legacy.routine": ((1, "forward_batch"),),
}
