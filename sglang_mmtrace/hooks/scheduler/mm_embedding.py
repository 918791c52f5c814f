"""Multimodal embedding in the model (scheduler process): vision encoder calls and injection.

``prepare_mm_inputs`` is the whole multimodal part of a prefill forward (embedding-cache lookups,
vision encoder for the misses, scatter into the LM input embeddings). The encoder is the embedder
that ``embed_mm_inputs`` resolves per modality, ``get_image_feature`` / ``get_video_feature`` of the
served model's class: every VLM defines its own, with no shared base, so these hooks are applied to
the model's class once ``ModelRunner.load_model`` has loaded it (``model_runner.load_model``,
``plugin.apply_late``). An embedder is called with exactly the items that missed the embedding
cache. Which requests a forward embeds, and which owns which item, was read from the batch at the
forward's launch (``schedule_batch.scan_images``).
"""

from __future__ import annotations

from typing import Any

from ...stages import MODEL_AUDIO_ENCODER, MODEL_EMBED, MODEL_VISION_ENCODER
from ..base import HookSpec, arg, interval
from . import state as ss
from .model_runner import around_forward, marked


def _owners(ctx: ss.FwdCtx, items: Any) -> tuple[str, ...]:
    rids: dict[str, None] = {}
    for item in items:
        for rid in ctx.hash_to_rids.get(getattr(item, "hash", None), ()):
            rids[rid] = None
    return tuple(rids)


def needs_embed(ctx: ss.FwdCtx, args: tuple, kwargs: dict) -> tuple[str, ...]:
    """The requests whose images are embedded in this forward (the ``model.embed`` range's rids)."""
    return tuple(ctx.needs_embed)


def _vit_owners(ctx: ss.FwdCtx, args: tuple, kwargs: dict) -> tuple[str, ...]:
    return _owners(ctx, arg(args, kwargs, 0, "items") or ())


def _store_vit(ctx: ss.FwdCtx, m0: Any, m1: Any, args: tuple, kwargs: dict) -> None:
    items = arg(args, kwargs, 0, "items") or ()
    modality = getattr(getattr(items[0], "modality", None), "name", "IMAGE").lower() if items else "image"
    ctx.vit.append((m0, m1, [getattr(it, "hash", None) for it in items], modality))


def _lookup_exit(st, t0, t1, instance, args, kwargs, result, exc) -> None:
    """One embedding-cache lookup (``get_single``): only a forward's first lookup of a hash is
    evidence, for SGLang looks a miss up again after inserting what it encoded."""
    ctx = ss.current
    if ctx is not None and exc is None:
        ctx.lookups.setdefault(arg(args, kwargs, 0, "mm_hash"), result is not None)


def _needed_owners(ctx: ss.FwdCtx, args: tuple, kwargs: dict) -> tuple[str, ...]:
    return tuple(ctx.needs_embed)


def _store_needed(modality: str) -> Any:
    """For an encoder that takes pixels, not items (SGLang's LLaVA ``encode_images``; the HF model's
    ``get_<modality>_features`` under the transformers backend): it encodes every item of its modality
    of the requests whose extend reaches one, which are the forward's requests that need embeddings
    (neither path has an embedding cache, nor a radix prefix on the transformers backend)."""

    def store(ctx: ss.FwdCtx, m0: Any, m1: Any, args: tuple, kwargs: dict) -> None:
        kinds = ("image", "video") if modality == "image" else (modality,)
        hashes = [h for items in ctx.needs_embed.values() for h, m in items if m in kinds]
        ctx.vit.append((m0, m1, hashes, modality))

    return store


def _combined_lookup_exit(st, t0, t1, instance, args, kwargs, result, exc) -> None:
    """A lookup of a request's items together (``get``: multi-span or EVS items): one outcome for all."""
    ctx = ss.current
    if ctx is not None and exc is None:
        for h in arg(args, kwargs, 0, "mm_hashes") or ():
            ctx.lookups.setdefault(h, result is not None)


PART = "scheduler"  # the switch part that gates these hooks

HOOKS: dict[str, HookSpec] = {
    "mm_embedding.prepare": marked("mm_embedding.prepare", "embed", MODEL_EMBED, needs_embed),
    # every encoder call of the forward (one per batch of missed items), not only the first; the
    # item's modality is an attribute (some models embed video with get_image_feature)
    "mm_embedding.vision_encoder": around_forward(
        "mm_embedding.vision_encoder", MODEL_VISION_ENCODER, _vit_owners, _store_vit
    ),
    "mm_embedding.video_encoder": around_forward(
        "mm_embedding.video_encoder", MODEL_VISION_ENCODER, _vit_owners, _store_vit
    ),
    "mm_embedding.audio_encoder": around_forward(
        "mm_embedding.audio_encoder", MODEL_AUDIO_ENCODER, _vit_owners, _store_vit
    ),
    # per-model: SGLang's LLaVA family (llava.py) encodes in its own forward, not through the generic
    # routine, so its get_image_feature-less classes are seen at encode_images
    "mm_embedding.llava_encoder": around_forward(
        "mm_embedding.llava_encoder", MODEL_VISION_ENCODER, _needed_owners, _store_needed("image")
    ),
    # the transformers backend: the HF model encodes inside its own forward, through the
    # get_<modality>_features every transformers VLM defines (applied to the HF model SGLang wraps)
    "mm_embedding.hf_image_encoder": around_forward(
        "mm_embedding.hf_image_encoder", MODEL_VISION_ENCODER, _needed_owners, _store_needed("image")
    ),
    "mm_embedding.hf_video_encoder": around_forward(
        "mm_embedding.hf_video_encoder", MODEL_VISION_ENCODER, _needed_owners, _store_needed("video")
    ),
    "mm_embedding.hf_audio_encoder": around_forward(
        "mm_embedding.hf_audio_encoder", MODEL_AUDIO_ENCODER, _needed_owners, _store_needed("audio")
    ),
    # SGLang's embedding cache, whose first lookup of an item in a forward proves a hit or a miss
    "mm_embedding.cache_lookup": interval("mm_embedding.cache_lookup", _lookup_exit),
    "mm_embedding.cache_lookup_combined": interval("mm_embedding.cache_lookup_combined", _combined_lookup_exit),
}

# the arguments each hook reads from its target (registry.READS_OF)
READS: dict[str, tuple[tuple[int | None, str | None], ...]] = {
    "mm_embedding.vision_encoder": ((0, "items"),),
    "mm_embedding.video_encoder": ((0, "items"),),
    "mm_embedding.audio_encoder": ((0, "items"),),
    "mm_embedding.cache_lookup": ((0, "mm_hash"),),
    "mm_embedding.cache_lookup_combined": ((0, "mm_hashes"),),
}
