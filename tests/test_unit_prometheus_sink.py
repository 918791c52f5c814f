"""The Prometheus sink's choice of records, on a private registry (the served metrics are checked
against a real Prometheus in ``test_server_dashboards.py``)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from prometheus_client import CollectorRegistry

from sglang_mmtrace.sinks.prometheus import PREFIX, PrometheusSink


def _record(rid: str, ttft_s: float, **extra: Any) -> dict[str, Any]:
    return {
        "rid": rid,
        "model": "m",
        "status": "ok",
        "ttft_s": ttft_s,
        "attributed_s": ttft_s,
        "images": [],
        "cache": {"preprocess": "off", "embedding": "off", "image_prefix_hit": False},
        "stages": [
            {"name": "tokenize", "process": "api", "start_s": 0.0, "dur_s": ttft_s, "clock": "host", "attrs": {}}
        ],
        **extra,
    }


def test_warmup_records_are_not_observed():
    """SGLang's start-up request and client warm-ups (``"warmup": true``) stay out of every series."""
    registry = CollectorRegistry()
    sink = PrometheusSink(registry=registry)
    sink.emit(_record("w", 12.0, warmup=True))
    sink.emit(_record("a", 0.1))
    sink.emit(_record("b", 0.3))
    value = registry.get_sample_value
    assert value(f"{PREFIX}requests_total", {"model_name": "m", "status": "ok"}) == 2
    assert value(f"{PREFIX}ttft_seconds_count", {"model_name": "m", "modality": "text", "prefix": "miss"}) == 2
    assert value(
        f"{PREFIX}ttft_seconds_sum", {"model_name": "m", "modality": "text", "prefix": "miss"}
    ) == pytest.approx(0.4)
    assert value(f"{PREFIX}stage_seconds_count", {"stage": "tokenize", "model_name": "m"}) == 2


def _exemplars(registry: CollectorRegistry, metric: str) -> dict[tuple[tuple[str, str], ...], tuple[dict, float]]:
    """Bucket labels -> (exemplar labels, exemplar value), as the OpenMetrics exposition serves them."""
    out = {}
    for family in registry.collect():
        for sample in family.samples:
            if sample.name == f"{PREFIX}{metric}_bucket" and sample.exemplar is not None:
                out[tuple(sorted(sample.labels.items()))] = (sample.exemplar.labels, sample.exemplar.value)
    return out


def test_ttft_and_stage_buckets_carry_the_latest_records_trace_id():
    """Each observed bucket's exemplar is the trace id of the latest record that fell in it, and the
    exemplar holds nothing but that id; a record without a trace id leaves the bucket's exemplar as is."""
    registry = CollectorRegistry()
    sink = PrometheusSink(registry=registry)
    sink.emit(_record("a", 0.3, trace_id="a" * 32))
    sink.emit(_record("b", 0.3, trace_id="b" * 32))  # same bucket (0.25, 0.5]: the latest wins
    sink.emit(_record("c", 0.02, trace_id="c" * 32))  # bucket (0.01, 0.025]
    sink.emit(_record("d", 0.3))  # no trace id (no OTLP, no traceparent): counted, no exemplar
    sink.emit(_record("w", 0.3, trace_id="f" * 32, warmup=True))  # not observed at all
    labels = {"model_name": "m", "modality": "text", "prefix": "miss"}
    assert registry.get_sample_value(f"{PREFIX}ttft_seconds_count", labels) == 4
    want = {"0.5": ({"trace_id": "b" * 32}, 0.3), "0.025": ({"trace_id": "c" * 32}, 0.02)}
    for metric in ("ttft_seconds", "stage_seconds"):
        assert {dict(k)["le"]: v for k, v in _exemplars(registry, metric).items()} == want, metric


def test_exemplars_are_served_in_openmetrics_only():
    """prometheus_client writes exemplars in the OpenMetrics exposition (what Prometheus asks for with
    exemplar storage on); the classic text format has no place for them."""
    from prometheus_client import generate_latest
    from prometheus_client.openmetrics.exposition import generate_latest as generate_openmetrics

    registry = CollectorRegistry()
    PrometheusSink(registry=registry).emit(_record("a", 0.3, trace_id="a" * 32))
    line = f'{PREFIX}ttft_seconds_bucket{{le="0.5",modality="text",model_name="m",prefix="miss"}} 1.0 # {{trace_id="{"a" * 32}"}} 0.3'
    assert any(x.startswith(line) for x in generate_openmetrics(registry).decode().splitlines())
    assert "trace_id" not in generate_latest(registry).decode()


def test_own_port_serves_exemplars_even_with_a_multiproc_dir_in_the_environment(tmp_path):
    """``Collector.start_metrics`` without SGLang's directory (metrics off, or ``SGLANG_MMTRACE_EXEMPLARS=1``)
    keeps prometheus_client out of multiprocess mode even when the environment names a directory: the
    metrics are served once, on the port, with exemplars; nothing lands in the directory. A fresh
    process, because prometheus_client picks its mode when it is first imported."""
    record = _record("a", 0.3, trace_id="a" * 32)
    code = f"""
import json, sys, urllib.request
sys.path.insert(0, {str(Path(__file__).parent)!r})
from peers.prometheus import free_port
from sglang_mmtrace.config import Config
from sglang_mmtrace.join.collector import Collector
assert "prometheus_client" not in sys.modules  # as in the collector process: imported by start_metrics
col = Collector(Config(), [], "0.5.23")
port = free_port()
assert col.start_metrics(None, port) is None
col.sinks[-1].emit(json.loads({json.dumps(record)!r}))
req = urllib.request.Request(f"http://127.0.0.1:{{port}}/metrics", headers={{"Accept": "application/openmetrics-text"}})
print(urllib.request.urlopen(req, timeout=10).read().decode())
"""
    multiproc = tmp_path / "multiproc"
    multiproc.mkdir()
    env = {**os.environ, "PROMETHEUS_MULTIPROC_DIR": str(multiproc)}
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    assert (
        f'{PREFIX}ttft_seconds_bucket{{le="0.5",modality="text",model_name="m",prefix="miss"}} 1.0 # {{trace_id="{"a" * 32}"}} 0.3'
        in out.stdout
    )
    assert not list(multiproc.iterdir())


def test_health_counters_count_each_increment_once_across_a_missing_process():
    """The errors/dropped totals are sums over processes; a process missing from one sum (its heartbeat
    late) must not make its counts be added again when it is back."""
    registry = CollectorRegistry()
    sink = PrometheusSink(registry=registry)
    value = registry.get_sample_value
    sink.sync_health({"errors": {"hooks.x": 3}, "dropped": {"otlp": 5}})
    sink.sync_health({"errors": {"hooks.x": 1}, "dropped": {"otlp": 5}})  # the process holding 2 missing
    sink.sync_health({"errors": {"hooks.x": 3}, "dropped": {"otlp": 7}})  # back, nothing new for hooks.x
    sink.sync_health({"errors": {"hooks.x": 4}, "dropped": {"otlp": 7}})
    assert value(PREFIX + "errors_total", {"component": "hooks.x"}) == 4
    assert value(PREFIX + "dropped_total", {"sink": "otlp"}) == 7
