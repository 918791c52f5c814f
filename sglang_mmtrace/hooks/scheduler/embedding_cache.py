"""The VLM embedding cache's creation (scheduler process): from then on its evictions are counted.

Not a measurement hook: it runs once, when SGLang builds the cache, and swaps the cache's LRU dict for
``occupancy.CountingLru`` (one increment per eviction). The cache's size is read on the outbox's
heartbeat (``occupancy.scheduler_sample``), never on the request path.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any

from ... import occupancy
from ..base import HookSpec, interval


def _built(st, t0, t1, instance, args, kwargs, result: Any, exc: BaseException | None) -> None:
    if exc is None:
        occupancy.count_embedding_evictions()


PART = "scheduler"  # the switch part that gates these hooks (this one is set-up: never gated)

HOOKS: dict[str, HookSpec] = {
    "embedding_cache.init": replace(interval("embedding_cache.init", _built), gated=False),
}

# the arguments each hook reads from its target (registry.READS_OF): none
READS: dict[str, tuple[tuple[int | None, str | None], ...]] = {}
