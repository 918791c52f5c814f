"""The ASGI middleware hands a finished exchange to the collector at its last body byte.

SGLang's streaming app returns about 2 s after it wrote its last byte; a record that waited for the
return would reach the JSONL, the spans and the metrics that much later. The collector client here
is a stand-in that notes when ``finish_http`` is called (the real one spawns the collector process,
which this unit test does not need: the server tests cover the real path).
"""

from __future__ import annotations

import asyncio
import time
from typing import Any

import pytest
from fastapi import FastAPI, Request  # SGLang's server: a FastAPI app (module level: its annotations resolve)
from fastapi.responses import StreamingResponse

from sglang_mmtrace import runtime
from sglang_mmtrace.hooks.api.http_server import MmtraceMiddleware
from sglang_mmtrace.join.collector import http_facts
from sglang_mmtrace.join.record import HttpFacts


class NotingCollector:
    def __init__(self) -> None:
        self.finished: list[tuple[str, Any]] = []
        self.phase = "app running"

    def finish_http(self, ctx: Any) -> None:
        self.finished.append((self.phase, ctx))


@pytest.fixture
def collector(monkeypatch: pytest.MonkeyPatch) -> NotingCollector:
    fake = NotingCollector()
    monkeypatch.setattr(runtime, "collector", fake)
    return fake


def _app(collector: NotingCollector, more: int):
    async def app(scope: dict, receive: Any, send: Any) -> None:
        scope["state"]["mmtrace"].traces.append(object())  # what the TokenizerManager hook adds
        await send({"type": "http.response.start", "status": 200, "headers": []})
        for i in range(more):
            await send({"type": "http.response.body", "body": b"data: %d\n\n" % i, "more_body": True})
            assert collector.finished == []  # not before the last byte
        await send({"type": "http.response.body", "body": b"data: [DONE]\n\n", "more_body": False})
        await asyncio.sleep(0)
        collector.phase = "app returned"  # SGLang's app returns well after its last byte

    return app


async def _receive() -> dict:
    return {"type": "http.request", "body": b"{}", "more_body": False}


async def _send(message: dict) -> None:
    return None


@pytest.mark.parametrize("more", [0, 3])
def test_exchange_is_handed_over_at_the_last_body_byte_once(collector: NotingCollector, more: int) -> None:
    scope = {"type": "http", "path": "/v1/chat/completions", "method": "POST", "headers": []}
    asyncio.run(MmtraceMiddleware(_app(collector, more))(scope, _receive, _send))
    phases = [phase for phase, _ in collector.finished]
    assert phases[0] == "app running"  # handed over before the app returned
    ctx = collector.finished[0][1]
    assert ctx.t_last_body is not None and ctx.t_first_body <= ctx.t_last_body
    # the middleware's ``finally`` may offer it again; the client ships each trace once (``closed``)
    assert all(c is ctx for _, c in collector.finished)


def test_exchange_without_a_complete_body_is_handed_over_when_the_app_ends(collector: NotingCollector) -> None:
    async def app(scope: dict, receive: Any, send: Any) -> None:
        scope["state"]["mmtrace"].traces.append(object())
        await send({"type": "http.response.start", "status": 200, "headers": []})
        await send({"type": "http.response.body", "body": b"data: 0\n\n", "more_body": True})
        raise ConnectionResetError("client went away")

    scope = {"type": "http", "path": "/v1/chat/completions", "method": "POST", "headers": []}
    with pytest.raises(ConnectionResetError):
        asyncio.run(MmtraceMiddleware(app)(scope, _receive, _send))
    assert len(collector.finished) == 1
    ctx = collector.finished[0][1]
    assert ctx.t_last_body is None and ctx.disconnected and ctx.error == "ConnectionResetError"


def test_body_times_are_when_the_message_was_handed_on_not_when_send_returned(collector: NotingCollector) -> None:
    """Under load the event loop resumes a coroutine late after ``send``; that delay is not the
    server's: server TTFT must stay below the client's (issue: 77.5 ms server vs 74.4 ms client)."""
    handed: list[float] = []

    async def slow_send(message: dict) -> None:
        if message["type"] == "http.response.body":
            handed.append(time.perf_counter())
            await asyncio.sleep(0.05)  # the loop was busy elsewhere before resuming the sender

    scope = {"type": "http", "path": "/v1/chat/completions", "method": "POST", "headers": []}
    asyncio.run(MmtraceMiddleware(_app(collector, 2))(scope, _receive, slow_send))
    ctx = collector.finished[0][1]
    assert ctx.t_first_body <= handed[0] < ctx.t_first_body + 0.01
    assert ctx.t_last_body <= handed[-1] < ctx.t_last_body + 0.01


def test_root_span_facts_come_from_the_routed_scope(collector: NotingCollector) -> None:
    """Method, scheme, the path without its query string, and the route template FastAPI matched (the
    ``http.route`` of the spans; read from the scope FastAPI routed, so a real FastAPI app here)."""
    app = FastAPI()

    @app.post("/v1/items/{item_id}")
    async def item(item_id: str, request: Request) -> StreamingResponse:
        request.scope["state"]["mmtrace"].traces.append(object())

        async def chunks():
            yield b"data: 0\n\n"
            yield b"data: [DONE]\n\n"

        return StreamingResponse(chunks(), media_type="text/event-stream")

    app.add_middleware(MmtraceMiddleware)
    scope = {
        "type": "http",
        "asgi": {"version": "3.0"},
        "http_version": "1.1",
        "method": "POST",
        "scheme": "https",
        "path": "/v1/items/7",
        "raw_path": b"/v1/items/7",
        "query_string": b"token=secret",
        "root_path": "",
        "headers": [(b"content-type", b"application/json")],
        "server": ("127.0.0.1", 30000),
        "client": ("127.0.0.1", 5000),
    }
    requested = []

    async def receive() -> dict:  # the request, then (a listener for a disconnect) nothing more
        if not requested:
            requested.append(True)
            return await _receive()
        await asyncio.Event().wait()
        return {"type": "http.disconnect"}

    asyncio.run(asyncio.wait_for(app(scope, receive, _send), 10))
    ctx = collector.finished[0][1]
    assert http_facts(ctx) == HttpFacts("POST", "https", "/v1/items/7", "/v1/items/{item_id}", 200, streamed=True)
