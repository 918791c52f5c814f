"""The offline Engine's call hook: the call is current while it runs, and its requests are handed over
when it returns or raises (the real Engine on the CPU: ``test_server_engine.py``)."""

from __future__ import annotations

import asyncio

import pytest

from sglang_mmtrace import runtime
from sglang_mmtrace.hooks.api import engine
from sglang_mmtrace.join.context import ApiTrace, EngineCall, current_call


class Shipped:
    def __init__(self) -> None:
        self.calls: list[EngineCall] = []

    def finish_call(self, call: EngineCall) -> None:
        self.calls.append(call)


def _request(rid: str) -> str:
    call = current_call.get()
    assert call is not None  # what _init_req_state files the request under
    call.traces.append(ApiTrace(rid, None, "m", call.t_call))
    return rid


def test_sync_call_ships_its_requests_and_marks_a_failure(monkeypatch):
    shipped = Shipped()
    monkeypatch.setattr(runtime, "collector", shipped)
    wrapper = engine.HOOKS["engine.generate"].make("sync")
    assert wrapper(lambda rid: _request(rid), None, ("r1",), {}) == "r1"
    assert current_call.get() is None and [t.rid for t in shipped.calls[0].traces] == ["r1"]
    assert shipped.calls[0].traces[0].tm_error is None

    def failing() -> None:
        _request("r2")
        raise ValueError("bad image")

    with pytest.raises(ValueError):
        wrapper(failing, None, (), {})
    assert shipped.calls[1].traces[0].tm_error == "ValueError" and current_call.get() is None


def test_a_call_without_requests_ships_nothing(monkeypatch):
    """``stream=True`` returns before its requests start: nothing is filed, nothing shipped."""
    shipped = Shipped()
    monkeypatch.setattr(runtime, "collector", shipped)
    assert engine.HOOKS["engine.generate"].make("sync")(lambda: iter(()), None, (), {}) is not None
    assert shipped.calls == []


def test_async_call_is_current_in_its_own_task_only(monkeypatch):
    shipped = Shipped()
    monkeypatch.setattr(runtime, "collector", shipped)
    wrapper = engine.HOOKS["engine.async_generate"].make("async")

    async def generate(rid: str) -> str:
        await asyncio.sleep(0.01)
        return _request(rid)

    async def both() -> list[str]:
        return await asyncio.gather(wrapper(generate, None, ("a",), {}), wrapper(generate, None, ("b",), {}))

    assert asyncio.run(both()) == ["a", "b"]
    assert sorted(t.rid for c in shipped.calls for t in c.traces) == ["a", "b"]
    assert all(len(c.traces) == 1 for c in shipped.calls)
