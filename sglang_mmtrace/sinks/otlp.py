"""OpenTelemetry sink: one trace per request, built from the record's measured timestamps.

Spans are created in the collector process with explicit start/end times (off the request path),
tagged with the resource of the SGLang process that did the work (api, scheduler, detokenizer),
and exported in batches by a background thread with a bounded queue: a slow or absent collector
drops spans (``sglang_mmtrace_dropped_total{sink="otlp"}``) and never blocks a request.

The standard OpenTelemetry environment is honoured as the SDK and ``opentelemetry-instrument``
honour it (``settings``): users run the plugin beside a collector configured for their other
services, and a setting the plugin ignored would send its spans elsewhere, unencrypted, unsampled or
under another service name than theirs.
"""

from __future__ import annotations

import logging
import os
import threading
from collections import deque
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlsplit

from opentelemetry.sdk.trace import SpanProcessor

from .. import environment_variables as ev
from .. import telemetry
from ..config import Config
from ..join.record import EmitContext
from ..stages import ROOT, STAGES
from .semconv import ATTR_PREFIX, server_span_attributes, server_span_name

MAX_QUEUE = 8192
BATCH = 512
EXPORT_INTERVAL_S = 0.2
SERVICE_NAME = "sglang"
"""``service.name`` where neither ``OTEL_SERVICE_NAME`` nor ``OTEL_RESOURCE_ATTRIBUTES`` names one."""
TIMEOUT_S = 5.0
"""Export timeout where ``OTEL_EXPORTER_OTLP_[TRACES_]TIMEOUT`` sets none: shorter than the SDK's, so
a hung collector holds the export thread less long."""


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


def _true(raw: str | None) -> bool | None:
    """An OpenTelemetry boolean (``true``, case-insensitive, is true); None where unset."""
    return None if raw is None else raw.strip().lower() == "true"


@dataclass(frozen=True)
class OtlpSettings:
    """The span export's effective settings, from the plugin's variables and the OpenTelemetry ones.

    What the SDK's exporter reads from the environment by itself (headers, certificates, client keys,
    compression, timeouts) is left to it, so it is read exactly as the SDK reads it.
    """

    disabled: bool
    """``OTEL_SDK_DISABLED=true``: no span export, and so no record or exemplar points at a trace."""
    protocol: str
    endpoint: str | None
    """The URL (http/protobuf) or target (gRPC) the exporter is given; None: no span export."""
    endpoint_from: str | None
    """The variable the endpoint came from."""
    insecure: bool | None
    """gRPC only: a plaintext channel (True) or TLS (False)."""
    service_name: str
    sampler: Any
    propagators: str

    @property
    def exports(self) -> bool:
        return self.endpoint is not None and not self.disabled


def settings(cfg: Config) -> OtlpSettings:
    """The effective settings for ``cfg`` in this process's environment.

    Endpoint: ``SGLANG_MMTRACE_OTLP_ENDPOINT`` (a base, or a URL that already names a signal's
    path); else ``OTEL_EXPORTER_OTLP_TRACES_ENDPOINT``, used as given (the spec's per-signal rule);
    else ``OTEL_EXPORTER_OTLP_ENDPOINT``, a base that gets ``/v1/traces`` over HTTP. gRPC's TLS: an
    ``https`` endpoint gets it, an ``http`` one does not, one without a scheme follows
    ``OTEL_EXPORTER_OTLP_[TRACES_]INSECURE``, whose default is the SDK's (TLS) except for the
    plugin's own variable, whose scheme-less ``host:port`` always meant plaintext.
    """
    env = os.environ
    endpoint, source = _endpoint(cfg)
    protocol = cfg.otlp_protocol
    insecure = None
    if endpoint is not None:
        if protocol == "grpc":
            scheme = urlsplit(endpoint).scheme if "://" in endpoint else ""
            if scheme in ("http", "https"):
                insecure = scheme == "http"
            else:
                chosen = _true(
                    env.get(ev.OTEL_EXPORTER_OTLP_TRACES_INSECURE) or env.get(ev.OTEL_EXPORTER_OTLP_INSECURE)
                )
                insecure = chosen if chosen is not None else source == ev.SGLANG_MMTRACE_OTLP_ENDPOINT
        elif source == ev.OTEL_EXPORTER_OTLP_TRACES_ENDPOINT:
            pass  # used as given
        elif source == ev.OTEL_EXPORTER_OTLP_ENDPOINT:
            endpoint = f"{endpoint.rstrip('/')}/v1/traces"
        else:
            endpoint = otlp_url(endpoint, "traces")
    return OtlpSettings(
        disabled=bool(_true(env.get(ev.OTEL_SDK_DISABLED))),
        protocol=protocol,
        endpoint=endpoint,
        endpoint_from=source,
        insecure=insecure,
        service_name=_service_name(),
        sampler=_sampler(cfg),
        propagators=env.get(ev.OTEL_PROPAGATORS) or "tracecontext,baggage",
    )


def _endpoint(cfg: Config) -> tuple[str | None, str | None]:
    """``cfg``'s endpoint and the variable it came from (``Variable.value``'s order)."""
    names = (ev.SGLANG_MMTRACE_OTLP_ENDPOINT, ev.OTEL_EXPORTER_OTLP_TRACES_ENDPOINT, ev.OTEL_EXPORTER_OTLP_ENDPOINT)
    source = next((n for n in names if os.environ.get(n)), ev.SGLANG_MMTRACE_OTLP_ENDPOINT)
    return (cfg.otlp_endpoint, source) if cfg.otlp_endpoint else (None, None)


def _service_name() -> str:
    """As the SDK's resource detector reads it: ``OTEL_SERVICE_NAME`` over ``OTEL_RESOURCE_ATTRIBUTES``."""
    from opentelemetry.sdk.resources import SERVICE_NAME as KEY
    from opentelemetry.sdk.resources import OTELResourceDetector

    return str(OTELResourceDetector().detect().attributes.get(KEY) or SERVICE_NAME)


def _sampler(cfg: Config) -> Any:
    """``OTEL_TRACES_SAMPLER`` (and ``_ARG``) as the SDK parses them; else ``SGLANG_MMTRACE_SAMPLE``
    below 1 as a parent-based trace-id ratio (a request continuing a caller's trace follows the
    caller's decision, so a trace is never half exported); else the SDK's default (parent-based,
    always on)."""
    from opentelemetry.sdk.trace import sampling

    if os.environ.get(ev.OTEL_TRACES_SAMPLER):
        # The parser TracerProvider itself calls without a sampler: the SDK's names, defaults and
        # warnings; called here so the doctor can show the sampler the sink will use.
        return sampling._get_from_env_or_default()
    if cfg.sample < 1.0:
        return sampling.ParentBasedTraceIdRatio(cfg.sample)
    return sampling.DEFAULT_ON


def make_exporter(s: OtlpSettings) -> Any:
    """The SDK's OTLP span exporter for ``s``; it reads headers, certificates and compression itself."""
    quiet_exporter_logs()
    env_timeout = os.environ.get(ev.OTEL_EXPORTER_OTLP_TRACES_TIMEOUT) or os.environ.get(ev.OTEL_EXPORTER_OTLP_TIMEOUT)
    timeout = None if env_timeout else TIMEOUT_S
    if s.protocol == "grpc":
        from opentelemetry.exporter.otlp.proto.grpc.trace_exporter import OTLPSpanExporter as GrpcExporter

        return GrpcExporter(endpoint=s.endpoint, insecure=s.insecure, timeout=timeout)
    from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter as HttpExporter

    return HttpExporter(endpoint=s.endpoint, timeout=timeout)


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

    def __init__(self, settings: OtlpSettings, exporter: Any = None) -> None:
        from opentelemetry import propagate
        from opentelemetry.sdk.trace import TracerProvider

        self.settings = settings
        self.processor = _BoundedBatchProcessor(exporter or make_exporter(settings))
        self._propagator = propagate.get_global_textmap()  # OTEL_PROPAGATORS, as the SDK reads it
        self._providers: dict[tuple[str, int | None], Any] = {}
        self._tracer_provider_cls = TracerProvider
        self.pids: dict[str, int] = {}

    def _tracer(self, process: str) -> Any:
        pid = self.pids.get(process)
        key = (process, pid)
        provider = self._providers.get(key)
        if provider is None:
            from opentelemetry.sdk.resources import Resource

            # Resource.create merges OTEL_RESOURCE_ATTRIBUTES and OTEL_SERVICE_NAME under these.
            attrs: dict[str, Any] = {"service.name": self.settings.service_name, "sglang.process": process}
            if pid is not None:
                attrs["process.pid"] = pid
            provider = self._tracer_provider_cls(resource=Resource.create(attrs), sampler=self.settings.sampler)
            provider.add_span_processor(self.processor)
            self._providers[key] = provider
        return provider.get_tracer("sglang_mmtrace")

    def emit(self, rec: dict[str, Any], ctx: EmitContext) -> None:
        """Build the request's spans. ``rec["trace_id"]`` becomes the trace's id when the sampler kept
        it, and None when it did not: a record or exemplar never points at a trace that was not
        exported.

        The root is the GenAI operation (``server_span_name``), from arrival to the response's last
        byte: SERVER for a request over HTTP, INTERNAL for an offline Engine call (the conventions'
        kind for a model in the caller's process). Under it the ``request`` stage, arrival to the first
        chunk (TTFT), holds the stage tree as the catalogue parents it; a request that never had a
        first chunk (an error) has no ``request`` span and its stages hang from the root."""
        from opentelemetry import trace
        from opentelemetry.trace import SpanKind, Status, StatusCode

        base_ns = int(rec["arrival_unix_s"] * 1e9)
        self.pids = ctx.pids
        parent_ctx = self._propagator.extract(ctx.carrier) if ctx.carrier else None
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
        span_context = root.get_span_context()
        if not (span_context.is_valid and span_context.trace_flags.sampled):
            rec["trace_id"] = None  # the sampler dropped the trace (or the SDK is disabled)
            return
        rec["trace_id"] = format(span_context.trace_id, "032x")
        if rec["status"] != "ok":
            root.set_status(Status(StatusCode.ERROR, rec.get("error") or rec["status"]))
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
