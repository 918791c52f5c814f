"""Every hook implementation, by manifest hook id (one module per SGLang component, under the process it runs in)."""

from __future__ import annotations

from .api import (
    cuda_ipc_pool,
    detokenizer_legacy,
    engine,
    http_server,
    mm_processor,
    mm_processor_generic,
    openai_serving,
    tokenizer_manager,
    transport,
)
from .base import HookSpec
from .detokenizer import detokenizer
from .scheduler import (
    batch_result,
    embedding_cache,
    mm_embedding,
    mm_embedding_legacy,
    model_runner,
    profiler_manager,
    schedule_batch,
    scheduler,
)

HOOKS: dict[str, HookSpec] = {}
PART_OF: dict[str, str | None] = {}
"""hook id -> the switch part that gates it (None: set-up hooks, never gated)."""
MODULE_OF: dict[str, str] = {}
"""hook id -> the hook module's name (``mm_processor``): the README's stage table names it."""
PROCESS_OF: dict[str, str] = {}
"""hook id -> the subpackage of its module (``api``, ``scheduler``, ``detokenizer``): the SGLang process it
is applied in, which is the manifest's ``process``."""
READS_OF: dict[str, tuple[tuple[int | None, str | None], ...]] = {}
"""hook id -> the target's arguments its hook reads, as (position after self/cls, name); None where it
reads only by name or only by position. Each hook module declares its own (``READS``);
``manifest_check`` checks them against every release's signatures, and a test checks them against
the hook code."""
for _module in (
    http_server,
    openai_serving,
    engine,
    tokenizer_manager,
    mm_processor,
    mm_processor_generic,
    transport,
    cuda_ipc_pool,
    scheduler,
    schedule_batch,
    model_runner,
    mm_embedding,
    batch_result,
    embedding_cache,
    profiler_manager,
    detokenizer,
    # SGLang 0.5.17-0.5.21 (embed_mm_inputs split, detokenizer bootstrap)
    mm_embedding_legacy,
    detokenizer_legacy,
):
    HOOKS.update(_module.HOOKS)
    _process, _, _name = _module.__name__.rpartition(".hooks.")[2].partition(".")
    MODULE_OF.update(dict.fromkeys(_module.HOOKS, _name))
    READS_OF.update(_module.READS)
    PROCESS_OF.update(dict.fromkeys(_module.HOOKS, _process))
    PART_OF.update({hook_id: _module.PART if spec.gated else None for hook_id, spec in _module.HOOKS.items()})
