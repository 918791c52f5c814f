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

from sglang_mmtrace import runtime
from sglang_mmtrace.hooks.api.http_server import MmtraceMiddleware


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
