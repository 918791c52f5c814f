"""Multimodal embedding in the model, legacy split (scheduler process; SGLang 0.5.17-0.5.21).

These releases have no ``prepare_mm_inputs``: ``general_mm_embed_routine`` calls ``embed_mm_inputs``
for the whole multimodal part (the embedding-cache lookups, the vision encoder for the misses, the
host-synchronising ``_adjust_embedding_length``, the scatter into the LM input embeddings), and that
call is timed with the forward's clock (CUDA events on the current stream). Which requests it embeds
was read from the batch at the forward's launch (``schedule_batch.scan_images``), so the routine,
which runs in every forward (decode steps and text prefills included), has no hook.
``model.vision_encoder`` keeps its 0.5.23 hook (``get_image_feature``, same target and semantics).
"""

from __future__ import annotations

from ...stages import MODEL_EMBED
from ..base import HookSpec
from . import mm_embedding
from .model_runner import marked

PART = "scheduler"  # the switch part that gates these hooks

HOOKS: dict[str, HookSpec] = {
    "mm_embedding_legacy.embed": marked("mm_embedding_legacy.embed", "embed", MODEL_EMBED, mm_embedding.needs_embed),
}

# the arguments each hook reads from its target (registry.READS_OF)
READS: dict[str, tuple[tuple[int | None, str | None], ...]] = {}
