"""Occupancy of what the multimodal caches and the feature transport hold, read where each lives.

Nothing here runs on the request path:
- a scheduler reads its VLM embedding cache when its outbox sends a heartbeat (the outbox's existing
  thread, every ``outbox.HEARTBEAT_INTERVAL_S``);
- the API process reads its preprocessing cache and its ``cuda_ipc`` pool on a timer of its event loop
  (``client.CollectorClient``, every ``API_INTERVAL_S``; no thread);
- the collector process counts the ``cpu`` transport's shared-memory segments in ``/dev/shm``.
Each sample is a plain dict that goes to the collector, which sets the Prometheus gauges and counters
(``sinks.prometheus.PrometheusSink.sync_occupancy``). A figure a SGLang version does not have is left
out of the sample, so its metric is absent rather than guessed.

The collector labels each sample with where it was taken (:data:`LABELS`), names that survive a
restart, unlike a pid: the process's role and, for a scheduler, its ranks as SGLang's own metrics
label them (``dp_rank``, ``tp_rank``). Processes that share those labels (the API process and its
tokenizer workers; the pipeline stages of one rank) are summed (:func:`totals`).

The samples read attributes and call ``len()`` (atomic under the GIL); the preprocessing cache's
``stats()`` takes its lock for the few lines it needs. The only hook is a counter: SGLang's embedding
cache evicts with ``OrderedDict.popitem(last=False)`` and keeps no count, so its dict is swapped, once
at creation, for :class:`CountingLru`.
"""

from __future__ import annotations

import os
import re
import sys
from collections import OrderedDict
from collections.abc import Iterable
from typing import Any

API_INTERVAL_S = 1.0
SHM_DIR = "/dev/shm"
SHM_PREFIX = "sgl_shm_mm_{pid}_"
"""SGLang 0.5.23's name for a feature segment created by process ``pid`` (``stale_shm_cleanup.make_shm_name``);
the scheduler unlinks it once it has mapped it, so what is left is in flight."""

Sample = dict[str, dict[str, int]]
"""``{"embedding": {"used_bytes": .., "capacity_bytes": .., "entries": .., "evictions": ..}, ...}``"""
LABELS = ("process", "dp_rank", "tp_rank")
"""The labels of every occupancy metric: the process's role (``api``, ``scheduler``) and a scheduler's
ranks (empty for the API process, and ``dp_rank`` without data parallelism, where SGLang has none)."""
Where = tuple[str, str, str]
"""Values of :data:`LABELS`, in that order."""
_TITLE_RANK = re.compile(r"(?<!_MOE)_(DP|TP)(\d+)")
"""A rank in a scheduler's process title, ``sglang::scheduler_DP1_TP0`` (SGLang 0.5.17 to 0.5.23,
``configure_scheduler_process``: ``DP`` only with a data-parallel rank, ``TP`` only with ``--tp-size`` > 1;
``MOE_DP`` is another rank)."""


class CountingLru(OrderedDict):
    """The embedding cache's LRU dict, counting evictions (``popitem(last=False)``): one increment each."""

    evictions = 0

    def popitem(self, last: bool = True) -> Any:
        if not last:
            self.evictions += 1
        return super().popitem(last)


_EMBEDDING_CACHE_MODULES = ("sglang.srt.managers.mm_schedule", "sglang.srt.managers.mm_utils")
"""Where the scheduler's embedding cache is a module global: 0.5.23, then 0.5.17."""


def embedding_cache_object() -> Any:
    for name in _EMBEDDING_CACHE_MODULES:
        cache = getattr(sys.modules.get(name), "embedding_cache", None)
        if cache is not None:
            return cache
    return None


def count_embedding_evictions() -> None:
    """Swap the new embedding cache's dict for a :class:`CountingLru` (called right after SGLang built it,
    on the scheduler's thread, before any request can use it)."""
    cache = embedding_cache_object()
    if cache is not None and type(cache.mm_cache) is OrderedDict:
        cache.mm_cache = CountingLru(cache.mm_cache)


def scheduler_sample() -> Sample:
    cache = embedding_cache_object()
    if cache is None:
        return {}
    entries = cache.mm_cache
    out = {"used_bytes": int(cache.current_size), "capacity_bytes": int(cache.max_size), "entries": len(entries)}
    if isinstance(entries, CountingLru):
        out["evictions"] = entries.evictions
    return {"embedding": out}


def scheduler_ranks() -> dict[str, str]:
    """This scheduler's ``dp_rank`` and ``tp_rank``, read from the process title SGLang gives it.

    The title is the one place every supported release states the ranks in the same form (the
    runtime context that holds them changed between releases), and it is set before the scheduler
    builds its embedding cache, so before any sample this process sends. Ranks SGLang leaves out of
    the title are those its metrics label as ``tp_rank="0"`` and no ``dp_rank``.
    """
    setproctitle = sys.modules.get("setproctitle")
    title = setproctitle.getproctitle() if setproctitle is not None else ""
    ranks = dict(_TITLE_RANK.findall(title))
    return {"dp_rank": ranks.get("DP", ""), "tp_rank": ranks.get("TP", "0")}


def api_sample(tokenizer_manager: Any) -> Sample:
    """The preprocessing cache (0.5.23) and the ``cuda_ipc`` pool of the TokenizerManager's processor."""
    processor = getattr(tokenizer_manager, "mm_processor", None)
    out: Sample = {}
    cache = getattr(processor, "mm_preprocess_cache", None)
    if cache is not None and cache.enabled:
        stats = cache.stats()
        out["preprocess"] = {
            "used_bytes": stats["size_bytes"],
            "capacity_bytes": cache.max_size_bytes,
            "entries": stats["entries"],
            "evictions": stats["evictions"],
        }
    pool = getattr(processor, "cudaipc_mmfeature_pool", None)
    if getattr(pool, "memory_pool", None) is not None:
        out["cuda_ipc_pool"] = cuda_ipc_pool_sample(pool)
    return out


def cuda_ipc_pool_sample(pool: Any) -> dict[str, int]:
    """Reserved bytes (the whole GPU buffer) and the bytes of the slices leased now (0.5.23's
    ``StreamOrderedMmFeaturePool``; without its lease table, in use is left out)."""
    buffer = pool.memory_pool
    out = {"reserved_bytes": int(buffer.numel() * buffer.element_size()), "fallbacks": cuda_ipc_fallbacks}
    leases = getattr(getattr(pool, "_pool", None), "_occupied", None)
    if leases is not None:
        out["used_bytes"] = sum(lease.end - lease.start for lease in list(leases.values()))
    return out


cuda_ipc_fallbacks = 0
"""Times a feature did not fit in this process's ``cuda_ipc`` pool and went by CPU (``hooks.api.cuda_ipc_pool``)."""


def shm_sample(creator_pid: int, folder: str = SHM_DIR) -> Sample:
    """Shared-memory feature segments that ``creator_pid`` created and no scheduler has unlinked yet."""
    prefix = SHM_PREFIX.format(pid=creator_pid)
    segments = used = 0
    try:
        entries = list(os.scandir(folder))
    except OSError:
        return {}
    for entry in entries:
        if entry.name.startswith(prefix):
            try:
                used += entry.stat().st_size
            except OSError:  # unlinked since the listing
                continue
            segments += 1
    return {"shm": {"segments": segments, "used_bytes": used}}


def totals(samples: Iterable[Sample]) -> Sample:
    """Samples summed per part and field (several schedulers with ``--dp-size``, several tokenizer workers)."""
    out: Sample = {}
    for sample in samples:
        for part, fields in sample.items():
            into = out.setdefault(part, {})
            for field, value in fields.items():
                into[field] = into.get(field, 0) + value
    return out
