"""The Prometheus sink's choice of records, on a private registry (the served metrics are checked
against a real Prometheus in ``test_server_dashboards.py``)."""

from __future__ import annotations

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
    assert value(f"{PREFIX}requests_total", {"model": "m", "status": "ok"}) == 2
    assert value(f"{PREFIX}ttft_seconds_count", {"model": "m", "modality": "text", "prefix": "miss"}) == 2
    assert value(f"{PREFIX}ttft_seconds_sum", {"model": "m", "modality": "text", "prefix": "miss"}) == pytest.approx(
        0.4
    )
    assert value(f"{PREFIX}stage_seconds_count", {"stage": "tokenize", "model": "m"}) == 2
