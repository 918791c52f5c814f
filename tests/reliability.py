"""Helpers shared by the reliability tests (bad input, faults, load, drift, privacy).

Plain functions over a real ``CpuServer``: raw chat requests that keep the status and body of
errors, the plugin's own log lines, settled ``/mmtrace/state``, a local image host that serves
bytes, answers 404 or never answers.
"""

from __future__ import annotations

import http.client
import http.server
import json
import threading
import time
from typing import Any

from conftest import state

from sglang_mmtrace.harness import CpuServer, chat_request, data_url, image_message, make_image

PLUGIN_MARK = "sglang-mmtrace:"
"""Every line the plugin logs starts its message with this (SGLang's own lines never do)."""


def chat_body(
    rid: str,
    content: Any = None,
    max_tokens: int = 4,
    stream: bool = True,
    messages: list[dict[str, Any]] | None = None,
    **extra: Any,
) -> dict[str, Any]:
    """A chat request with its own ``rid``: one user message of ``content``, or ``messages`` as given."""
    if messages is None:
        messages = [{"role": "user", "content": content}]
    return chat_request(messages, max_tokens, stream=stream, rid=rid, **extra)


def post(port: int, body: dict[str, Any], timeout: float = 300) -> tuple[int, bytes]:
    """POST /v1/chat/completions; (status, whole body) whatever the status."""
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=timeout)
    try:
        conn.request(
            "POST", "/v1/chat/completions", body=json.dumps(body).encode(), headers={"Content-Type": "application/json"}
        )
        resp = conn.getresponse()
        return resp.status, resp.read()
    finally:
        conn.close()


def send_image_requests(port: int, prefix: str, n: int, seed: int, size: int, question: str) -> list[str]:
    """n streamed requests with one new image each (seeds ``seed..seed+n-1``); all must answer 200 with
    usage. Returns their rids."""
    rids = [f"{prefix}-{k}-{time.time_ns()}" for k in range(n)]
    for k, rid in enumerate(rids):
        image = data_url(make_image(size, size, seed=seed + k))
        status, raw = post(port, chat_body(rid, messages=[image_message(question, [image])]))
        assert status == 200 and sse_usage(raw), raw[:500]
    return rids


def flip(port: int, body: object) -> tuple[int, dict]:
    """POST /mmtrace/enabled (the runtime switch); returns the status and the JSON answer."""
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
    try:
        raw = json.dumps(body).encode() if not isinstance(body, bytes) else body
        conn.request("POST", "/mmtrace/enabled", body=raw, headers={"Content-Type": "application/json"})
        resp = conn.getresponse()
        return resp.status, json.loads(resp.read())
    finally:
        conn.close()


def get(port: int, path: str, timeout: float = 60) -> tuple[int, bytes]:
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=timeout)
    try:
        conn.request("GET", path)
        resp = conn.getresponse()
        return resp.status, resp.read()
    finally:
        conn.close()


def sse_usage(raw: bytes) -> dict[str, Any] | None:
    """The last usage object of an SSE body (None when the stream carried none)."""
    usage = None
    for line in raw.split(b"\n"):
        if line.startswith(b"data:") and line[5:].strip() != b"[DONE]":
            chunk = json.loads(line[5:])
            usage = chunk.get("usage") or usage
    return usage


def plugin_lines(server: CpuServer) -> list[str]:
    """The server log lines the plugin wrote (API, scheduler and detokenizer share the log)."""
    text = server.log_path.read_text(errors="replace") if server.log_path else ""
    return [line for line in text.splitlines() if PLUGIN_MARK in line]


def settled_state(server: CpuServer, limit_s: float = 15.0) -> dict[str, Any]:
    """Poll /mmtrace/state until nothing is live, finishing, pending or queued (or the limit passes)."""
    deadline = time.monotonic() + limit_s
    while True:
        st = state(server)
        api = st["api"]
        busy = api["live_requests"] or api["finishing"] or api["remote_pending"]
        busy = busy or any(p.get("queued_events") for p in st["peers"].values())
        if not busy or time.monotonic() > deadline:
            return st
        time.sleep(0.25)


def at_rest_problems(st: dict[str, Any]) -> list[str]:
    api = st["api"]
    return [f"{k} = {api[k]}" for k in ("live_requests", "finishing", "remote_pending") if api[k]] + [
        f"{peer}: queued_events = {p['queued_events']}" for peer, p in st["peers"].items() if p.get("queued_events")
    ]


class ImageHost:
    """A local HTTP server: ``/img/<name>`` serves registered bytes, ``/hang/...`` never answers, else 404."""

    def __init__(self) -> None:
        self.files: dict[str, bytes] = {}
        self.requests: list[str] = []
        self._release = threading.Event()
        host = self

        class Handler(http.server.BaseHTTPRequestHandler):
            def do_GET(self) -> None:  # noqa: N802 (http.server API)
                host.requests.append(self.path)
                if self.path.startswith("/hang/"):
                    host._release.wait(600)  # accept, read the request, never answer
                    return
                data = host.files.get(self.path.removeprefix("/img/"))
                if data is None:
                    self.send_error(404)
                    return
                self.send_response(200)
                self.send_header("Content-Type", "image/png")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def log_message(self, format: str, *args: Any) -> None:
                return None

        self.httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.httpd.daemon_threads = True
        self.port = self.httpd.server_address[1]
        threading.Thread(target=self.httpd.serve_forever, daemon=True).start()

    def url(self, path: str) -> str:
        return f"http://127.0.0.1:{self.port}{path}"

    def close(self) -> None:
        self._release.set()
        self.httpd.shutdown()
        self.httpd.server_close()


def metric_total(server: CpuServer, name: str, label: str) -> dict[str, float]:
    """label value -> value of one plugin counter on the server's /metrics (e.g. dropped_total by sink)."""
    from prometheus_client.parser import text_string_to_metric_families

    status, body = get(server.port, "/metrics")
    assert status == 200, status
    out: dict[str, float] = {}
    for family in text_string_to_metric_families(body.decode()):
        for sample in family.samples:
            if sample.name == name:
                out[sample.labels.get(label, "")] = out.get(sample.labels.get(label, ""), 0.0) + sample.value
    return out


class SilentCollector:
    """A TCP listener that accepts connections and never reads or answers (a collector that hangs)."""

    def __init__(self) -> None:
        import socket

        self.sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        self.sock.bind(("127.0.0.1", 0))
        self.sock.listen(64)
        self.port = self.sock.getsockname()[1]
        self.accepted: list[Any] = []
        self._stop = threading.Event()
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        while not self._stop.is_set():
            try:
                conn, _ = self.sock.accept()
            except OSError:
                return
            self.accepted.append(conn)  # kept open, never read

    def close(self) -> None:
        self._stop.set()
        self.sock.close()
        for conn in self.accepted:
            conn.close()
