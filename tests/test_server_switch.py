"""The runtime switch on the real CPU server: ``POST /mmtrace/enabled`` in every process.

Off: every hook is taken out (SGLang's own functions back in place) in the API process, the scheduler
and the detokenizer, and the
collector process exports nothing (each confirms before the answer), requests get no record, and
``/mmtrace/state`` shows the setting per process. Back on: records again, complete. A request whose lifetime crosses a flip gets no record
and is counted as discarded, not as dropped data.
"""

from __future__ import annotations

import http.client
import json
import threading
import time

import pytest
from conftest import read_records, records, server_context, state
from reliability import chat_body, flip, post, send_image_requests, settled_state, sse_usage

from sglang_mmtrace import switch
from sglang_mmtrace.harness import data_url, image_message, make_image

pytestmark = pytest.mark.server

PROCESSES = {"api", "collector", "scheduler", "detokenizer"}


def kinds(answer: dict) -> set[str]:
    return {key.split(":")[0] for key in answer["processes"]}


def test_off_then_on_in_every_process(server):
    port = server.port
    before = send_image_requests(port, "sw-before", 1, seed=9100, size=64, question="What is it?")
    records(server, before)

    status, answer = flip(port, {"on": False})
    assert status == 200, answer
    gen_off = answer["generation"]
    assert answer["on"] is False and answer["parts"] == []
    assert kinds(answer) == PROCESSES, answer
    for key, proc in answer["processes"].items():
        placed, applied = proc.pop("hooks")
        assert proc == {"on": False, "parts": [], "generation": gen_off}, key
        # off, SGLang's own functions are back in place (the collector process hooks nothing)
        assert placed == 0 and (applied > 0) == (not key.startswith("collector")), (key, placed, applied)
    st = state(server)
    assert st["api"]["switch"]["on"] is False
    assert {p["switch"]["generation"] for p in st["peers"].values()} == {gen_off}, st

    off = send_image_requests(port, "sw-off", 2, seed=9200, size=64, question="What is it?")
    status, raw = post(port, chat_body(f"sw-off-text-{time.time_ns()}", "Name a colour."))
    assert status == 200 and sse_usage(raw)

    status, answer = flip(port, {"on": True})
    assert status == 200, answer
    assert answer["generation"] == gen_off + 1 and answer["parts"] == list(switch.PARTS)
    assert kinds(answer) == PROCESSES
    for key, proc in answer["processes"].items():
        placed, applied = proc["hooks"]
        assert placed == applied and (applied > 0) == (not key.startswith("collector")), (key, placed, applied)
    after = send_image_requests(port, "sw-after", 2, seed=9300, size=64, question="What is it?")
    recs = records(server, after)
    for rec in recs.values():
        names = {s["name"] for s in rec["stages"]}
        assert {"request", "mm.process", "scheduler.recv", "model.vision_encoder", "detokenize"} <= names, names
        assert rec["coverage"] >= 0.95, rec["coverage"]
    written = {r["rid"] for r in read_records(server.jsonl_path)}
    assert not written & set(off), "a request served while the switch was off has a record" + server_context(server)
    st = settled_state(server)
    assert st["api"]["dropped"] == {} and all(not p["dropped"] for p in st["peers"].values()), st


def test_request_across_a_flip_gets_no_record(server):
    port = server.port
    rid = f"sw-across-{time.time_ns()}"
    discarded = state(server)["api"]["switch_discarded"]
    image = data_url(make_image(64, 64, seed=9400))
    body = chat_body(rid, messages=[image_message("Describe it at length.", [image])], max_tokens=48)
    first_chunk = threading.Event()
    result: dict[str, object] = {}

    def send() -> None:
        conn = http.client.HTTPConnection("127.0.0.1", port, timeout=300)
        try:
            conn.request(
                "POST",
                "/v1/chat/completions",
                body=json.dumps(body).encode(),
                headers={"Content-Type": "application/json"},
            )
            resp = conn.getresponse()
            result["status"] = resp.status
            resp.readline()  # the first SSE line: the request is in flight
            first_chunk.set()
            result["rest"] = resp.read()
        finally:
            first_chunk.set()
            conn.close()

    t = threading.Thread(target=send)
    t.start()
    assert first_chunk.wait(300)
    assert flip(port, {"on": False})[0] == 200
    assert flip(port, {"on": True})[0] == 200
    t.join(300)
    assert result.get("status") == 200
    probe = send_image_requests(port, "sw-probe", 1, seed=9500, size=64, question="What is it?")
    records(server, probe)  # later requests are recorded again
    assert rid not in {r["rid"] for r in read_records(server.jsonl_path)}, "a request that crossed a flip has a record"
    st = settled_state(server)
    assert st["api"]["switch_discarded"] >= discarded + 1, st["api"]
    assert "orphan_events" not in st["api"]["dropped"], st["api"]


def test_bad_bodies_are_refused_and_change_nothing(server):
    gen = state(server)["api"]["switch"]["generation"]
    for body in (b"not json", {"on": "yes"}, {"on": True, "parts": ["gpu"]}, [True]):
        status, answer = flip(server.port, body)
        assert status == 400, (body, answer)
        assert answer["parts"] == list(switch.PARTS)
    st = state(server)["api"]["switch"]
    assert st["generation"] == gen and st["on"] is True


def test_parts_subset_applies_everywhere(server):
    port = server.port
    parts = ["http", "tokenizer", "mm"]
    status, answer = flip(port, {"on": True, "parts": parts})
    try:
        assert status == 200 and answer["parts"] == parts
        assert all(p["parts"] == parts for p in answer["processes"].values()), answer
        hooks = {key.split(":")[0]: p["hooks"] for key, p in answer["processes"].items()}
        assert 0 < hooks["api"][0] == hooks["api"][1], hooks  # every API hook is of these parts
        assert hooks["scheduler"][0] == hooks["detokenizer"][0] == 0 < hooks["scheduler"][1], hooks
        rids = send_image_requests(port, "sw-parts", 1, seed=9600, size=64, question="What is it?")
        time.sleep(1.0)
        # ship and records are off: the API side measured, nothing was recorded
        assert not set(rids) & {r["rid"] for r in read_records(server.jsonl_path)}
    finally:
        assert flip(port, {"on": True})[0] == 200


def _windows_state(server, want_open: bool, timeout: float = 30.0) -> dict:
    """``/mmtrace/state``'s ``api.windows`` once its window is open (or closed) and every process has
    applied that edge's flip."""
    deadline = time.monotonic() + timeout
    while True:
        st = state(server)
        w = st["api"]["windows"]
        gen = st["api"]["switch"]["generation"]
        if w["open"] is want_open and all(p["switch"]["generation"] == gen for p in st["peers"].values()):
            return st
        assert time.monotonic() < deadline, f"no {'open' if want_open else 'closed'} window: {w}"
        time.sleep(0.05)


def test_tracing_windows_record_inside_only_and_a_user_flip_takes_over(server):
    """``{"windows": "4s/8s"}``: requests served in a window get records with ``window``; requests
    between windows get none; ``{"on": true}`` stops the windows and leaves tracing on."""
    port = server.port
    status, answer = flip(port, {"windows": "4s/8s"})
    try:
        assert status == 200, answer
        assert answer["windows"]["schedule"] == "4s/8s" and answer["windows"]["running"] is True
        st = _windows_state(server, want_open=False)
        assert st["api"]["switch"]["on"] is False and st["api"]["windows"]["next_open_unix_s"] > time.time()
        outside = f"win-out-{time.time_ns()}"
        status, raw = post(port, chat_body(outside, "Name a colour."))
        assert status == 200 and sse_usage(raw)
        inside = None
        for attempt in range(3):  # a request that crosses the window's end gets no record: try the next window
            before = _windows_state(server, want_open=True)["api"]["switch"]["generation"]
            rid = f"win-in-{attempt}-{time.time_ns()}"
            status, raw = post(port, chat_body(rid, "Name a colour."))
            assert status == 200 and sse_usage(raw)
            if state(server)["api"]["switch"]["generation"] == before:
                inside = rid
                break
        assert inside is not None, "no request fitted in a 4 s window"
        rec = records(server, [inside])[inside]
        assert rec["window"] == {"window_s": 4.0, "period_s": 8.0}
        assert rec["status"] == "ok" and rec["coverage"] >= 0.95
        written = {r["rid"] for r in read_records(server.jsonl_path)}
        assert outside not in written, "a request served between windows has a record" + server_context(server)
    finally:
        status, answer = flip(port, {"on": True})
    assert status == 200 and answer["on"] is True and answer["parts"] == list(switch.PARTS)
    st = state(server)
    assert st["api"]["windows"]["running"] is False and st["api"]["windows"]["open"] is False
    assert st["api"]["switch"]["on"] is True
