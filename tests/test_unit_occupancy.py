"""Occupancy samples read from SGLang 0.5.23's real cache classes, their metrics and report rows.

The caches are SGLang's own (``MultiModalStaticCache``, ``MultimodalPreprocessCache``) on the CPU; the
TokenizerManager and its processor, which only hold the cache here, are plain stand-ins. The real
server's figures are checked in ``test_server_occupancy.py``. The ``cuda_ipc`` pool needs CUDA: its
figures are read from a stand-in holding SGLang's real lease records (the test says so).
"""

from __future__ import annotations

import os
import uuid
from multiprocessing import shared_memory
from types import SimpleNamespace

import pytest
import torch
from prometheus_client import CollectorRegistry

from sglang_mmtrace import occupancy
from sglang_mmtrace.report.analysis import format_occupancy, occupancy_summary
from sglang_mmtrace.sinks.prometheus import PREFIX, PrometheusSink


def test_embedding_cache_evictions_are_counted():
    from sglang.srt.managers import mm_schedule
    from sglang.srt.mem_cache.multimodal_cache import EmbeddingResult

    before = mm_schedule.embedding_cache
    try:
        item = torch.zeros(64, 16)  # 4096 bytes
        mm_schedule.init_mm_embedding_cache(3 * item.nbytes)
        occupancy.count_embedding_evictions()
        cache = mm_schedule.embedding_cache
        for h in range(5):
            assert cache.set(h, EmbeddingResult(embedding=item.clone()))
        assert cache.get_single(4) is not None and cache.get_single(0) is None  # the LRU evicted 0 and 1
        assert occupancy.scheduler_sample() == {
            "embedding": {
                "used_bytes": 3 * item.nbytes,
                "capacity_bytes": 3 * item.nbytes,
                "entries": 3,
                "evictions": 2,
            }
        }
        occupancy.count_embedding_evictions()  # a second call keeps the counting dict
        assert occupancy.scheduler_sample()["embedding"]["evictions"] == 2
    finally:
        mm_schedule.embedding_cache = before


def test_preprocess_cache_sample_is_sglangs_own_stats():
    from sglang.srt.multimodal.cache.preprocess_cache import MultimodalPreprocessCache

    cache = MultimodalPreprocessCache(max_size_bytes=1000)
    for key in range(4):
        assert cache.put(key, object(), size_bytes=400)
    tm = SimpleNamespace(mm_processor=SimpleNamespace(mm_preprocess_cache=cache))
    assert occupancy.api_sample(tm) == {
        "preprocess": {"used_bytes": 800, "capacity_bytes": 1000, "entries": 2, "evictions": 2}
    }
    # disabled (size 0, the default for Qwen) or no processor (a text model): absent, not zero
    off = SimpleNamespace(mm_processor=SimpleNamespace(mm_preprocess_cache=MultimodalPreprocessCache(0)))
    assert occupancy.api_sample(off) == {} == occupancy.api_sample(SimpleNamespace(mm_processor=None))


def test_shm_segments_in_flight():
    pid = os.getpid()
    name = occupancy.SHM_PREFIX.format(pid=pid) + uuid.uuid4().hex[:8]
    other = f"sgl_shm_mm_{pid + 1}_{uuid.uuid4().hex[:8]}"  # another process's segment is not ours
    before = occupancy.shm_sample(pid)["shm"]
    seg = shared_memory.SharedMemory(name=name, create=True, size=8192)
    seg2 = shared_memory.SharedMemory(name=other, create=True, size=4096)
    try:
        during = occupancy.shm_sample(pid)["shm"]
        assert during["segments"] == before["segments"] + 1
        assert during["used_bytes"] == before["used_bytes"] + os.stat(f"/dev/shm/{name}").st_size
    finally:
        for s in (seg, seg2):
            s.close()
            s.unlink()
    assert occupancy.shm_sample(pid)["shm"] == before


def test_metrics_from_samples():
    """Labelled by where the figure is held (role and ranks, stable across restarts), never by pid."""
    registry = CollectorRegistry()
    sink = PrometheusSink(registry=registry)
    value = registry.get_sample_value
    emb = {"used_bytes": 10, "capacity_bytes": 100, "entries": 1, "evictions": 0}
    rank1, api = ("scheduler", "1", "0"), ("api", "", "")
    sink.sync_occupancy({rank1: {"embedding": emb}, api: {"shm": {"segments": 2, "used_bytes": 50}}})
    sink.sync_occupancy(
        {
            rank1: {"embedding": {**emb, "used_bytes": 30, "evictions": 3}},
            api: {"shm": {"segments": 0, "used_bytes": 0}},
        }
    )
    sink.sync_occupancy({rank1: {"embedding": {**emb, "evictions": 3}}})  # no new eviction: no increment
    labels = {"cache": "embedding", "process": "scheduler", "dp_rank": "1", "tp_rank": "0"}
    assert value(PREFIX + "cache_used_bytes", labels) == 10
    assert value(PREFIX + "cache_capacity_bytes", labels) == 100
    assert value(PREFIX + "cache_evictions_total", labels) == 3
    at_api = {"process": "api", "dp_rank": "", "tp_rank": ""}
    assert value(PREFIX + "shm_segments", at_api) == 0 and value(PREFIX + "shm_bytes", at_api) == 0
    exposed = {s.labels.get("pid") for m in registry.collect() for s in m.samples}
    assert exposed == {None}, exposed


@pytest.mark.parametrize(
    ("title", "ranks"),
    [
        ("sglang::scheduler", {"dp_rank": "", "tp_rank": "0"}),
        ("sglang::scheduler_TP3", {"dp_rank": "", "tp_rank": "3"}),
        ("sglang::scheduler_DP1_TP0", {"dp_rank": "1", "tp_rank": "0"}),
        ("sglang::scheduler_DP2", {"dp_rank": "2", "tp_rank": "0"}),
        ("sglang::scheduler_DP0_PP1_ATTN_CP1_MOE_DP1_TP2_EP0", {"dp_rank": "0", "tp_rank": "2"}),
    ],
)
def test_scheduler_ranks_from_the_process_title(title, ranks):
    """The titles SGLang's ``configure_scheduler_process`` sets (``MOE_DP`` is not the data-parallel rank),
    set on this process with the ``setproctitle`` SGLang uses."""
    import setproctitle

    before = setproctitle.getproctitle()
    try:
        setproctitle.setproctitle(title)
        assert occupancy.scheduler_ranks() == ranks
    finally:
        setproctitle.setproctitle(before)


def test_report_rows():
    recs = [
        {"occupancy": {"preprocess": {"used_bytes": 2 << 20, "capacity_bytes": 4 << 20, "entries": 2, "evictions": 1}}},
        {"occupancy": {"preprocess": {"used_bytes": 3 << 20, "capacity_bytes": 4 << 20, "entries": 3, "evictions": 4}}},
        {"occupancy": {"preprocess": {"used_bytes": 1 << 20, "capacity_bytes": 4 << 20, "entries": 1, "evictions": 6},
                       "shm": {"segments": 0, "used_bytes": 0}}},
        {},
    ]  # fmt: skip
    summary = occupancy_summary(recs)
    assert summary["preprocess"] == {
        "used_bytes": 1 << 20,
        "max_used_bytes": 3 << 20,
        "capacity_bytes": 4 << 20,
        "max_capacity_bytes": 4 << 20,
        "entries": 1,
        "max_entries": 3,
        "evictions": 5,
    }
    lines = format_occupancy(summary)
    expected = "preprocess cache: 1.0 MiB used (max 3.0) of 4.0 MiB capacity, 1 entries (max 3), 5 evictions"
    assert " ".join(lines[0].split()) == expected
    assert "shm in flight:" in lines[1] and "0 segments (max 0)" in lines[1]


def test_totals_sum_processes():
    samples = [{"embedding": {"entries": 2}}, {"embedding": {"entries": 3}, "shm": {"segments": 1}}]
    assert occupancy.totals(samples) == {"embedding": {"entries": 5}, "shm": {"segments": 1}}


def test_cuda_ipc_pool_figures_and_fallback_counter(monkeypatch):
    """The pool itself needs CUDA (none here): a stand-in holds a CPU byte buffer and SGLang's real
    ``PoolLease`` records; the fallback hook wraps SGLang's real ``_warn_pool_full_once`` through the
    plugin's patcher, as the manifest entry does on the server."""
    from sglang.srt.multimodal.transport.cuda_ipc import MmItemMemoryPool
    from sglang.srt.multimodal.transport.memory_pool import PoolLease

    from sglang_mmtrace.hooks.registry import HOOKS
    from sglang_mmtrace.patch import apply, unpatch

    leases = {0: PoolLease(4096, 8192, 4000, 0, 1, 0, 4), 1: PoolLease(8192, 73728, 65536, 1, 1, 12, 16)}
    pool = SimpleNamespace(
        memory_pool=torch.empty(1 << 20, dtype=torch.uint8),
        _pool=SimpleNamespace(_occupied=leases),
        _pool_full_warned=False,
    )
    monkeypatch.setattr(occupancy, "cuda_ipc_fallbacks", 0)
    target = "sglang.srt.multimodal.transport.cuda_ipc.MmItemMemoryPool._warn_pool_full_once"
    applied = apply("cuda_ipc_pool.fallback", target, HOOKS["cuda_ipc_pool.fallback"].make("sync"))
    try:
        for _ in range(3):
            assert MmItemMemoryPool._warn_pool_full_once(pool, 1 << 30) is None  # SGLang's own call runs
    finally:
        unpatch(applied)
    assert pool._pool_full_warned  # the original ran (it logs the first time only)
    tm = SimpleNamespace(mm_processor=SimpleNamespace(mm_preprocess_cache=None, cudaipc_mmfeature_pool=pool))
    assert occupancy.api_sample(tm) == {
        "cuda_ipc_pool": {"reserved_bytes": 1 << 20, "used_bytes": 4096 + 65536, "fallbacks": 3}
    }
