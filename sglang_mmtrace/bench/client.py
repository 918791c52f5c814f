"""A streaming chat client that timestamps the first SSE chunk carrying ``choices`` (client TTFT).

Raw sockets instead of ``http.client``: the first-chunk time must be taken when its bytes arrive,
not when a library hands over a parsed line. Token counts come from ``usage``
(``stream_options.include_usage``), never from the number of chunks. ``timed_chat`` is the one
definition of client TTFT that every experiment uses.
"""

from __future__ import annotations

import json
import socket
import time
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import urlsplit

from ..harness.server import chat_request


class RequestFailed(RuntimeError):
    """The server answered with an error (HTTP status or an SSE error event) or nothing usable."""


@dataclass(slots=True)
class ChatResult:
    """One request as the client saw it. ``rid`` is the response ``id`` (SGLang's rid)."""

    rid: str | None = None
    ttft_s: float | None = None
    e2e_s: float | None = None
    usage: dict[str, Any] | None = None
    n_chunks: int = 0
    ok: bool = False
    error: str | None = None
    sent_unix_s: float = field(default=0.0)


def host_port(base_url: str) -> tuple[str, int]:
    url = urlsplit(base_url)
    if url.scheme != "http" or url.hostname is None:
        raise ValueError(f"expected an http:// base URL, got {base_url!r}")
    return url.hostname, url.port or 80


def _dechunk(raw: bytes) -> bytes:
    """HTTP chunked transfer-encoding -> the body; a truncated tail (still arriving) is cut where it ends."""
    out, i = bytearray(), 0
    while True:
        j = raw.find(b"\r\n", i)
        if j < 0:
            return bytes(out)
        try:
            size = int(raw[i:j].split(b";")[0] or b"0", 16)
        except ValueError:
            return bytes(out)
        if size == 0:
            return bytes(out)
        out += raw[j + 2 : j + 2 + size]
        i = j + 2 + size + 2


def _sse_events(payload: bytes) -> list[bytes]:
    """The ``data:`` contents of the complete SSE events in ``payload`` (an unterminated last one is left)."""
    events = payload.replace(b"\r\n", b"\n").split(b"\n\n")[:-1]
    out = []
    for ev in events:
        data = b"\n".join(line[5:].strip() for line in ev.split(b"\n") if line.startswith(b"data:"))
        if data:
            out.append(data)
    return out


def carries_choices(data: bytes) -> bool:
    """An SSE event's data is a chunk with a non-empty ``choices`` list (not ``[DONE]``, an error
    event, or the usage-only chunk at the end)."""
    if data == b"[DONE]":
        return False
    try:
        chunk = json.loads(data)
    except ValueError:
        return False
    return isinstance(chunk, dict) and bool(chunk.get("choices"))


def _first_choices_seen(buf: bytearray, header_end: int) -> bool:
    header = bytes(buf[:header_end]).lower()
    payload = bytes(buf[header_end + 4 :])
    if b"transfer-encoding: chunked" in header:
        payload = _dechunk(payload)
    return any(carries_choices(d) for d in _sse_events(payload))


def timed_chat(
    base_url: str,
    messages: list[dict[str, Any]],
    max_tokens: int = 8,
    timeout: float = 120.0,
    extra: dict[str, Any] | None = None,
    warmup: bool = False,
) -> dict[str, Any]:
    """POST a streamed chat completion; return ``ttft_s``, ``e2e_s``, ``id``, ``n_chunks``, ``usage``.

    ``warmup`` sends ``X-Mmtrace-Warmup: 1``: the plugin marks the record and keeps it out of the
    metrics and ``report``.

    TTFT runs from just before the request is written to the arrival of the bytes that complete the
    first SSE event whose chunk carries ``choices`` (SGLang's first chunk, sent once the first token
    is out); e2e to the end of the response. Raises ``RequestFailed`` (or ``OSError`` on a timeout or
    refused connection).
    """
    host, port = host_port(base_url)
    body = json.dumps(chat_request(messages, max_tokens, **(extra or {}))).encode()
    head = (
        f"POST /v1/chat/completions HTTP/1.1\r\nHost: {host}:{port}\r\nContent-Type: application/json\r\n"
        f"Accept: text/event-stream\r\nContent-Length: {len(body)}\r\nConnection: close\r\n"
        + ("X-Mmtrace-Warmup: 1\r\n" if warmup else "")
        + "\r\n"
    ).encode()
    sock = socket.create_connection((host, port), timeout=timeout)
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    buf = bytearray()
    header_end = -1
    t_first = None
    try:
        t0 = time.perf_counter()
        sock.sendall(head + body)
        while True:
            data = sock.recv(65536)
            t = time.perf_counter()
            if not data:
                break
            buf += data
            if header_end < 0:
                header_end = buf.find(b"\r\n\r\n")
            if t_first is None and header_end >= 0 and _first_choices_seen(buf, header_end):
                t_first = t
        t_end = time.perf_counter()
    finally:
        sock.close()
    if header_end < 0:
        raise RequestFailed(f"no HTTP response header: {bytes(buf[:200])!r}")
    header, payload = bytes(buf[:header_end]), bytes(buf[header_end + 4 :])
    status = int(header.split(b" ", 2)[1])
    if b"transfer-encoding: chunked" in header.lower():
        payload = _dechunk(payload)
    if status != 200:
        raise RequestFailed(f"HTTP {status}: {payload[:300]!r}")
    chunks: list[dict[str, Any]] = []
    for line in payload.split(b"\n"):
        if line.startswith(b"data:"):
            data = line[5:].strip()
            if data and data != b"[DONE]":
                chunk = json.loads(data)
                if isinstance(chunk, dict) and "error" in chunk and "choices" not in chunk:
                    raise RequestFailed(f"SSE error event: {str(chunk['error'])[:300]}")
                chunks.append(chunk)
    if t_first is None:
        raise RequestFailed("response carried no SSE chunk with choices")
    usage = next((c["usage"] for c in reversed(chunks) if c.get("usage")), None)
    return {
        "ttft_s": t_first - t0,
        "e2e_s": t_end - t0,
        "id": chunks[0].get("id") if chunks else None,
        "n_chunks": len(chunks),
        "usage": usage,
    }


def send(
    base_url: str,
    messages: list[dict[str, Any]],
    max_tokens: int,
    timeout: float,
    extra: dict[str, Any] | None = None,
    warmup: bool = False,
) -> ChatResult:
    """``timed_chat`` that never raises: a failure is a result with ``ok=False`` and the error."""
    res = ChatResult(sent_unix_s=time.time())
    try:
        out = timed_chat(base_url, messages, max_tokens=max_tokens, timeout=timeout, extra=extra, warmup=warmup)
    except (OSError, RequestFailed, ValueError) as exc:  # a timeout is an OSError
        res.error = f"{type(exc).__name__}: {exc}"[:400]
        return res
    res.rid, res.ttft_s, res.e2e_s = out["id"], out["ttft_s"], out["e2e_s"]
    res.usage, res.n_chunks, res.ok = out["usage"], out["n_chunks"], True
    return res


def usage_tokens(usage: dict[str, Any] | None) -> dict[str, int | None]:
    """prompt / cached / completion tokens from an OpenAI ``usage`` object (None when absent)."""
    u = usage or {}
    details = u.get("prompt_tokens_details") or {}
    return {
        "prompt_tokens": u.get("prompt_tokens"),
        "cached_tokens": details.get("cached_tokens"),
        "completion_tokens": u.get("completion_tokens"),
    }
