"""Occupancy of the caches and the transport on the real server (CPU), scraped by a real Prometheus.

The server runs with a 1 MiB preprocessing cache (``--mm-preprocess-cache-size-mb 1``) and a model
whose image processor makes 128x128 images (64 patches, a few hundred KiB of pixel values each), so
a handful of distinct images overflow it. Expected figures come from the records (the plugin's join)
and SGLang's configuration, never from the plugin's own occupancy code: every preprocessing miss
stores its artifact, so evictions = misses - entries left; each distinct image's embedding stays in
the (100 MiB) embedding cache. SGLang's start-up request (a warm-up record) is one of them. After the load the cpu transport's shared-memory segments are gone.
"""

from __future__ import annotations

import json
import subprocess
import sys
import time
from typing import Any

import pytest
from conftest import capped_model_cache, read_records, records, start_server
from peers.prometheus import PrometheusServer, require_tools
from test_server_exporters import chat, get_text, image, metric_samples

from sglang_mmtrace.harness import image_message
from sglang_mmtrace.sinks.prometheus import PREFIX

pytestmark = pytest.mark.server

SIDE = 128
PIXELS = SIDE * SIDE
CACHE_MIB = 1
DISTINCT = 6
QUESTION = "Occupancy test: what is in this image?"
SETTLE_S = 60.0


@pytest.fixture(scope="module")
def small_cache_server(tmp_path_factory):
    models = capped_model_cache(tmp_path_factory.mktemp("occupancy-model"), PIXELS, min_pixels=PIXELS)
    args = ("--mm-preprocess-cache-size-mb", str(CACHE_MIB))
    with start_server(tmp_path_factory, "occupancy", server_args=args, cache_dir=models) as srv:
        yield srv


@pytest.fixture(scope="module")
def prometheus(small_cache_server, tmp_path_factory):
    require_tools()
    with PrometheusServer(
        f"127.0.0.1:{small_cache_server.port}", tmp_path_factory.mktemp("prometheus-occupancy")
    ) as prom:
        yield prom


def occupancy_on_metrics(server) -> dict[tuple[str, str], float]:
    """(metric without prefix, cache or "") -> value, summed over processes, from the server's /metrics."""
    text = get_text(server, "/metrics")
    out: dict[tuple[str, str], float] = {}
    for name in ("cache_used_bytes", "cache_capacity_bytes", "cache_entries", "cache_evictions_total",
                 "shm_segments", "shm_bytes"):  # fmt: skip
        for labels, value in metric_samples(text, PREFIX + name):
            key = (name, labels.get("cache", ""))
            out[key] = out.get(key, 0.0) + value
    return out


@pytest.fixture(scope="module")
def loaded(small_cache_server) -> dict[str, Any]:
    """DISTINCT different images, then the last one again (a preprocessing hit), one at a time."""
    server = small_cache_server
    urls = [image(9400 + i, SIDE) for i in range(DISTINCT)]
    exchanges = [chat(server, f"image {i}", [image_message(QUESTION, [u])], images=1) for i, u in enumerate(urls)]
    exchanges.append(chat(server, "repeat", [image_message(QUESTION, [urls[-1]])], images=1))
    recs = list(records(server, [ex.rid for ex in exchanges], timeout=120).values())
    assert all(r["status"] == "ok" for r in recs), recs
    results = [s["attrs"].get("result") for r in recs for s in r["stages"] if s["name"] == "mm.preprocess_cache"]
    assert results.count("miss") == DISTINCT and results.count("hit") == 1, results
    # SGLang's start-up request (a warm-up record: in the JSONL, not in the metrics) sends an image too
    every = read_records(server.jsonl_path)
    assert len(every) == len(recs) + 1 and every[0].get("warmup"), [r.get("warmup") for r in every]
    misses = sum(
        1
        for r in every
        for s in r["stages"]
        if s["name"] == "mm.preprocess_cache" and s["attrs"].get("result") == "miss"
    )
    distinct = {i["content_hash"]: i["visual_tokens"] for r in every for i in r["images"]}
    # the figures settle within a sampling round (API timer 1 s, collector 1 s): wait until two reads agree
    deadline, previous = time.monotonic() + SETTLE_S, None
    while True:
        now = occupancy_on_metrics(server)
        if (now == previous and now.get(("shm_segments", "")) == 0) or time.monotonic() > deadline:
            break
        previous = now
        time.sleep(1.5)
    return {"records": recs, "misses": misses, "distinct": distinct, "metrics": now}


def test_preprocess_cache_overflow_is_counted(loaded, small_cache_server):
    m = loaded["metrics"]
    entries = m[("cache_entries", "preprocess")]
    assert m[("cache_capacity_bytes", "preprocess")] == CACHE_MIB * 1024 * 1024, m
    assert 1 <= entries < DISTINCT, m
    assert m[("cache_evictions_total", "preprocess")] == loaded["misses"] - entries > 0, m
    assert 0 < m[("cache_used_bytes", "preprocess")] <= CACHE_MIB * 1024 * 1024, m


def test_embedding_cache_holds_each_distinct_image(loaded, small_cache_server):
    from sglang.srt.environ import envs

    m = loaded["metrics"]
    assert m[("cache_capacity_bytes", "embedding")] == envs.SGLANG_VLM_CACHE_SIZE_MB.get() * 1024 * 1024, m
    assert m[("cache_entries", "embedding")] == len(loaded["distinct"]) == DISTINCT + 1, m
    assert m[("cache_evictions_total", "embedding")] == 0, m
    # each entry holds the image's visual tokens x (1 + deepstack layers) x the merger's width, in bfloat16
    vision = json.loads((small_cache_server.model_path / "config.json").read_text())["vision_config"]
    width = (1 + len(vision["deepstack_visual_indexes"])) * vision["out_hidden_size"]
    assert m[("cache_used_bytes", "embedding")] == sum(loaded["distinct"].values()) * width * 2, m


def test_shm_segments_back_to_idle(loaded, small_cache_server):
    """The cpu transport's segments are unlinked by the scheduler: none left after the load (the
    records prove features went that way)."""
    assert all(r["transport"]["mode"] == "cpu" and r["transport"]["bytes"] > 0 for r in loaded["records"])
    assert loaded["metrics"][("shm_segments", "")] == 0 and loaded["metrics"][("shm_bytes", "")] == 0, loaded


def test_prometheus_scrapes_the_same_figures(loaded, prometheus):
    at = prometheus.wait_scrape_after(time.time())
    for (name, cache), value in loaded["metrics"].items():
        sel = f'{{cache="{cache}"}}' if cache else ""
        assert prometheus.scalar(f"sum({PREFIX}{name}{sel})", at) == value, (name, cache)


def test_report_shows_occupancy_rows(loaded, small_cache_server):
    """The records carry the collector's latest sample; ``report`` prints one row per part."""
    recs = [r for r in read_records(small_cache_server.jsonl_path) if not r.get("warmup")]
    assert recs and all("preprocess" in (r.get("occupancy") or {}) for r in recs[1:]), recs[-1].get("occupancy")
    out = subprocess.run(
        [sys.executable, "-m", "sglang_mmtrace.cli.main", "report", str(small_cache_server.jsonl_path)],
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    assert "preprocess cache:" in out and "embedding cache:" in out and "shm in flight:" in out, out
