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

from typing import Any

from ..base import HookSpec, Wrapper, arg, guarded
from . import mm_embedding
from . import state as ss
from .model_runner import marked


def _scan_batch(ctx: ss.FwdCtx, forward_batch: Any) -> None:
    """As on 0.5.23, for extend batches only: 0.5.17's routine also runs for decode and verify."""
    mode = getattr(forward_batch, "forward_mode", None)
    if mode is None or mode.is_decode() or mode.is_target_verify():
        return
    mm_embedding.scan_batch(ctx, forward_batch)


def _routine_wrapper(kind: str) -> Wrapper:
    component = "mm_embedding_legacy.routine"
    if kind != "sync":
        raise ValueError(f"{component}: expected a sync target, got {kind}")

    def wrapper(wrapped, instance, args, kwargs):
        ctx = ss.current
        if ctx is not None:
            guarded(component, _scan_batch, ctx, arg(args, kwargs, 1, "forward_batch"))
        return wrapped(*args, **kwargs)

    return wrapper


PART = "scheduler"  # the switch part that gates these hooks

HOOKS: dict[str, HookSpec] = {
    "mm_embedding_legacy.routine": HookSpec("mm_embedding_legacy.routine", make=_routine_wrapper),
    # the batch was scanned by the routine hook: only mark the embedding call
    "mm_embedding_legacy.embed": marked("mm_embedding_legacy.embed", "embed", "model.embed", mm_embedding.needs_embed),
}

# the arguments each hook reads from its target (registry.READS_OF)
READS: dict[str, tuple[tuple[int | None, str | None], ...]] = {
    "mm_embedding_legacy.routine": ((1, "forward_batch"),),
}
