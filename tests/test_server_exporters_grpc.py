"""OTLP over gRPC against an in-test ``TraceService/Export`` receiver (grpcio), on the real SGLang
server (CPU); then the receiver goes away and the plugin must drop, count, and keep serving.

A module of its own so that its server (B) starts only after the http/protobuf and Prometheus
module has stopped server A: two servers at once (~6.5 GB each) have been OOM-killed on the
23 GB CPU machines.
"""

from __future__ import annotations

import time

import pytest
from conftest import server_context, start_server, state
from peers.otlp_receiver import OtlpReceiver
from test_server_exporters import (
    PREFIX,
    QUESTION,
    TEXT,
    describe_spans,
    get_text,
    image,
    metric_samples,
    peer_pids,
    send_plan,
    span_problems,
    wait_spans,
)

from sglang_mmtrace.harness import image_message

pytestmark = pytest.mark.server


@pytest.fixture(scope="module")
def grpc_receiver():
    receiver = OtlpReceiver()
    receiver.start_grpc()
    try:
        yield receiver
    finally:
        receiver.stop()


@pytest.fixture(scope="module")
def server_b(tmp_path_factory, grpc_receiver):
    env = {
        "SGLANG_MMTRACE_OTLP_ENDPOINT": f"http://127.0.0.1:{grpc_receiver.grpc_port}",
        "SGLANG_MMTRACE_OTLP_PROTOCOL": "grpc",
    }
    with start_server(tmp_path_factory, "exporters-b", env=env) as srv:
        yield srv


def test_otlp_grpc_export_then_receiver_gone(server_b, grpc_receiver):
    """gRPC export delivers the same trace; with the receiver stopped requests still succeed, records
    are still written, and every span of those requests is counted as dropped (state and /metrics)."""
    before = send_plan(server_b, [("grpc_image", [image_message(QUESTION, [image(8201)])], None, 1)])
    rec = before["grpc_image"].record
    spans = wait_spans(grpc_receiver, rec, server_b)
    problems = span_problems(rec, spans, peer_pids(server_b), server_b.process.pid)
    assert not problems, "\n".join(problems) + f"\n{describe_spans(spans)}"
    assert {s.transport for s in spans} == {"grpc"}

    dropped_before = state(server_b)["api"]["dropped"].get("otlp", 0)
    received_before = len(grpc_receiver.snapshot())
    grpc_receiver.stop_grpc()

    after = send_plan(
        server_b,
        [
            ("gone_new_image", [image_message(QUESTION, [image(8202)])], None, 1),
            ("gone_same_image", [image_message(QUESTION, [image(8202)])], None, 1),
            ("gone_text", [{"role": "user", "content": TEXT}], None, 0),
        ],
    )
    for ex in after.values():  # send_plan asserted HTTP 200 and an ok record for each
        assert ex.record["ttft_s"] and ex.record["trace_id"], ex.record
    # a request's spans: the root (``chat {model}``) and one per stage
    expected = dropped_before + sum(len(ex.record["stages"]) + 1 for ex in after.values())

    deadline = time.monotonic() + 120
    while True:
        dropped = state(server_b)["api"]["dropped"].get("otlp", 0)
        if dropped >= expected or time.monotonic() > deadline:
            break
        time.sleep(0.5)
    assert dropped == expected, (
        f"dropped.otlp = {dropped}, expected {expected} (every span of the {len(after)} requests sent "
        f"while the receiver was down)" + server_context(server_b)
    )
    assert len(grpc_receiver.snapshot()) == received_before

    deadline = time.monotonic() + 60
    while True:
        samples = metric_samples(get_text(server_b, "/metrics"), PREFIX + "dropped_total")
        value = sum(v for labels, v in samples if labels.get("sink") == "otlp")
        if value >= dropped or time.monotonic() > deadline:
            break
        time.sleep(0.5)
    assert value == dropped, f'sglang_mmtrace_dropped_total{{sink="otlp"}} = {value}, state says {dropped}: {samples}'
    # the server still serves after the drops
    again = send_plan(server_b, [("still_alive", [{"role": "user", "content": TEXT + " Again."}], None, 0)])
    assert again["still_alive"].record["status"] == "ok"
