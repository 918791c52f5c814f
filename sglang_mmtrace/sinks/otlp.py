"""OpenTelemetry sink: one trace per request, built from the record's measured timestamps.

Spans are created in the collector process with explicit start/end times (off the request path),
tagged with the resource of the SGLang process that did the work (api, scheduler, detokenizer),
and exported in batches by a background thread with a bounded queue: a slow or absent collector
drops spans (``sglang_mmtrace_dropped_total{sink="otlp"}``) and never blocks a request.
"""

from __future__ import annotations

import logging
import random
import threading
from collections import deque
from typing import Any

from opentelemetry.sdk.trace import SpanProcessor

from .. import telemetry
from ..join.record import EmitContext
from ..stages import ROOT, STAGES
from .semconv import ATTR_PREFIX, server_span_attributes, server_span_name

MAX_QUEUE = 8192
BATCH = 512
EXPORT_INTERVAL_S = 0.2


EXPORTER_LOGGERS = (
    "opentelemetry.exporter.otlp.common.http",
    "opentelemetry.exporter.otlp.proto.http._common",
    "opentelemetry.exporter.otlp.proto.http.trace_exporter",
    "opentelemetry.exporter.otlp.proto.http.metric_exporter",
    "opentelemetry.exporter.otlp.proto.grpc.exporter",
    "opentelemetry.sdk.metrics._internal.export",
)


class _FirstOfEachMessage(logging.Filter):
    """Lets the first record of each message template through: a collector that is down or hangs
    makes the exporter log every failed batch, every few seconds; the sink counts them instead
    (``sglang_mmtrace_dropped_total{sink="otlp"}``)."""

    def __init__(self) -> None:
        super().__init__()
        self.seen: set[str] = set()

    def filter(self, record: logging.LogRecord) -> bool:
        key = str(record.msg)
        if key in self.seen:
            return False
        self.seen.add(key)
        return True


def quiet_exporter_logs() -> None:
    for name in EXPORTER_LOGGERS:
        log = logging.getLogger(name)
        if not any(isinstance(f, _FirstOfEachMessage) for f in log.filters):
            log.addFilter(_FirstOfEachMessage())


def make_exporter(endpoint: str, protocol: str, timeout_s: float = 5.0) -> Any:
    quiet_exporter_logs()
    if protocol == "grpc":
        from opentelemetry.exporter.otlp.proto.grpc.trace_exporter import OTLPSpanExporter as GrpcExporter

        target = endpoint.split("://", 1)[-1]
        return GrpcExporter(endpoint=target, insecure=True, timeout=timeout_s)
    from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter as HttpExporter

    return HttpExporter(endpoint=otlp_url(endpoint, "traces"), timeout=timeout_s)


def otlp_url(endpoint: str, signal: str) -> str:
    """The OTLP/HTTP URL of ``signal`` (``traces``, ``metrics``): a base endpoint gets ``/v1/<signal>``;
    an endpoint that names a signal's path already keeps its base and gets this signal's path."""
    base = endpoint.rstrip("/")
    for known in ("/v1/traces", "/v1/metrics"):
        base = base.removesuffix(known)
    return f"{base}/v1/{signal}"


class _BoundedBatchProcessor(SpanProcessor):
    """A SpanProcessor whose ``on_end`` never blocks: a full queue drops (and counts) spans."""

    def __init__(self, exporter: Any) -> None:
        self.exporter = exporter
        self.queue: deque[Any] = deque()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="mmtrace-otlp", daemon=True)
        self._thread.start()

    def on_start(self, span: Any, parent_context: Any = None) -> None:
        return None

    def on_end(self, span: Any) -> None:
        if len(self.queue) >= MAX_QUEUE:
            telemetry.drop("otlp")
            return
        self.queue.append(span)

    def _export_some(self) -> None:
        from opentelemetry.sdk.trace.export import SpanExportResult

        while self.queue:
            batch = [self.queue.popleft() for _ in range(min(BATCH, len(self.queue)))]
            try:
                ok = self.exporter.export(batch) == SpanExportResult.SUCCESS
            except Exception as exc:
                telemetry.contained("sink.otlp.export", exc)
                ok = False
            if not ok:
                telemetry.drop("otlp", len(batch))

    def _run(self) -> None:
        while not self._stop.wait(EXPORT_INTERVAL_S):
            self._export_some()

    def force_flush(self, timeout_millis: int = 30000) -> bool:
        self._export_some()
        return True

    def shutdown(self) -> None:
        self._stop.set()
        self._export_some()
        self.exporter.shutdown()


class OtlpSink:
    PART = "otlp"  # the switch part that gates this sink

    def __init__(
        self, endpoint: str, protocol: str, sample: float, service_name: str = "sglang", exporter: Any = None
    ) -> None:
        from opentelemetry.sdk.trace import TracerProvider

        self.sample = sample
        self.processor = _BoundedBatchProcessor(exporter or make_exporter(endpoint, protocol))
        self.service_name = service_name
        self._providers: dict[tuple[str, int | None], Any] = {}
        self._tracer_provider_cls = TracerProvider
        self.pids: dict[str, int] = {}

    def _tracer(self, process: str) -> Any:
        pid = self.pids.get(process)
        key = (process, pid)
        provider = self._providers.get(key)
        if provider is None:
            from opentelemetry.sdk.resources import Resource

            attrs: dict[str, Any] = {"service.name": self.service_name, "sglang.process": process}
            if pid is not None:
                attrs["process.pid"] = pid
            provider = self._tracer_provider_cls(resource=Resource.create(attrs))
            provider.add_span_processor(self.processor)
            self._providers[key] = provider
        return provider.get_tracer("sglang_mmtrace")

    def emit(self, rec: dict[str, Any], ctx: EmitContext) -> None:
        """Build the request's spans; sets ``rec["trace_id"]`` so the JSONL record points at the trace.

        The root is the GenAI operation (``server_span_name``), from arrival to the response's last
        byte: SERVER for a request over HTTP, INTERNAL for an offline Engine call (the conventions'
        kind for a model in the caller's process). Under it the ``request`` stage, arrival to the first
        chunk (TTFT), holds the stage tree as the catalogue parents it; a request that never had a
        first chunk (an error) has no ``request`` span and its stages hang from the root."""
        if self.sample < 1.0 and random.random() >= self.sample:
            return
        from opentelemetry import trace
        from opentelemetry.trace import SpanKind, Status, StatusCode
        from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

        base_ns = int(rec["arrival_unix_s"] * 1e9)
        self.pids = ctx.pids
        parent_ctx = None
        if ctx.traceparent:
            parent_ctx = TraceContextTextMapPropagator().extract({"traceparent": ctx.traceparent})
        stages = rec["stages"]
        ttft_stage = next((s for s in stages if s["name"] == ROOT), None)
        end_s = rec.get("e2e_s") or max((s["start_s"] + s["dur_s"] for s in stages), default=0.0)
        root = self._tracer("api").start_span(
            server_span_name(rec),
            context=parent_ctx,
            kind=SpanKind.INTERNAL if ctx.http is None else SpanKind.SERVER,
            start_time=base_ns,
            attributes=server_span_attributes(rec, ctx),
        )
        if rec["status"] != "ok":
            root.set_status(Status(StatusCode.ERROR, rec.get("error") or rec["status"]))
        rec["trace_id"] = format(root.get_span_context().trace_id, "032x")
        spans: dict[str, Any] = {}
        for s in sorted(stages, key=lambda s: STAGES[s["name"]].depth if s["name"] in STAGES else 9):
            parent = _nearest_parent(s["name"], spans) or root
            attrs = {ATTR_PREFIX + k: v for k, v in s["attrs"].items() if isinstance(v, (str, bool, int, float))}
            attrs[ATTR_PREFIX + "clock"] = s["clock"]
            if s is ttft_stage:
                attrs[ATTR_PREFIX + "coverage"] = rec.get("coverage", 0.0)
            span = self._tracer(s["process"]).start_span(
                s["name"],
                context=trace.set_span_in_context(parent),
                start_time=base_ns + int(s["start_s"] * 1e9),
                attributes=attrs,
            )
            span.end(end_time=base_ns + int((s["start_s"] + s["dur_s"]) * 1e9))
            spans.setdefault(s["name"], span)
        root.end(end_time=base_ns + int(max(end_s, ttft_stage["dur_s"] if ttft_stage else 0.0) * 1e9))

    def close(self) -> None:
        self.processor.shutdown()


def _nearest_parent(name: str, spans: dict[str, Any]) -> Any:
    """The span of the stage's nearest catalogue ancestor built so far; None for the ``request`` stage
    and for a stage none of whose ancestors the request had (both hang from the root)."""
    stage = STAGES.get(name)
    parent = stage.parent if stage else ROOT
    while parent is not None:
        if parent in spans:
            return spans[parent]
        parent = STAGES[parent].parent
    return None
