"""The OpenTelemetry GenAI server metrics, computed from the plugin's records.

Semantic conventions v1.41.1 (the last release that holds the GenAI conventions; status
Development): ``gen_ai.server.time_to_first_token``, ``gen_ai.server.request.duration`` and
``gen_ai.server.time_per_output_token``, histograms in seconds with the conventions' bucket
boundaries. The Prometheus sink exposes them under the OTel-to-Prometheus names
(``gen_ai_server_time_to_first_token_seconds`` ...); :class:`GenAiOtlpMetrics` exports them over OTLP to
the spans' endpoint when ``SGLANG_MMTRACE_OTLP_METRICS=1``.

Values, all from the record (measured, nothing estimated):
- time to first token: ``ttft_s`` (arrival of the HTTP request to the first body byte sent), for
  successful requests;
- request duration: ``e2e_s`` (arrival to the last body byte), every status; a failed request carries
  ``error.type`` (``error`` or ``aborted``, the record's status);
- time per output token: ``(e2e_s - ttft_s) / (output_tokens - 1)``, for successful requests with more
  than one output token (the conventions' definition: the duration after the first token over the
  tokens generated after it).
"""

from __future__ import annotations

import os
from typing import Any

from .. import telemetry
from ..join.record import EmitContext
from .semconv import OPERATION, PROVIDER

TTFT, DURATION, TPOT = (
    "gen_ai.server.time_to_first_token",
    "gen_ai.server.request.duration",
    "gen_ai.server.time_per_output_token",
)
METRICS: dict[str, tuple[str, tuple[float, ...]]] = {
    TTFT: (
        "Time to generate first token for successful responses",
        (0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0),
    ),
    DURATION: (
        "Generative AI server request duration such as time-to-last byte or last output token",
        (0.01, 0.02, 0.04, 0.08, 0.16, 0.32, 0.64, 1.28, 2.56, 5.12, 10.24, 20.48, 40.96, 81.92),
    ),
    TPOT: (
        "Time per output token generated after the first token for successful responses",
        (0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75, 1.0, 2.5),
    ),
}
"""Name -> (description, the conventions' ExplicitBucketBoundaries), semantic conventions v1.41.1."""
ATTRIBUTES = ("gen_ai.operation.name", "gen_ai.provider.name", "gen_ai.request.model", "error.type")


def prometheus_name(name: str) -> str:
    """The OTel-to-Prometheus name of a metric in seconds: dots become underscores, unit suffix added."""
    return name.replace(".", "_") + "_seconds"


def prometheus_label(attribute: str) -> str:
    return attribute.replace(".", "_")


def observations(rec: dict[str, Any]) -> list[tuple[str, float, dict[str, str]]]:
    """``(metric, seconds, attributes)`` for one record; none for warm-ups (as every other metric)."""
    if rec.get("warmup"):
        return []
    attrs = {"gen_ai.operation.name": OPERATION, "gen_ai.provider.name": PROVIDER}
    if rec.get("model"):
        attrs["gen_ai.request.model"] = rec["model"]
    out: list[tuple[str, float, dict[str, str]]] = []
    ok = rec["status"] == "ok"
    e2e, ttft = rec.get("e2e_s"), rec.get("ttft_s")
    if e2e is not None:
        out.append((DURATION, e2e, attrs if ok else {**attrs, "error.type": rec["status"]}))
    if ok and ttft is not None:
        out.append((TTFT, ttft, attrs))
        tokens = rec.get("output_tokens", 0)
        if e2e is not None and tokens > 1:
            out.append((TPOT, max(0.0, e2e - ttft) / (tokens - 1), attrs))
    return out


class GenAiOtlpMetrics:
    """The three histograms over OTLP (the spans' endpoint and protocol), through the OpenTelemetry SDK.

    Exported from the collector process by the SDK's periodic reader (its own thread, every
    ``OTEL_METRIC_EXPORT_INTERVAL`` ms, default 60 s) and once more on close."""

    PART = "otlp"  # the switch part that gates this sink

    def __init__(
        self,
        endpoint: str,
        protocol: str,
        service_name: str = "sglang",
        exporter: Any = None,
        insecure: bool | None = True,
    ) -> None:
        from opentelemetry.sdk.metrics import MeterProvider
        from opentelemetry.sdk.metrics.export import PeriodicExportingMetricReader
        from opentelemetry.sdk.metrics.view import ExplicitBucketHistogramAggregation, View
        from opentelemetry.sdk.resources import Resource

        views = [
            View(instrument_name=name, aggregation=ExplicitBucketHistogramAggregation(list(bounds)))
            for name, (_, bounds) in METRICS.items()
        ]
        self.reader = PeriodicExportingMetricReader(
            exporter or make_metric_exporter(endpoint, protocol, insecure=insecure)
        )
        resource = Resource.create(
            {"service.name": service_name, "sglang.process": "collector", "process.pid": os.getpid()}
        )
        self.provider = MeterProvider(resource=resource, metric_readers=[self.reader], views=views)
        meter = self.provider.get_meter("sglang_mmtrace")
        self.histograms = {
            name: meter.create_histogram(name, unit="s", description=doc) for name, (doc, _) in METRICS.items()
        }

    def emit(self, rec: dict[str, Any], ctx: EmitContext | None = None) -> None:
        for name, value, attrs in observations(rec):
            self.histograms[name].record(value, attrs)

    def close(self) -> None:
        try:
            self.provider.shutdown()
        except Exception as exc:
            telemetry.contained("sink.otlp_metrics.close", exc)


def make_metric_exporter(endpoint: str, protocol: str, timeout_s: float = 5.0, insecure: bool | None = True) -> Any:
    """OTLP metric exporter for the spans' endpoint: ``/v1/metrics`` over HTTP, MetricsService over gRPC
    (TLS as the spans' channel: ``insecure``, ``sinks.otlp.OtlpSettings``)."""
    from .otlp import otlp_url, quiet_exporter_logs

    quiet_exporter_logs()
    if protocol == "grpc":
        from opentelemetry.exporter.otlp.proto.grpc.metric_exporter import OTLPMetricExporter as GrpcExporter

        return GrpcExporter(endpoint=endpoint, insecure=insecure, timeout=timeout_s)
    from opentelemetry.exporter.otlp.proto.http.metric_exporter import OTLPMetricExporter as HttpExporter

    return HttpExporter(endpoint=otlp_url(endpoint, "metrics"), timeout=timeout_s)
