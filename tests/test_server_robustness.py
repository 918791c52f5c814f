"""300 requests against the real server: client disconnects, malformed images, normal traffic.

Part of the load runs on several client threads, so SGLang batches requests together. Every
request carries its own ``rid`` (an SGLang extension of the OpenAI body) so its record can be found
even when the client never sees a response id. Afterwards the plugin must be back to rest (nothing
live, nothing waiting, no errors, no queued events) and the server must still serve correctly.
"""

from __future__ import annotations

import base64
import json
import random
import socket
from collections import Counter
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any

import pytest
from conftest import records, server_context
from record_checks import (
    Exchange,
    Img,
    bounds_problems,
    catalogue_problems,
    exchange_problems,
    order_problems,
    pretty,
    stage_set_problems,
    usage_problems,
)
from reliability import chat_body, post, settled_state, sse_usage

from sglang_mmtrace.config import Config
from sglang_mmtrace.harness import data_url, image_message, make_image, stream_chat

pytestmark = pytest.mark.server

TOTAL = 300
SEQUENTIAL = 60  # the rest runs on THREADS client threads
THREADS = 4
CANARY = "zqxcanary"  # in every prompt: must never reach a record (SGLANG_MMTRACE_CAPTURE_CONTENT is off)
KINDS = {
    # kind: share of the load
    "image_new": 55,
    "image_repeat": 55,
    "text": 70,
    "disconnect_headers": 25,
    "disconnect_data": 35,
    "bad_base64": 30,
    "truncated_png": 30,
}
EXPECTED_STATUS = {
    "image_new": "ok",
    "image_repeat": "ok",
    "text": "ok",
    "disconnect_headers": "aborted",
    "disconnect_data": "aborted",
    "bad_base64": "error",
    "truncated_png": "error",
}
REPEATED = [make_image(64, 64, seed=9100 + k) for k in range(3)]


@dataclass
class Sent:
    kind: str
    rid: str
    body: dict[str, Any]
    secret: list[str] = field(default_factory=list)  # substrings that must never show up in the record
    status: int | None = None
    raw: bytes = b""
    usage: dict[str, Any] | None = None


def _plan(n: int) -> list[Sent]:
    assert sum(KINDS.values()) == n
    kinds = [k for k, count in KINDS.items() for _ in range(count)]
    random.Random(20261129).shuffle(kinds)
    plan = []
    for i, kind in enumerate(kinds):
        rid = f"robust-{i:03d}-{kind}"
        question = f"{CANARY}{i} what is shown?"
        secret = [f"{CANARY}{i}"]
        if kind == "image_new":
            url = data_url(make_image(64, 64, seed=9200 + i))
            body = chat_body(rid, messages=[image_message(question, [url])])
            secret.append(url[40:80])
        elif kind == "image_repeat":
            body = chat_body(rid, messages=[image_message(question, [data_url(REPEATED[i % len(REPEATED)])])])
        elif kind == "text":
            body = chat_body(rid, messages=[{"role": "user", "content": question}])
        elif kind.startswith("disconnect"):
            # long, EOS ignored: the stream is still running when the client goes away
            url = data_url(make_image(64, 64, seed=9600 + i))
            messages = [image_message(question, [url])] if i % 2 else [{"role": "user", "content": question}]
            body = chat_body(rid, messages=messages, max_tokens=512, ignore_eos=True)
        elif kind == "bad_base64":
            payload = f"!!{CANARY}-not-base64-{i}@@" + "A" * 40
            body = chat_body(rid, messages=[image_message(question, [f"data:image/png;base64,{payload}"])])
            secret.append(payload[:24])
        else:  # truncated_png
            png = make_image(96, 96, seed=9400 + i)
            b64 = base64.b64encode(png[: len(png) // 2]).decode()
            body = chat_body(rid, messages=[image_message(question, [f"data:image/png;base64,{b64}"])])
            secret += [b64[:32], b64[len(b64) // 2 : len(b64) // 2 + 32]]
        plan.append(Sent(kind, rid, body, secret))
    return plan


def _disconnect(port: int, body: dict[str, Any], until: bytes) -> bytes:
    """Raw socket: send the request, read until ``until`` shows up in the response, then close."""
    payload = json.dumps(body).encode()
    head = (
        f"POST /v1/chat/completions HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\n"
        f"Content-Type: application/json\r\nContent-Length: {len(payload)}\r\n\r\n"
    ).encode()
    buf = b""
    with socket.create_connection(("127.0.0.1", port), timeout=300) as sock:
        sock.sendall(head + payload)
        while until not in buf:
            data = sock.recv(4096)
            if not data:
                break
            buf += data
    return buf


def _send(port: int, sent: Sent) -> Sent:
    if sent.kind == "disconnect_headers":
        sent.raw = _disconnect(port, sent.body, b"HTTP/1.1 ")  # the first bytes of the response
    elif sent.kind == "disconnect_data":
        sent.raw = _disconnect(port, sent.body, b"data:")  # the first bytes of the first chunk
    else:
        sent.status, sent.raw = post(port, sent.body)
        if sent.status == 200:
            sent.usage = sse_usage(sent.raw)
    return sent


@pytest.fixture(scope="module")
def load(server) -> dict[str, Any]:
    plan = _plan(TOTAL)
    for sent in plan[:SEQUENTIAL]:
        _send(server.port, sent)
    with ThreadPoolExecutor(max_workers=THREADS) as pool:
        list(pool.map(lambda s: _send(server.port, s), plan[SEQUENTIAL:]))
    recs = records(server, [s.rid for s in plan], timeout=60)
    # The collector waits up to grace_s for late stages of a finished request; allow that and a few seconds.
    settled = settled_state(server, limit_s=Config.from_env().grace_s + 8.0)
    return {"plan": plan, "records": recs, "state": settled}


def test_http_outcomes(load, server):
    """Malformed images are rejected with HTTP 400; normal requests stream a complete 200 with usage."""
    bad = []
    for sent in load["plan"]:
        if sent.kind in ("bad_base64", "truncated_png"):
            if sent.status != 400:
                bad.append((sent.rid, sent.status, sent.raw[:200]))
        elif sent.kind in ("image_new", "image_repeat", "text"):
            if sent.status != 200 or sent.usage is None or not sent.raw.rstrip().endswith(b"data: [DONE]"):
                bad.append((sent.rid, sent.status, sent.raw[-200:]))
        elif not sent.raw.startswith(b"HTTP/1.1 200"):
            bad.append((sent.rid, "disconnect got", sent.raw[:200]))
    assert not bad, f"{len(bad)} unexpected HTTP outcomes: {bad[:5]}" + server_context(server)


def test_every_request_has_one_record_with_its_status(load):
    """One record per request (records() fails on duplicates); disconnects 'aborted', malformed 'error', rest 'ok'."""
    wrong = [
        (s.rid, load["records"][s.rid]["status"], load["records"][s.rid]["error"])
        for s in load["plan"]
        if load["records"][s.rid]["status"] != EXPECTED_STATUS[s.kind]
    ]
    assert not wrong, f"{len(wrong)} records with the wrong status (rid, status, error): {wrong[:10]}"
    for s in load["plan"]:
        rec = load["records"][s.rid]
        if EXPECTED_STATUS[s.kind] == "ok":
            assert rec["error"] is None and rec["ttft_s"] is not None, pretty(rec)
        else:
            assert isinstance(rec["error"], str) and rec["error"], pretty(rec)
        if s.kind in ("bad_base64", "truncated_png"):
            assert rec["ttft_s"] is None, pretty(rec)


def test_records_keep_prompts_and_image_data_private(load):
    """No prompt text and no base64 image data in any record (error messages included)."""
    leaks = []
    for s in load["plan"]:
        text = json.dumps(load["records"][s.rid])
        leaks += [(s.rid, secret) for secret in s.secret if secret in text]
        if CANARY in text:
            leaks.append((s.rid, CANARY))
    assert not leaks, f"content leaked into records: {leaks[:10]}"


def test_successful_records_match_usage(load):
    problems = []
    for s in load["plan"]:
        if EXPECTED_STATUS[s.kind] == "ok" and s.usage is not None:
            rec = load["records"][s.rid]
            problems += [f"{s.rid}: {p}" for p in usage_problems(rec, s.usage)]
            want_images = 0 if s.kind == "text" else 1
            if len(rec["images"]) != want_images:
                problems.append(f"{s.rid}: {len(rec['images'])} images in the record, sent {want_images}")
    assert not problems, "\n".join(problems[:20])


def test_concurrent_requests_were_batched(load):
    """The threaded part of the load really shared prefill batches (else the test below proves less)."""
    sizes = [
        s["attrs"]["batch_size"]
        for rid, rec in load["records"].items()
        for s in rec["stages"]
        if s["name"] == "model.forward" and rec["status"] == "ok"
    ]
    assert sizes and max(sizes) > 1, f"no prefill batch held more than one request: {Counter(sizes)}"


def test_records_under_load_keep_causal_order(load):
    """Batched, concurrent requests: every successful record still nests and orders its stages causally."""
    problems = []
    for s in load["plan"]:
        if EXPECTED_STATUS[s.kind] == "ok":
            rec = load["records"][s.rid]
            if found := order_problems(rec) + catalogue_problems(rec):
                problems.append(f"{s.rid}: {found}\n{pretty(rec)}")
    assert not problems, f"{len(problems)} records out of causal order; first ones:\n" + "\n\n".join(problems[:3])


def test_records_under_load_stay_inside_ttft(load):
    """Every stage of every successful record lies inside [0, ttft_s] (the same check as the
    records module, over ~200 records: a stage that can outlast the first chunk shows up here)."""
    problems = []
    for s in load["plan"]:
        if EXPECTED_STATUS[s.kind] == "ok":
            rec = load["records"][s.rid]
            if found := bounds_problems(rec):
                problems.append(f"{s.rid}: {found}")
    ok = sum(1 for s in load["plan"] if EXPECTED_STATUS[s.kind] == "ok")
    assert not problems, f"{len(problems)} of {ok} records have stages outside [0, ttft_s]:\n" + "\n".join(
        problems[:10]
    )


def test_plugin_state_settles_clean(load, server):
    """After the load and the collector's grace: nothing live/finishing/pending, no errors, no drops,
    no queued events in the scheduler and detokenizer peers."""
    st = load["state"]
    api = st["api"]
    msg = json.dumps(st, indent=1) + server_context(server)
    assert (api["live_requests"], api["finishing"], api["remote_pending"]) == (0, 0, 0), msg
    assert api["errors"] == {} and api["dropped"] == {}, msg
    assert api["records"] >= TOTAL, msg
    roles = sorted({key.split(":", 1)[0] for key in st["peers"]})
    assert roles == ["detokenizer", "scheduler"], msg
    for key, peer in st["peers"].items():
        assert peer["errors"] == {} and peer["dropped"] == {} and peer["queued_events"] == 0, f"{key}: {msg}"


def test_server_still_serves_a_normal_image_request(load, server):
    image = Img(512, 512, "PNG", make_image(512, 512, seed=9999))
    messages = [image_message("What is in this image?", [data_url(image.data)])]
    chunks, usage, raw = stream_chat(server.base_url, messages, max_tokens=4)
    ex = Exchange("after load", messages, [image], chunks[0]["id"], usage or {}, raw)
    ex.record = records(server, [ex.rid])[ex.rid]
    problems = exchange_problems(ex, str(server.model_path)) + stage_set_problems(ex.record, absent=())
    problems += catalogue_problems(ex.record)
    if ex.record["coverage"] < 0.95:
        problems.append(f"coverage {ex.record['coverage']} < 0.95")
    assert not problems, "\n".join(problems) + "\n" + ex.describe()
