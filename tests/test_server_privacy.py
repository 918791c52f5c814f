"""Privacy: prompts, image URLs and image bytes stay in the process unless the operator opts in.

Two real servers, each exporting OTLP to its own in-test receiver (``peers/otlp_receiver.py``) and
writing JSONL: default settings, and ``SGLANG_MMTRACE_CAPTURE_CONTENT=1``. The same requests go to
both: a prompt with a unique marker and an image fetched from a known URL (a local http.server),
the marker with an inline ``data:`` image whose base64 text is known, and the marker alone.

Default: the marker, the URL and the base64 text appear in no span (names, attributes, resources),
no JSONL record, no ``/metrics`` line, and no line the plugin logs (lines marked ``sglang-mmtrace:``;
SGLang's own request logging is SGLang's). Opted in: the record's ``content`` and the root span's
``sglang_mmtrace.content.*`` attributes carry the prompt and the image URLs, with ``data:`` URLs cut to
their media type and size (documented: the image bytes never leave, even opted in).
"""

from __future__ import annotations

import base64
import contextlib
import json
import time
import uuid
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import pytest
from conftest import records, server_context, start_server
from peers.otlp_receiver import OtlpReceiver
from reliability import ImageHost, chat_body, get, plugin_lines, post, sse_usage

from sglang_mmtrace.harness import data_url, make_image

pytestmark = pytest.mark.server

MARKER = "zqxprivacy" + uuid.uuid4().hex[:12]
URL_PNG = make_image(128, 128, seed=7601)
INLINE_PNG = make_image(128, 128, seed=7602)
INLINE_B64 = base64.b64encode(INLINE_PNG).decode()
URL_PATH = f"/img/privacy-{uuid.uuid4().hex[:12]}.png"


def _secrets(host: ImageHost) -> dict[str, str]:
    """What must not leak: the marker, the URL's unique path, base64 text of both images (two places each)."""
    url_b64 = base64.b64encode(URL_PNG).decode()
    return {
        "marker": MARKER,
        "url": URL_PATH.removeprefix("/img/"),
        "inline base64 (start)": INLINE_B64[24:64],
        "inline base64 (middle)": INLINE_B64[len(INLINE_B64) // 2 : len(INLINE_B64) // 2 + 40],
        "URL image base64": url_b64[len(url_b64) // 2 : len(url_b64) // 2 + 40],
    }


@pytest.fixture(scope="module")
def host():
    h = ImageHost()
    h.files[URL_PATH.removeprefix("/img/")] = URL_PNG
    yield h
    h.close()


@pytest.fixture(scope="module")
def receivers():
    pair = {"default": OtlpReceiver(), "capture": OtlpReceiver()}
    for r in pair.values():
        r.start_http()
    yield pair
    for r in pair.values():
        r.stop()


@pytest.fixture(scope="module")
def servers(tmp_path_factory, receivers):
    def env(name: str) -> dict[str, str]:
        out = {"SGLANG_MMTRACE_OTLP_ENDPOINT": f"http://127.0.0.1:{receivers[name].http_port}"}
        return {**out, "SGLANG_MMTRACE_CAPTURE_CONTENT": "1"} if name == "capture" else out

    with contextlib.ExitStack() as stack, ThreadPoolExecutor(2) as pool:
        default, capture = pool.map(
            lambda name: stack.enter_context(start_server(tmp_path_factory, f"privacy-{name}", env=env(name))),
            ("default", "capture"),
        )
        yield {"default": default, "capture": capture}


def _requests(host: ImageHost) -> dict[str, Any]:
    question = {"type": "text", "text": f"Privacy test {MARKER}: what is shown?"}
    return {
        "url image": [{"type": "image_url", "image_url": {"url": host.url(URL_PATH)}}, question],
        "inline image": [{"type": "image_url", "image_url": {"url": data_url(INLINE_PNG)}}, question],
        "text": f"Privacy test {MARKER}: say something short.",
    }


@pytest.fixture(scope="module")
def sent(servers, receivers, host) -> dict[str, dict[str, Any]]:
    """name -> {label: (rid, record, spans of its trace)}, after every trace arrived."""
    out: dict[str, dict[str, Any]] = {}
    for name, srv in servers.items():
        rids = {}
        for label, content in _requests(host).items():
            rid = f"privacy-{name}-{label.replace(' ', '_')}-{time.time_ns()}"
            status, raw = post(srv.port, chat_body(rid, content))
            assert status == 200 and sse_usage(raw), f"{name} {label}: {status} {raw[:300]!r}"
            rids[label] = rid
        recs = records(srv, rids.values(), timeout=60)
        deadline = time.monotonic() + 60
        while True:
            spans = receivers[name].snapshot()
            got = {rid: [s for s in spans if s.trace_id == recs[rid]["trace_id"]] for rid in rids.values()}
            if all(len(got[rid]) > len(recs[rid]["stages"]) for rid in rids.values()):  # the stages and the root
                break
            assert time.monotonic() < deadline, f"{name}: spans missing" + server_context(srv)
            time.sleep(0.3)
        out[name] = {label: (rid, recs[rid], got[rid]) for label, rid in rids.items()}
    assert host.requests.count(URL_PATH) >= 2, host.requests  # both servers really fetched the URL image
    return out


def _span_text(spans: list[Any]) -> str:
    return json.dumps([[s.name, s.attrs, s.resource, s.scope] for s in spans], default=str)


def _leaks(where: dict[str, str], secrets: dict[str, str]) -> list[tuple[str, str]]:
    return [(place, what) for place, text in where.items() for what, secret in secrets.items() if secret in text]


def test_default_nothing_leaves(sent, servers, receivers, host):
    srv = servers["default"]
    where = {
        "OTLP spans": _span_text(receivers["default"].snapshot()),
        "JSONL records": srv.jsonl_path.read_text(),
        "/metrics": get(srv.port, "/metrics")[1].decode(),
        "plugin log lines": "\n".join(plugin_lines(srv)),
    }
    assert all(rec["trace_id"] for _, rec, _ in sent["default"].values())
    assert all("content" not in rec for _, rec, _ in sent["default"].values())
    leaks = _leaks(where, _secrets(host))
    assert not leaks, f"content left the process with default settings: {leaks}"


def test_capture_content_puts_prompt_and_urls_in_record_and_root_span(sent, host):
    for label, (_rid, rec, spans) in sent["capture"].items():
        content = rec.get("content")
        assert content is not None and MARKER in (content["prompt"] or ""), (label, content)
        (root,) = [s for s in spans if s.parent_span_id is None]  # the GenAI root span: content goes there
        assert MARKER in root.attrs.get("sglang_mmtrace.content.prompt", ""), (label, root.attrs)
        urls = content["image_urls"]
        if label == "url image":
            assert urls == [host.url(URL_PATH)], urls
            assert list(root.attrs.get("sglang_mmtrace.content.image_urls", [])) == urls, root.attrs
        elif label == "inline image":
            assert urls == [f"data:image/png;base64,<{len(INLINE_B64)} chars>"], urls
        else:
            assert urls == [], urls
        stage_attrs = json.dumps([s.attrs for s in spans if s is not root])
        assert MARKER not in stage_attrs  # only the root span carries content


def test_capture_content_never_exports_image_bytes(sent, servers, receivers, host):
    srv = servers["capture"]
    bytes_only = {k: v for k, v in _secrets(host).items() if "base64" in k}
    where = {
        "OTLP spans": _span_text(receivers["capture"].snapshot()),
        "JSONL records": srv.jsonl_path.read_text(),
        "/metrics": get(srv.port, "/metrics")[1].decode(),
        "plugin log lines": "\n".join(plugin_lines(srv)),
    }
    assert not _leaks(where, bytes_only)
    # metrics and logs stay content-free even opted in
    assert not _leaks({k: where[k] for k in ("/metrics", "plugin log lines")}, _secrets(host))
