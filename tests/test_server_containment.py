"""Containment: with every hook's plugin code raising, SGLang's answers are unchanged.

A second real server runs with ``SGLANG_MMTRACE_TEST_RAISE=all`` (the plugin's own code raises
inside every hook). The same requests go to it and to the session server (plugin on, not raising):
same tiny model from the same seed, greedy, both radix caches flushed first and the same request
sequence on both, so SGLang must answer with the very same bytes. Only the per-request ``id`` and
``created`` fields may differ. The raising server must count the contained failures per component,
in the API process and in its scheduler and detokenizer.

Streamed bodies are compared with ``max_tokens=1``: SGLang's TokenizerManager coalesces decode
outputs that queued up before the stream consumer woke (``_coalesce_streaming_chunks``), so with
more tokens the *chunking* of the same tokens depends on timing, even between two plain servers.
One output is one fixed set of events. The longer answers (8 tokens) are compared non-streamed.
"""

from __future__ import annotations

import http.client
import json
import re
import time
from typing import Any

import pytest
from conftest import server_context, start_server, state

from sglang_mmtrace.harness import CpuServer, chat_request, data_url, image_message, make_image, stream_chat
from sglang_mmtrace.manifest import load as load_manifest
from sglang_mmtrace.package import sglang_version

pytestmark = pytest.mark.server

MASKED = ("id", "created")
_DATA = re.compile(rb"^data: ?(.*)$")
MASK = re.compile(rb'"id":"[^"]*"|"created":\d+')
JSON = {"Content-Type": "application/json"}


@pytest.fixture(scope="module")
def raising_server(tmp_path_factory):
    with start_server(tmp_path_factory, "mmtrace-raising", env={"SGLANG_MMTRACE_TEST_RAISE": "all"}) as srv:
        yield srv


def _requests() -> list[tuple[str, list[dict[str, Any]]]]:
    x = data_url(make_image(512, 512, seed=8101))
    y, z = data_url(make_image(256, 256, seed=8102)), data_url(make_image(256, 256, seed=8103))
    jpeg = data_url(make_image(512, 512, seed=8104, fmt="JPEG"), "JPEG")
    q = "Containment check: what is in this image?"
    return [
        ("new image", [image_message(q, [x])]),
        ("same image again", [image_message(q, [x])]),
        ("image, other question", [image_message("Containment check: which colour dominates?", [x])]),
        ("question first", [image_message("Containment check, question first:", [x], image_first=False)]),
        ("text only", [{"role": "user", "content": "Containment check: say something about the sea."}]),
        ("two images", [image_message(q, [y, z])]),
        ("jpeg", [image_message(q, [jpeg])]),
    ]


def _flush(srv: CpuServer) -> None:
    """Empty the radix cache (SGLang's /flush_cache; refused while requests are still running)."""
    deadline = time.monotonic() + 30
    while True:
        conn = http.client.HTTPConnection("127.0.0.1", srv.port, timeout=30)
        try:
            conn.request("POST", "/flush_cache")
            resp = conn.getresponse()
            resp.read()
        finally:
            conn.close()
        if resp.status == 200:
            return
        assert time.monotonic() < deadline, f"/flush_cache kept answering {resp.status}" + server_context(srv)
        time.sleep(0.5)


def _events(raw: bytes) -> tuple[list[bytes], list[Any]]:
    """SSE body -> (framing, payloads): framing is every event with each data payload replaced by a
    placeholder (so separators, prefixes and event count are compared byte for byte); payloads are
    the parsed JSON objects without the masked keys, or the literal ``[DONE]``."""
    framing, payloads = [], []
    for event in raw.split(b"\n\n"):
        lines = []
        for line in event.split(b"\n"):
            m = _DATA.match(line)
            if m is None:
                lines.append(line)
                continue
            data = m.group(1)
            lines.append(line[: len(line) - len(data)] + b"<payload>")
            if data.strip() == b"[DONE]":
                payloads.append("[DONE]")
            else:
                obj = json.loads(data)
                for key in MASKED:
                    obj.pop(key, None)
                payloads.append(obj)
        framing.append(b"\n".join(lines))
    return framing, payloads


def _chat(srv: CpuServer, messages: list[dict[str, Any]], stream: bool, max_tokens: int) -> bytes:
    body = chat_request(messages, max_tokens, stream=stream)
    conn = http.client.HTTPConnection("127.0.0.1", srv.port, timeout=300)
    try:
        conn.request("POST", "/v1/chat/completions", body=json.dumps(body).encode(), headers=JSON)
        resp = conn.getresponse()
        raw = resp.read()
    finally:
        conn.close()
    assert resp.status == 200, f"HTTP {resp.status}: {raw[:500]!r}" + server_context(srv)
    return raw


@pytest.fixture(scope="module")
def compared(server, raising_server) -> list[tuple[str, bytes, bytes, bytes, bytes]]:
    """(label, plain SSE, raising SSE, plain JSON, raising JSON) per request, same order on both servers."""
    _flush(server)
    _flush(raising_server)
    out = []
    for label, messages in _requests():
        sse = [_chat(srv, messages, stream=True, max_tokens=1) for srv in (server, raising_server)]
        full = [_chat(srv, messages, stream=False, max_tokens=8) for srv in (server, raising_server)]
        out.append((label, *sse, *full))
    return out


def test_streamed_responses_identical_with_every_hook_raising(compared):
    for label, plain, raising, _, _ in compared:
        f_plain, p_plain = _events(plain)
        f_raising, p_raising = _events(raising)
        assert p_plain[-1] == "[DONE]" and any(isinstance(p, dict) and p.get("usage") for p in p_plain), label
        assert f_raising == f_plain, f"{label}: SSE framing differs\n{plain!r}\n{raising!r}"
        assert p_raising == p_plain, f"{label}: SSE payloads differ (id/created masked)\n{plain!r}\n{raising!r}"


def test_streamed_bytes_differ_only_in_id_and_created(compared):
    """The same, byte for byte: blank out only the id and created values and compare the raw bodies."""
    for label, plain, raising, _, _ in compared:
        assert MASK.sub(b"", plain) == MASK.sub(b"", raising), f"{label}\n{plain!r}\n{raising!r}"


def test_full_answers_identical_with_every_hook_raising(compared):
    """8 greedy tokens, non-streamed: same text, same usage (cached tokens included), same bytes."""
    for label, _, _, plain, raising in compared:
        a, b = json.loads(plain), json.loads(raising)
        assert a["usage"]["completion_tokens"] == 8, plain
        assert {k: v for k, v in a.items() if k not in MASKED} == {k: v for k, v in b.items() if k not in MASKED}, label
        assert MASK.sub(b"", plain) == MASK.sub(b"", raising), f"{label}\n{plain!r}\n{raising!r}"


def _components(errors: dict[str, int]) -> set[str]:
    return {k for k, v in errors.items() if v > 0}


def test_raising_server_counts_contained_errors_per_component(compared, raising_server):
    st = state(raising_server)
    msg = json.dumps(st, indent=1) + server_context(raising_server)
    manifest = load_manifest(sglang_version() or "unknown")
    hooks = {proc: {e.hook_id for e in manifest.for_process(proc)} for proc in ("api", "scheduler", "detokenizer")}

    api = _components(st["api"]["errors"])
    assert len(api & hooks["api"]) >= 3, f"api: hook components with errors {sorted(api)}\n{msg}"
    roles = {}
    for key, peer in st["peers"].items():
        roles.setdefault(key.split(":", 1)[0], []).append(_components(peer["errors"]))
    assert sorted(roles) == ["detokenizer", "scheduler"], msg
    for comps in roles["scheduler"]:
        assert len(comps & hooks["scheduler"]) >= 3, f"scheduler: {sorted(comps)}\n{msg}"
    for comps in roles["detokenizer"]:
        # the detokenizer has a single hook: it must be the one counting
        assert hooks["detokenizer"] <= comps, f"detokenizer: {sorted(comps)}\n{msg}"
    # hooks on every request's path raised at least once per request, and every raise was counted
    n_image = sum(1 for _, messages in _requests() if not isinstance(messages[0]["content"], str))
    for comp, n in (
        ("tokenizer_manager.tokenize", len(compared)),
        ("tokenizer_manager.init_req_state", len(compared)),
        ("mm_processor.load", n_image),  # the demo configuration: the artifact path
    ):
        assert st["api"]["errors"].get(comp, 0) >= n, f"{comp}: expected >= {n}\n{msg}"


def test_session_server_counts_no_errors(compared, server):
    """Control: the same requests on the non-raising server leave no contained errors."""
    st = state(server)
    assert st["api"]["errors"] == {}, json.dumps(st, indent=1)
    assert all(p["errors"] == {} for p in st["peers"].values()), json.dumps(st, indent=1)


def test_raising_server_still_serves(raising_server):
    """Health and a fresh image request after all that: still 200 with a complete stream."""
    conn = http.client.HTTPConnection("127.0.0.1", raising_server.port, timeout=30)
    try:
        conn.request("GET", "/health")
        resp = conn.getresponse()
        resp.read()
    finally:
        conn.close()
    assert resp.status == 200
    chunks, usage, raw = stream_chat(
        raising_server.base_url, [image_message("Still there?", [data_url(make_image(256, 256, seed=8105))])]
    )
    assert usage and usage["prompt_tokens_details"]["image_tokens"] > 0 and raw.rstrip().endswith(b"data: [DONE]")
