"""The standard OpenTelemetry environment, honoured as the SDK and ``opentelemetry-instrument`` do.

A matrix over the variables: each case sets the environment, builds what the collector builds
(``sinks.otlp.settings``, the SDK's exporter, the sink's resource and sampler) and checks the
effective settings; then the trace id a record may carry (none for a trace that was not exported),
and one export to a real OTLP receiver under the configured service name.
"""

from __future__ import annotations

import time

import pytest
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from peers.otlp_receiver import OtlpReceiver

from sglang_mmtrace import environment_variables as ev
from sglang_mmtrace.config import Config
from sglang_mmtrace.join import collector
from sglang_mmtrace.join.context import HttpCtx
from sglang_mmtrace.join.record import EmitContext
from sglang_mmtrace.sinks.otlp import OtlpSink, make_exporter, settings

OTEL_NAMES = tuple(n for n in dir(ev) if n.startswith("OTEL_")) + (
    "OTEL_EXPORTER_OTLP_HEADERS",
    "OTEL_EXPORTER_OTLP_TRACES_HEADERS",
    "OTEL_EXPORTER_OTLP_CERTIFICATE",
    "OTEL_EXPORTER_OTLP_TRACES_CERTIFICATE",
)
SAMPLED = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"
UNSAMPLED = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-00"


@pytest.fixture
def env(monkeypatch):
    """A clean OpenTelemetry and plugin environment; returns a function that sets variables and
    gives the ``Config`` the collector would read."""
    for v in ev.VARIABLES:
        for name in (v.name, *v.fallbacks):
            monkeypatch.delenv(name, raising=False)
    for name in OTEL_NAMES:
        monkeypatch.delenv(name, raising=False)

    def set_env(**values: str) -> Config:
        for k, val in values.items():
            monkeypatch.setenv(k, val)
        return Config.from_env()

    return set_env


def _record(rid: str = "r1") -> dict:
    stage = {"name": "request", "process": "api", "start_s": 0.0, "dur_s": 0.1, "clock": "host", "attrs": {}}
    return {"rid": rid, "arrival_unix_s": 1000.0, "status": "ok", "model": "m", "ttft_s": 0.1, "stages": [stage]}


@pytest.mark.parametrize(
    ("values", "protocol", "endpoint", "insecure"),
    [
        # the plugin's own variable keeps its documented meaning
        ({"SGLANG_MMTRACE_OTLP_ENDPOINT": "http://c:4318"}, "http/protobuf", "http://c:4318/v1/traces", None),
        ({"SGLANG_MMTRACE_OTLP_ENDPOINT": "http://c:4318/v1/traces"}, "http/protobuf", "http://c:4318/v1/traces", None),
        ({"SGLANG_MMTRACE_OTLP_ENDPOINT": "c:4317", "SGLANG_MMTRACE_OTLP_PROTOCOL": "grpc"}, "grpc", "c:4317", True),
        # a per-signal endpoint is used as given; the base one gets the signal's path
        ({"OTEL_EXPORTER_OTLP_TRACES_ENDPOINT": "http://gw/otlp/spans"}, "http/protobuf", "http://gw/otlp/spans", None),
        ({"OTEL_EXPORTER_OTLP_ENDPOINT": "http://c:4318/"}, "http/protobuf", "http://c:4318/v1/traces", None),
        (
            {"OTEL_EXPORTER_OTLP_ENDPOINT": "http://b:4318", "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT": "http://t:4318/x"},
            "http/protobuf",
            "http://t:4318/x",
            None,
        ),
        (
            {"SGLANG_MMTRACE_OTLP_ENDPOINT": "http://m:4318", "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT": "http://t/x"},
            "http/protobuf",
            "http://m:4318/v1/traces",
            None,
        ),
        # protocol: per-signal over general over the default
        (
            {"OTEL_EXPORTER_OTLP_ENDPOINT": "http://c:4317", "OTEL_EXPORTER_OTLP_PROTOCOL": "grpc"},
            "grpc",
            "http://c:4317",
            True,
        ),
        (
            {
                "OTEL_EXPORTER_OTLP_ENDPOINT": "http://c:4318",
                "OTEL_EXPORTER_OTLP_PROTOCOL": "grpc",
                "OTEL_EXPORTER_OTLP_TRACES_PROTOCOL": "http/protobuf",
            },
            "http/protobuf",
            "http://c:4318/v1/traces",
            None,
        ),
        # gRPC TLS: the scheme decides; without one, the insecure variables (the SDK's default: TLS)
        (
            {"OTEL_EXPORTER_OTLP_ENDPOINT": "https://c:4317", "OTEL_EXPORTER_OTLP_PROTOCOL": "grpc"},
            "grpc",
            "https://c:4317",
            False,
        ),
        ({"OTEL_EXPORTER_OTLP_ENDPOINT": "c:4317", "OTEL_EXPORTER_OTLP_PROTOCOL": "grpc"}, "grpc", "c:4317", False),
        (
            {
                "OTEL_EXPORTER_OTLP_ENDPOINT": "c:4317",
                "OTEL_EXPORTER_OTLP_PROTOCOL": "grpc",
                "OTEL_EXPORTER_OTLP_INSECURE": "true",
            },
            "grpc",
            "c:4317",
            True,
        ),
        (
            {
                "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT": "c:4317",
                "OTEL_EXPORTER_OTLP_TRACES_PROTOCOL": "grpc",
                "OTEL_EXPORTER_OTLP_INSECURE": "false",
                "OTEL_EXPORTER_OTLP_TRACES_INSECURE": "TRUE",
            },
            "grpc",
            "c:4317",
            True,
        ),
        (
            {
                "SGLANG_MMTRACE_OTLP_ENDPOINT": "c:4317",
                "SGLANG_MMTRACE_OTLP_PROTOCOL": "grpc",
                "OTEL_EXPORTER_OTLP_INSECURE": "false",
            },
            "grpc",
            "c:4317",
            False,
        ),
        (
            {"SGLANG_MMTRACE_OTLP_ENDPOINT": "https://c:4317", "SGLANG_MMTRACE_OTLP_PROTOCOL": "grpc"},
            "grpc",
            "https://c:4317",
            False,
        ),
    ],
)
def test_endpoint_protocol_and_tls(env, values, protocol, endpoint, insecure):
    s = settings(env(**values))
    assert (s.protocol, s.endpoint, s.insecure) == (protocol, endpoint, insecure)
    exporter = make_exporter(s)
    try:
        if protocol == "grpc":
            assert exporter._insecure is insecure
            assert exporter._endpoint == endpoint.split("://", 1)[-1]
        else:
            assert exporter._endpoint == endpoint
    finally:
        exporter.shutdown()


def test_headers_certificate_and_timeout_reach_the_exporter(env, tmp_path):
    """Read by the SDK's exporter itself, so exactly as the SDK reads them."""
    cfg = env(
        OTEL_EXPORTER_OTLP_ENDPOINT="https://c:4318",
        OTEL_EXPORTER_OTLP_HEADERS="authorization=Bearer%20t,x-tenant=a",
        OTEL_EXPORTER_OTLP_TRACES_CERTIFICATE=str(tmp_path / "ca.pem"),
        OTEL_EXPORTER_OTLP_TIMEOUT="7",
    )
    exporter = make_exporter(settings(cfg))
    try:
        client = exporter._client
        assert client._headers["authorization"] == "Bearer t" and client._headers["x-tenant"] == "a"
        assert client._transport._session.verify == str(tmp_path / "ca.pem")
        assert client._timeout == 7.0
    finally:
        exporter.shutdown()


def test_default_timeout_is_the_plugins(env):
    exporter = make_exporter(settings(env(OTEL_EXPORTER_OTLP_ENDPOINT="http://c:4318")))
    try:
        assert exporter._client._timeout == 5.0
    finally:
        exporter.shutdown()


@pytest.mark.parametrize(
    ("values", "service_name", "extra"),
    [
        ({}, "sglang", {}),
        ({"OTEL_SERVICE_NAME": "my-vlm"}, "my-vlm", {}),
        (
            {"OTEL_RESOURCE_ATTRIBUTES": "service.name=from-attrs,deployment.environment=prod"},
            "from-attrs",
            {"deployment.environment": "prod"},
        ),
        ({"OTEL_RESOURCE_ATTRIBUTES": "service.name=from-attrs", "OTEL_SERVICE_NAME": "wins"}, "wins", {}),
        ({"OTEL_RESOURCE_ATTRIBUTES": "team=vision,sglang.process=spoofed"}, "sglang", {"team": "vision"}),
    ],
)
def test_service_name_and_resource(env, values, service_name, extra):
    cfg = env(SGLANG_MMTRACE_OTLP_ENDPOINT="http://unused", **values)
    exporter = InMemorySpanExporter()
    sink = OtlpSink(settings(cfg), exporter=exporter)
    sink.emit(_record(), EmitContext(pids={"api": 11}))
    sink.processor.force_flush()
    span, _ = exporter.get_finished_spans()  # the request's ``request`` span and its root, both the API's
    resource = span.resource.attributes
    assert resource["service.name"] == service_name
    assert resource["sglang.process"] == "api" and resource["process.pid"] == 11  # the plugin's stay
    assert {k: resource[k] for k in extra} == extra


@pytest.mark.parametrize(
    ("values", "description"),
    [
        ({}, "ParentBased{root:AlwaysOnSampler,"),
        ({"SGLANG_MMTRACE_SAMPLE": "0.25"}, "ParentBased{root:TraceIdRatioBased{0.25},"),
        ({"OTEL_TRACES_SAMPLER": "always_off"}, "AlwaysOffSampler"),
        ({"OTEL_TRACES_SAMPLER": "traceidratio", "OTEL_TRACES_SAMPLER_ARG": "0.5"}, "TraceIdRatioBased{0.5}"),
        (
            {
                "OTEL_TRACES_SAMPLER": "parentbased_traceidratio",
                "OTEL_TRACES_SAMPLER_ARG": "0.1",
                "SGLANG_MMTRACE_SAMPLE": "0.9",
            },
            "ParentBased{root:TraceIdRatioBased{0.1},",
        ),
        ({"OTEL_TRACES_SAMPLER": "traceidratio", "OTEL_TRACES_SAMPLER_ARG": "x"}, "TraceIdRatioBased{1.0}"),
    ],
)
def test_sampler(env, values, description):
    s = settings(env(SGLANG_MMTRACE_OTLP_ENDPOINT="http://unused", **values))
    assert s.sampler.get_description().startswith(description)


@pytest.mark.parametrize(
    ("values", "carrier", "exported"),
    [
        ({}, {}, True),
        ({"OTEL_TRACES_SAMPLER": "always_off"}, {}, False),
        ({"SGLANG_MMTRACE_SAMPLE": "0"}, {}, False),
        ({"SGLANG_MMTRACE_SAMPLE": "0"}, {"traceparent": SAMPLED}, True),  # the caller decided: parent-based
        ({}, {"traceparent": UNSAMPLED}, False),
        ({"OTEL_PROPAGATORS": "none"}, {"traceparent": UNSAMPLED}, True),  # not read: a new root
    ],
)
def test_trace_id_only_for_an_exported_trace(env, monkeypatch, values, carrier, exported):
    from opentelemetry import propagate

    cfg = env(SGLANG_MMTRACE_OTLP_ENDPOINT="http://unused", **values)
    if "OTEL_PROPAGATORS" in values:  # the API reads it once, at import: as a fresh process does
        monkeypatch.setattr(propagate, "_HTTP_TEXT_FORMAT", propagate._load_propagators())
    exporter = InMemorySpanExporter()
    sink = OtlpSink(settings(cfg), exporter=exporter)
    rec = _record()
    rec["trace_id"] = "f" * 32  # whatever build_record put there is replaced
    sink.emit(rec, EmitContext(carrier))
    sink.processor.force_flush()
    spans = exporter.get_finished_spans()
    if exported:
        assert len(spans) == 2 and {format(s.context.trace_id, "032x") for s in spans} == {rec["trace_id"]}
        assert rec["trace_id"] != "0" * 32
    else:
        assert len(spans) == 0 and rec["trace_id"] is None


def test_tracestate_is_kept(env):
    exporter = InMemorySpanExporter()
    sink = OtlpSink(settings(env(SGLANG_MMTRACE_OTLP_ENDPOINT="http://unused")), exporter=exporter)
    sink.emit(_record(), EmitContext({"traceparent": SAMPLED, "tracestate": "vendor=abc"}))
    sink.processor.force_flush()
    span, _ = exporter.get_finished_spans()
    assert span.context.trace_state.get("vendor") == "abc"
    assert format(span.context.trace_id, "032x") == SAMPLED.split("-")[1]


@pytest.mark.parametrize(
    ("headers", "trace_id"),
    [
        (None, None),
        ({"traceparent": SAMPLED}, SAMPLED.split("-")[1]),
        ({"traceparent": UNSAMPLED}, None),  # the caller did not record it
        ({"traceparent": "00-" + "0" * 32 + "-b7ad6b7169203331-01"}, None),  # invalid
        ({"traceparent": "garbage"}, None),
    ],
)
def test_record_trace_id_from_the_incoming_context(headers, trace_id):
    """Without the OTLP sink the record points at the caller's trace only where it exists."""
    http = HttpCtx(0.0, "/v1/chat/completions")
    http.trace_headers = headers
    assert collector._trace_id(http) == trace_id


@pytest.mark.parametrize("disabled", ["true", "TRUE", "false"])
def test_sdk_disabled_builds_no_otlp_sink(env, disabled):
    cfg = env(SGLANG_MMTRACE_OTLP_ENDPOINT="http://127.0.0.1:9", OTEL_SDK_DISABLED=disabled)
    sinks = collector._sinks(cfg)
    try:
        assert any(isinstance(s, OtlpSink) for s in sinks) is (disabled == "false")
        assert settings(cfg).disabled is (disabled != "false")
    finally:
        for s in sinks:
            s.close()


def test_spans_reach_a_real_receiver_under_the_configured_service_name(env):
    receiver = OtlpReceiver()
    port = receiver.start_http()
    try:
        cfg = env(
            OTEL_EXPORTER_OTLP_ENDPOINT=f"http://127.0.0.1:{port}",
            OTEL_SERVICE_NAME="my-vlm",
            OTEL_RESOURCE_ATTRIBUTES="deployment.environment=test",
        )
        sink = OtlpSink(settings(cfg))
        rec = _record()
        sink.emit(rec, EmitContext({"traceparent": SAMPLED, "tracestate": "vendor=abc"}, {"api": 11}))
        sink.close()
        deadline = time.monotonic() + 10
        while len(receiver.snapshot()) < 2 and time.monotonic() < deadline:
            time.sleep(0.05)
        span, _ = receiver.snapshot()  # the root and its ``request`` span
        assert receiver.bad_requests == []
        assert span.resource["service.name"] == "my-vlm"
        assert span.resource["deployment.environment"] == "test"
        assert span.resource["sglang.process"] == "api"
        assert span.trace_id == rec["trace_id"] == SAMPLED.split("-")[1]
    finally:
        receiver.stop()


def test_the_middleware_keeps_the_propagators_headers_only():
    """``traceparent``, ``tracestate`` and ``baggage`` (the default propagators' fields) reach the
    collector; the request's other headers, credentials among them, do not."""
    from sglang_mmtrace.hooks.api import http_server

    scope = {
        "path": "/v1/chat/completions",
        "headers": [
            (b"traceparent", SAMPLED.encode()),
            (b"tracestate", b"vendor=abc"),
            (b"authorization", b"Bearer secret"),
        ],
    }
    ctx = http_server._open(scope, http_server._trace_fields())
    assert ctx.trace_headers == {"traceparent": SAMPLED, "tracestate": "vendor=abc"}
