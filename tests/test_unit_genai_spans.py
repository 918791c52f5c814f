"""The spans against the semantic conventions of the version docs/contract.md names (v1.41.1).

Records go through the real sink and its real OTLP/HTTP exporter to the in-test receiver
(``peers/otlp_receiver.py``, protobuf over HTTP as a collector receives it); the received spans are
checked against the conventions' tables below, transcribed by hand (not generated from the code
under test), and against the record they were built from.

Transcribed from open-telemetry/semantic-conventions at tag v1.41.1 (the last release that holds the
GenAI conventions; later ones point to open-telemetry/semantic-conventions-genai):
- https://github.com/open-telemetry/semantic-conventions/blob/v1.41.1/model/gen-ai/spans.yaml
  (``span.gen_ai.inference.client``, extending ``attributes.gen_ai.inference.client`` and
  ``attributes.gen_ai.common``), docs/gen-ai/gen-ai-spans.md ("Inference");
- https://github.com/open-telemetry/semantic-conventions/blob/v1.41.1/model/http/spans.yaml
  (``span.http.server``) and model/http/common.yaml (``attributes.http.common``,
  ``attributes.http.server``), docs/http/http-spans.md ("HTTP server span", "Status");
- https://github.com/open-telemetry/semantic-conventions/blob/v1.41.1/model/gen-ai/registry.yaml
  (the attributes' types).
"""

from __future__ import annotations

import re
import time
from typing import Any

import pytest
from peers.otlp_receiver import OtlpReceiver, Span

from sglang_mmtrace.config import Config
from sglang_mmtrace.join.record import EmitContext, HttpFacts
from sglang_mmtrace.sinks.otlp import OtlpSink, settings
from sglang_mmtrace.stages import MODEL_FORWARD, MODEL_PREFILL, ROOT, TOKENIZE

# opentelemetry.proto.trace.v1.Span.SpanKind and Status.StatusCode
KIND_INTERNAL, KIND_SERVER = 1, 2
STATUS_UNSET, STATUS_ERROR = 0, 2

GENAI_SPAN_NAME = "{gen_ai.operation.name} {gen_ai.request.model}"
GENAI_REQUIRED = {"gen_ai.operation.name": str, "gen_ai.provider.name": str}
GENAI_CONDITIONALLY_REQUIRED = {
    "error.type": (str, "if the operation ended in an error"),
    "gen_ai.request.model": (str, "if available"),
    "gen_ai.request.stream": (bool, "if and only if the request is streaming"),
}
GENAI_RECOMMENDED = {
    "gen_ai.response.id": str,
    "gen_ai.usage.input_tokens": int,
    "gen_ai.usage.output_tokens": int,
    "gen_ai.usage.cache_read.input_tokens": int,
    "gen_ai.usage.cache_creation.input_tokens": int,
    "gen_ai.usage.reasoning.output_tokens": int,
    "gen_ai.response.model": str,
    "gen_ai.response.finish_reasons": list,
    "gen_ai.response.time_to_first_chunk": float,
    "gen_ai.request.max_tokens": int,
    "gen_ai.request.temperature": float,
    "gen_ai.request.top_p": float,
    "gen_ai.request.top_k": float,
    "gen_ai.request.seed": int,
    "gen_ai.request.choice.count": int,
    "gen_ai.request.stop_sequences": list,
    "gen_ai.request.frequency_penalty": float,
    "gen_ai.request.presence_penalty": float,
    "gen_ai.output.type": str,
    "gen_ai.conversation.id": str,
}
"""Every other ``gen_ai.*`` attribute of the inference span (recommended or opt-in content ones left out:
the plugin records no message content under GenAI names)."""

HTTP_SERVER_KIND = KIND_SERVER  # "Span kind MUST be SERVER"
HTTP_SERVER_REQUIRED = {"http.request.method": str, "url.path": str, "url.scheme": str}
HTTP_SERVER_CONDITIONALLY_REQUIRED = {
    "http.response.status_code": (int, "if and only if one was sent"),
    "http.route": (str, "if and only if it's available"),
    "error.type": (str, "if the request has ended with an error"),
}

WHAT_THE_PLUGIN_PROMISES = ("gen_ai.response.id", "gen_ai.usage.input_tokens", "gen_ai.usage.output_tokens")
"""Recommended attributes the root always carries (docs/contract.md); cache reads too, from SGLang's radix
prefix match (``gen_ai.usage.cache_read.input_tokens``)."""


def stage(name: str, start: float, dur: float, process: str = "api", **attrs: Any) -> dict[str, Any]:
    return {"name": name, "process": process, "start_s": start, "dur_s": dur, "clock": "host", "attrs": attrs}


def record(rid: str, **over: Any) -> dict[str, Any]:
    rec = {
        "rid": rid,
        "model": "qwen-vl-tiny",
        "status": "ok",
        "error": None,
        "arrival_unix_s": 2000.0,
        "ttft_s": 0.1,
        "e2e_s": 0.4,
        "prompt_tokens": 30,
        "cached_tokens": 12,
        "output_tokens": 5,
        "coverage": 0.9,
        "stages": [
            stage(ROOT, 0.0, 0.1),
            stage(TOKENIZE, 0.01, 0.02),
            stage(MODEL_FORWARD, 0.05, 0.03, "scheduler", batch_size=1),
            stage(MODEL_PREFILL, 0.055, 0.02, "scheduler"),
        ],
    }
    rec.update(over)
    return rec


CHAT = HttpFacts("POST", "http", "/v1/chat/completions", "/v1/chat/completions", 200, streamed=True)
SENT: list[tuple[str, dict[str, Any], EmitContext]] = [
    ("streamed", record("r-ok"), EmitContext({}, {"api": 1, "scheduler": 2}, CHAT)),
    (
        "failed",
        record(
            "r-500",
            status="error",
            error="HTTP 500",
            ttft_s=None,
            e2e_s=0.05,
            stages=[stage(TOKENIZE, 0.01, 0.02)],
        ),
        EmitContext({}, {"api": 1}, HttpFacts("POST", "http", "/v1/chat/completions", None, 500)),
    ),
    (
        "raised",
        record("r-raised", status="error", error="ValueError", ttft_s=None, e2e_s=0.02, stages=[]),
        EmitContext({}, {"api": 1}, HttpFacts("POST", "https", "/v1/chat/completions", None, None)),
    ),
    ("engine", record("r-engine", model=""), EmitContext({}, {"api": 1, "scheduler": 2}, None)),
]


@pytest.fixture(scope="module")
def received() -> dict[str, list[Span]]:
    """label -> the spans of that record's trace, as the receiver decoded them."""
    receiver = OtlpReceiver()
    port = receiver.start_http()
    try:
        sink = OtlpSink(settings(Config(otlp_endpoint=f"http://127.0.0.1:{port}", otlp_protocol="http/protobuf")))
        for _, rec, ctx in SENT:
            sink.emit(rec, ctx)
        sink.close()  # exports what is queued
        want = sum(len(rec["stages"]) + 1 for _, rec, _ in SENT)
        deadline = time.monotonic() + 10
        while len(receiver.snapshot()) < want and time.monotonic() < deadline:
            time.sleep(0.05)
        spans = receiver.snapshot()
        assert not receiver.bad_requests, receiver.bad_requests
    finally:
        receiver.stop()
    return {label: [s for s in spans if s.trace_id == rec["trace_id"]] for label, rec, _ in SENT}


def root_of(spans: list[Span]) -> Span:
    (root,) = [s for s in spans if s.parent_span_id is None]
    return root


def convention_problems(span: Span, http: bool) -> list[str]:
    """Where ``span`` breaks the tables above (name, kind, required and conditional attributes, types)."""
    attrs = span.attrs
    problems = []
    model = attrs.get("gen_ai.request.model")
    want_name = re.sub(r"\{([^}]+)\}", lambda m: str(attrs.get(m.group(1))), GENAI_SPAN_NAME)
    if span.name != (want_name if model else attrs.get("gen_ai.operation.name")):
        problems.append(f"name {span.name!r}, conventions: {want_name!r}")
    required = {**GENAI_REQUIRED, **(HTTP_SERVER_REQUIRED if http else {})}
    for key, typ in required.items():
        if not isinstance(attrs.get(key), typ) or attrs.get(key) in ("", None):
            problems.append(f"required {key} = {attrs.get(key)!r}")
    optional = {**{k: t for k, (t, _) in GENAI_CONDITIONALLY_REQUIRED.items()}, **GENAI_RECOMMENDED}
    if http:
        optional.update({k: t for k, (t, _) in HTTP_SERVER_CONDITIONALLY_REQUIRED.items()})
    for key, value in attrs.items():
        if key.startswith(("gen_ai.", "http.", "url.", "error.")):
            if key not in required and key not in optional:
                problems.append(f"{key} is not an attribute of the conventions' span")
            elif not isinstance(value, required.get(key) or optional[key]):
                problems.append(f"{key} = {value!r}: not a {(required.get(key) or optional[key]).__name__}")
    errored = span.status_code == STATUS_ERROR
    if errored != ("error.type" in attrs):
        problems.append(f"status {span.status_code} with error.type {attrs.get('error.type')!r}")
    if http and span.kind != HTTP_SERVER_KIND:
        problems.append(f"kind {span.kind}: an HTTP server span MUST be SERVER")
    return problems


@pytest.mark.parametrize("label", [label for label, _, _ in SENT])
def test_root_span_follows_the_conventions(received, label):
    spans = received[label]
    _, rec, ctx = next(x for x in SENT if x[0] == label)
    assert spans, f"no span of {label} reached the receiver"
    root = root_of(spans)
    assert convention_problems(root, ctx.http is not None) == []
    for key in WHAT_THE_PLUGIN_PROMISES:
        assert key in root.attrs, key
    assert root.attrs["gen_ai.response.id"] == rec["rid"]
    assert root.attrs["gen_ai.provider.name"] == "sglang" and root.attrs["gen_ai.operation.name"] == "chat"
    assert "sglang.rid" not in root.attrs and not any("sglang.rid" in s.attrs for s in spans)


def test_streamed_request_over_http(received):
    root = root_of(received["streamed"])
    assert (root.name, root.kind, root.status_code) == ("chat qwen-vl-tiny", KIND_SERVER, STATUS_UNSET)
    assert {k: v for k, v in root.attrs.items() if k.startswith(("gen_ai.", "http.", "url."))} == {
        "gen_ai.operation.name": "chat",
        "gen_ai.provider.name": "sglang",
        "gen_ai.request.model": "qwen-vl-tiny",
        "gen_ai.request.stream": True,
        "gen_ai.response.id": "r-ok",
        "gen_ai.usage.input_tokens": 30,
        "gen_ai.usage.cache_read.input_tokens": 12,
        "gen_ai.usage.output_tokens": 5,
        "http.request.method": "POST",
        "http.route": "/v1/chat/completions",
        "http.response.status_code": 200,
        "url.path": "/v1/chat/completions",
        "url.scheme": "http",
    }


def test_root_covers_the_request_to_its_last_byte_and_ttft_is_its_child(received):
    """The root runs arrival -> last byte (``e2e_s``); the ``request`` stage (TTFT) is its only child and
    parents the stage tree as the catalogue does."""
    spans = received["streamed"]
    root = root_of(spans)
    by_name = {s.name: s for s in spans}
    ttft = by_name[ROOT]
    assert root.start_ns == int(2000.0 * 1e9) and abs(root.duration_s - 0.4) < 1e-6
    assert ttft.parent_span_id == root.span_id and ttft.start_ns == root.start_ns
    assert abs(ttft.duration_s - 0.1) < 1e-6 and ttft.kind == KIND_INTERNAL
    assert ttft.attrs["sglang_mmtrace.coverage"] == 0.9
    assert [s.name for s in spans if s.parent_span_id == root.span_id] == [ROOT]
    assert by_name[TOKENIZE].parent_span_id == ttft.span_id
    assert by_name[MODEL_FORWARD].parent_span_id == ttft.span_id
    assert by_name[MODEL_PREFILL].parent_span_id == by_name[MODEL_FORWARD].span_id
    assert by_name[MODEL_PREFILL].resource["sglang.process"] == "scheduler"


def test_failures_carry_error_type(received):
    """An HTTP error status: its code as text (the HTTP conventions' value); an exception before any
    response: its class; both with ERROR status. No first chunk: no ``request`` span, stages hang from
    the root."""
    failed = root_of(received["failed"])
    assert (failed.attrs["error.type"], failed.attrs["http.response.status_code"]) == ("500", 500)
    assert failed.status_code == STATUS_ERROR and "http.route" not in failed.attrs
    assert [s.name for s in received["failed"] if s.parent_span_id == failed.span_id] == [TOKENIZE]
    raised = root_of(received["raised"])
    assert raised.attrs["error.type"] == "ValueError" and "http.response.status_code" not in raised.attrs
    assert raised.attrs["url.scheme"] == "https" and raised.status_code == STATUS_ERROR


def test_offline_engine_call_is_an_internal_span_without_http(received):
    """The conventions' kind for a model in the caller's process; no model known: the operation alone."""
    root = root_of(received["engine"])
    assert (root.name, root.kind) == ("chat", KIND_INTERNAL)
    assert not any(k.startswith(("http.", "url.")) for k in root.attrs)
    assert "gen_ai.request.model" not in root.attrs
