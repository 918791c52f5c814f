"""The OpenTelemetry GenAI server metrics: values from records, the conventions' buckets, OTLP on the wire.

The OTLP exporter is checked against the in-test receiver (real protocol, protobuf decoded) over
both transports; the real server's metrics are compared with its records in ``test_server_exporters.py``.
"""

from __future__ import annotations

import time
from typing import Any

import pytest
from peers.otlp_receiver import OtlpReceiver
from prometheus_client import CollectorRegistry

from sglang_mmtrace.sinks import genai
from sglang_mmtrace.sinks.prometheus import PrometheusSink


def _record(rid: str, status: str = "ok", **extra: Any) -> dict[str, Any]:
    return {
        "rid": rid,
        "model": "m",
        "status": status,
        "ttft_s": 0.2 if status == "ok" else None,
        "e2e_s": 0.5,
        "output_tokens": 4,
        "images": [],
        "cache": {"preprocess": "off", "embedding": "off", "image_prefix_hit": False},
        "stages": [],
        **extra,
    }


BASE = {"gen_ai.operation.name": "chat", "gen_ai.provider.name": "sglang", "gen_ai.request.model": "m"}


def test_observations_follow_the_conventions():
    ok = genai.observations(_record("a"))
    assert ok == [
        (genai.DURATION, 0.5, BASE),
        (genai.TTFT, 0.2, BASE),
        (genai.TPOT, pytest.approx((0.5 - 0.2) / 3), BASE),
    ]
    # a failed request: its duration with error.type, no TTFT or time per token ("successful responses")
    assert genai.observations(_record("e", status="error")) == [(genai.DURATION, 0.5, {**BASE, "error.type": "error"})]
    # one output token: no token after the first, so no time per output token
    assert [n for n, _, _ in genai.observations(_record("one", output_tokens=1))] == [genai.DURATION, genai.TTFT]
    assert genai.observations(_record("w", warmup=True)) == []


def test_prometheus_names_and_buckets():
    registry = CollectorRegistry()
    sink = PrometheusSink(registry=registry)
    sink.emit(_record("a"))
    sink.emit(_record("e", status="aborted"))
    labels = {"gen_ai_operation_name": "chat", "gen_ai_provider_name": "sglang", "gen_ai_request_model": "m"}
    value = registry.get_sample_value
    name = "gen_ai_server_request_duration_seconds"
    assert value(name + "_count", {**labels, "error_type": ""}) == 1
    assert value(name + "_count", {**labels, "error_type": "aborted"}) == 1
    assert value("gen_ai_server_time_to_first_token_seconds_sum", {**labels, "error_type": ""}) == pytest.approx(0.2)
    for metric, (_, bounds) in genai.METRICS.items():
        family = next(f for f in registry.collect() if f.name == genai.prometheus_name(metric))
        les = sorted({float(s.labels["le"]) for s in family.samples if s.name.endswith("_bucket")})
        assert les == [*bounds, float("inf")], metric


@pytest.mark.parametrize("protocol", ["http/protobuf", "grpc"])
def test_otlp_metrics_reach_a_real_receiver(protocol):
    receiver = OtlpReceiver()
    port = receiver.start_http() if protocol != "grpc" else receiver.start_grpc()
    try:
        sink = genai.GenAiOtlpMetrics(f"http://127.0.0.1:{port}", protocol)
        for rid in ("a", "b"):
            sink.emit(_record(rid))
        sink.emit(_record("e", status="error"))
        sink.close()  # the final collection and export
        deadline = time.monotonic() + 10
        while not receiver.metric_snapshot() and time.monotonic() < deadline:
            time.sleep(0.05)
    finally:
        receiver.stop()
    points = receiver.metric_snapshot()
    assert not receiver.bad_requests, receiver.bad_requests
    by = {(p.name, p.attrs.get("error.type")): p for p in points}
    assert set(by) == {(genai.DURATION, None), (genai.DURATION, "error"), (genai.TTFT, None), (genai.TPOT, None)}
    for (name, _), point in by.items():
        assert point.unit == "s" and point.bounds == genai.METRICS[name][1], point
        assert point.transport == ("grpc" if protocol == "grpc" else "http")
        assert {k: point.attrs[k] for k in BASE} == BASE
        assert sum(point.bucket_counts) == point.count
    assert by[(genai.TTFT, None)].count == 2 and by[(genai.TTFT, None)].sum == pytest.approx(0.4)
    assert by[(genai.DURATION, "error")].count == 1
    assert by[(genai.TPOT, None)].sum == pytest.approx(2 * 0.3 / 3)


def test_otlp_url_per_signal():
    from sglang_mmtrace.sinks.otlp import otlp_url

    assert otlp_url("http://h:4318", "metrics") == "http://h:4318/v1/metrics"
    assert otlp_url("http://h:4318/v1/traces", "metrics") == "http://h:4318/v1/metrics"
    assert otlp_url("http://h:4318/", "traces") == "http://h:4318/v1/traces"
