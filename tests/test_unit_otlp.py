"""Spans built from a record: parentage from the catalogue, times from the record, GenAI attributes.

Uses the OpenTelemetry SDK's own in-memory exporter; the real OTLP wire protocol is tested against a
receiver in test_unit_genai_spans.py (with the conventions' tables) and test_server_exporters*.py.
"""

from __future__ import annotations

from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from sglang_mmtrace.config import Config
from sglang_mmtrace.join.record import EmitContext
from sglang_mmtrace.sinks.otlp import OtlpSink, settings


def _stage(name, process, start, dur, **attrs):
    return {"name": name, "process": process, "start_s": start, "dur_s": dur, "clock": "host", "attrs": attrs}


def test_record_becomes_one_trace_with_catalogue_parentage():
    exporter = InMemorySpanExporter()
    sink = OtlpSink(settings(Config(otlp_endpoint="http://unused")), exporter=exporter)
    rec = {
        "rid": "r1",
        "arrival_unix_s": 1000.0,
        "status": "ok",
        "model": "m",
        "e2e_s": 0.3,
        "prompt_tokens": 7,
        "output_tokens": 2,
        "cached_tokens": 0,
        "coverage": 1.0,
        "ttft_s": 0.1,
        "stages": [
            _stage("request", "api", 0.0, 0.1),
            _stage("tokenize", "api", 0.01, 0.02),
            _stage("mm.process", "api", 0.012, 0.01),
            _stage("mm.decode", "api", 0.013, 0.004, width=512, height=512),
            _stage("model.forward", "scheduler", 0.05, 0.02, batch_size=1),
            _stage("model.vision_encoder", "scheduler", 0.051, 0.01, embedding_cache="miss"),
        ],
    }
    traceparent = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"
    sink.emit(rec, EmitContext({"traceparent": traceparent}, {"api": 11, "scheduler": 22}))
    sink.processor.force_flush()
    spans = {s.name: s for s in exporter.get_finished_spans()}
    assert set(spans) == {"chat m"} | {s["name"] for s in rec["stages"]}
    root, ttft = spans["chat m"], spans["request"]
    assert format(root.context.trace_id, "032x") == rec["trace_id"] == "0af7651916cd43dd8448eb211c80319c"
    assert root.parent.span_id == int("b7ad6b7169203331", 16)
    assert root.attributes["gen_ai.operation.name"] == "chat" and root.attributes["gen_ai.usage.input_tokens"] == 7
    assert root.attributes["gen_ai.response.id"] == "r1"
    assert (root.end_time - root.start_time, ttft.end_time - ttft.start_time) == (300_000_000, 100_000_000)
    parent_of = {name: s.parent.span_id for name, s in spans.items() if name != "chat m"}
    assert parent_of["request"] == root.context.span_id
    assert parent_of["tokenize"] == ttft.context.span_id
    assert parent_of["mm.process"] == spans["tokenize"].context.span_id
    assert parent_of["mm.decode"] == spans["mm.process"].context.span_id
    assert parent_of["model.vision_encoder"] == spans["model.forward"].context.span_id
    vit = spans["model.vision_encoder"]
    assert vit.resource.attributes["sglang.process"] == "scheduler" and vit.resource.attributes["process.pid"] == 22
    assert (vit.end_time - vit.start_time) == 10_000_000
    assert vit.start_time == int(1000.051 * 1e9) or abs(vit.start_time - int(1000.051 * 1e9)) < 1000
    assert spans["mm.decode"].attributes["sglang_mmtrace.width"] == 512
