"""An in-test OTLP receiver speaking the real protocol: HTTP (``POST /v1/traces``, ``POST /v1/metrics``)
and gRPC (``TraceService``, ``MetricsService``).

Both transports decode ``opentelemetry.proto`` ``ExportTraceServiceRequest`` messages (the
messages the OpenTelemetry collector receives) and flatten them into :class:`Span` rows: ids as
lower-case hex, attributes as plain Python values, the span's resource attributes alongside.
``ExportMetricsServiceRequest`` messages become :class:`HistogramPoint` rows (histograms only: the
plugin exports no other kind).
Nothing from the OpenTelemetry SDK is used here, so the receiver checks the exporter's wire
format, not the SDK's in-memory objects.
"""

from __future__ import annotations

import gzip
import http.server
import threading
import zlib
from concurrent import futures
from dataclasses import dataclass, field
from typing import Any

from opentelemetry.proto.collector.metrics.v1 import metrics_service_pb2, metrics_service_pb2_grpc
from opentelemetry.proto.collector.trace.v1 import trace_service_pb2, trace_service_pb2_grpc


@dataclass(frozen=True)
class Span:
    trace_id: str
    span_id: str
    parent_span_id: str | None
    name: str
    start_ns: int
    end_ns: int
    attrs: dict[str, Any]
    resource: dict[str, Any]
    scope: str
    transport: str
    status_code: int = 0
    kind: int = 0  # opentelemetry.proto Span.SpanKind: 1 internal, 2 server, 3 client

    @property
    def duration_s(self) -> float:
        return (self.end_ns - self.start_ns) / 1e9


@dataclass(frozen=True)
class HistogramPoint:
    name: str
    unit: str
    attrs: dict[str, Any]
    count: int
    sum: float
    bounds: tuple[float, ...]
    bucket_counts: tuple[int, ...]
    temporality: int  # AggregationTemporality: 1 delta, 2 cumulative
    time_ns: int
    resource: dict[str, Any]
    transport: str


def any_value(v: Any) -> Any:
    """An ``AnyValue`` as a Python value."""
    kind = v.WhichOneof("value")
    if kind is None:
        return None
    if kind == "array_value":
        return [any_value(x) for x in v.array_value.values]
    if kind == "kvlist_value":
        return {kv.key: any_value(kv.value) for kv in v.kvlist_value.values}
    return getattr(v, kind)


def attributes(kvs: Any) -> dict[str, Any]:
    return {kv.key: any_value(kv.value) for kv in kvs}


@dataclass
class OtlpReceiver:
    """Collects spans from both transports; start with :meth:`start_http` / :meth:`start_grpc`."""

    spans: list[Span] = field(default_factory=list)
    points: list[HistogramPoint] = field(default_factory=list)
    requests: dict[str, int] = field(default_factory=lambda: {"http": 0, "grpc": 0})
    bad_requests: list[str] = field(default_factory=list)
    _lock: threading.Lock = field(default_factory=threading.Lock)
    http_port: int | None = None
    grpc_port: int | None = None
    _httpd: http.server.ThreadingHTTPServer | None = None
    _grpc: Any = None

    # -- decoding ------------------------------------------------------------------------------
    def ingest(self, body: bytes, transport: str) -> None:
        req = trace_service_pb2.ExportTraceServiceRequest()
        req.ParseFromString(body)
        self.ingest_message(req, transport)

    def ingest_message(self, req: Any, transport: str) -> None:
        rows = []
        for rs in req.resource_spans:
            resource = attributes(rs.resource.attributes)
            for ss in rs.scope_spans:
                for sp in ss.spans:
                    rows.append(
                        Span(
                            trace_id=sp.trace_id.hex(),
                            span_id=sp.span_id.hex(),
                            parent_span_id=sp.parent_span_id.hex() or None,
                            name=sp.name,
                            start_ns=sp.start_time_unix_nano,
                            end_ns=sp.end_time_unix_nano,
                            attrs=attributes(sp.attributes),
                            resource=resource,
                            scope=ss.scope.name,
                            transport=transport,
                            status_code=sp.status.code,
                            kind=sp.kind,
                        )
                    )
        with self._lock:
            self.requests[transport] += 1
            self.spans.extend(rows)

    def ingest_metrics(self, req: Any, transport: str) -> None:
        rows = []
        for rm in req.resource_metrics:
            resource = attributes(rm.resource.attributes)
            for sm in rm.scope_metrics:
                for metric in sm.metrics:
                    if metric.WhichOneof("data") != "histogram":
                        raise ValueError(f"{metric.name}: {metric.WhichOneof('data')}, not a histogram")
                    hist = metric.histogram
                    for dp in hist.data_points:
                        rows.append(
                            HistogramPoint(
                                name=metric.name,
                                unit=metric.unit,
                                attrs=attributes(dp.attributes),
                                count=dp.count,
                                sum=dp.sum,
                                bounds=tuple(dp.explicit_bounds),
                                bucket_counts=tuple(dp.bucket_counts),
                                temporality=hist.aggregation_temporality,
                                time_ns=dp.time_unix_nano,
                                resource=resource,
                                transport=transport,
                            )
                        )
        with self._lock:
            self.requests[transport] += 1
            self.points.extend(rows)

    def metric_snapshot(self) -> list[HistogramPoint]:
        with self._lock:
            return list(self.points)

    def snapshot(self) -> list[Span]:
        with self._lock:
            return list(self.spans)

    # -- HTTP: POST /v1/traces and /v1/metrics, application/x-protobuf -------------------------
    def start_http(self) -> int:
        receiver = self

        class Handler(http.server.BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def do_POST(self) -> None:  # noqa: N802 (http.server API)
                length = int(self.headers.get("Content-Length") or 0)
                body = self.rfile.read(length)
                encoding = (self.headers.get("Content-Encoding") or "").lower()
                ctype = (self.headers.get("Content-Type") or "").split(";")[0].strip()
                try:
                    if self.path not in ("/v1/traces", "/v1/metrics"):
                        raise ValueError(f"unexpected path {self.path}")
                    if ctype != "application/x-protobuf":
                        raise ValueError(f"unexpected content type {ctype!r}")
                    if encoding == "gzip":
                        body = gzip.decompress(body)
                    elif encoding == "deflate":
                        body = zlib.decompress(body)
                    if self.path == "/v1/metrics":
                        req = metrics_service_pb2.ExportMetricsServiceRequest()
                        req.ParseFromString(body)
                        receiver.ingest_metrics(req, "http")
                        answer: Any = metrics_service_pb2.ExportMetricsServiceResponse()
                    else:
                        receiver.ingest(body, "http")
                        answer = trace_service_pb2.ExportTraceServiceResponse()
                except Exception as exc:  # answer 400 and remember why (a test asserts none)
                    receiver.bad_requests.append(f"{type(exc).__name__}: {exc}")
                    self.send_response(400)
                    self.send_header("Content-Length", "0")
                    self.end_headers()
                    return
                out = answer.SerializeToString()
                self.send_response(200)
                self.send_header("Content-Type", "application/x-protobuf")
                self.send_header("Content-Length", str(len(out)))
                self.end_headers()
                self.wfile.write(out)

            def log_message(self, format: str, *args: Any) -> None:
                pass

        self._httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self._httpd.daemon_threads = True
        self.http_port = int(self._httpd.server_address[1])
        threading.Thread(target=self._httpd.serve_forever, name="otlp-http-receiver", daemon=True).start()
        return self.http_port

    def stop_http(self) -> None:
        if self._httpd is not None:
            self._httpd.shutdown()
            self._httpd.server_close()
            self._httpd = None

    # -- gRPC: TraceService/Export and MetricsService/Export (opentelemetry.proto.collector) ----
    def start_grpc(self) -> int:
        import grpc

        receiver = self

        class Servicer(trace_service_pb2_grpc.TraceServiceServicer):
            def Export(self, request: Any, context: Any) -> Any:  # noqa: N802 (gRPC API)
                receiver.ingest_message(request, "grpc")
                return trace_service_pb2.ExportTraceServiceResponse()

        class MetricsServicer(metrics_service_pb2_grpc.MetricsServiceServicer):
            def Export(self, request: Any, context: Any) -> Any:  # noqa: N802 (gRPC API)
                receiver.ingest_metrics(request, "grpc")
                return metrics_service_pb2.ExportMetricsServiceResponse()

        server = grpc.server(futures.ThreadPoolExecutor(max_workers=4))
        trace_service_pb2_grpc.add_TraceServiceServicer_to_server(Servicer(), server)
        metrics_service_pb2_grpc.add_MetricsServiceServicer_to_server(MetricsServicer(), server)
        self.grpc_port = server.add_insecure_port("127.0.0.1:0")
        server.start()
        self._grpc = server
        return self.grpc_port

    def stop_grpc(self) -> None:
        if self._grpc is not None:
            self._grpc.stop(grace=None).wait(10)
            self._grpc = None

    def stop(self) -> None:
        self.stop_http()
        self.stop_grpc()
