"""Every hook implementation, by manifest hook id (one module per SGLang component)."""

from __future__ import annotations

from . import (
    batch_result,
    detokenizer,
    detokenizer_legacy,
    http_server,
    mm_embedding,
    mm_embedding_legacy,
    mm_processor,
    mm_processor_legacy,
    model_runner,
    openai_serving,
    schedule_batch,
    scheduler,
    tokenizer_manager,
    transport,
)
from .base import HookSpec

HOOKS: dict[str, HookSpec] = {}
PART_OF: dict[str, str | None] = {}
MODULE_OF: dict[str, str] = {}
"""hook id -> the hook module's name (``mm_processor``): the README's stage table names it."""
"""hook id -> the switch part that gates it (None: set-up hooks, never gated)."""
for _module in (
    http_server,
    openai_serving,
    tokenizer_manager,
    mm_processor,
    transport,
    scheduler,
    schedule_batch,
    model_runner,
    mm_embedding,
    batch_result,
    detokenizer,
    # SGLang 0.5.17 (legacy multimodal path, embed_mm_inputs split, detokenizer bootstrap)
    mm_processor_legacy,
    mm_embedding_legacy,
    detokenizer_legacy,
):
    HOOKS.update(_module.HOOKS)
    MODULE_OF.update(dict.fromkeys(_module.HOOKS, _module.__name__.rpartition(".")[2]))
    PART_OF.update({hook_id: _module.PART if spec.gated else None for hook_id, spec in _module.HOOKS.items()})
