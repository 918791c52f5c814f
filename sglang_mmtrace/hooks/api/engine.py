"""The offline ``sglang.Engine`` (api process: the caller's): ``generate``/``async_generate`` open the request.

There is no HTTP exchange: the call's start is the requests' arrival (the root stage starts there and
ends at the first output's arrival in the TokenizerManager), and its end hands them to the collector.
The call is made current (``current_call``) while it runs, so ``_init_req_state`` files its requests
under it. A streamed call (``stream=True``) returns before its requests start: they are not traced.
"""

from __future__ import annotations

from typing import Any

from ... import runtime
from ...join.context import EngineCall, current_call, now
from ..base import HookSpec, error_class, interval


def _enter(instance: Any, args: tuple, kwargs: dict) -> Any:
    call = EngineCall(now())
    return call, current_call.set(call)


def _exit(st, t0, t1, instance, args, kwargs, result, exc) -> None:
    if st is None:
        return
    call, token = st
    current_call.reset(token)
    if not call.traces or runtime.collector is None:
        return
    for trace in call.traces:
        if exc is not None and trace.t_finished is None and trace.tm_error is None:
            trace.tm_error = error_class(exc)
    runtime.collector.finish_call(call)


PART = "tokenizer"  # the switch part that gates these hooks

HOOKS: dict[str, HookSpec] = {
    "engine.generate": interval("engine.generate", _exit, _enter),
    "engine.async_generate": interval("engine.async_generate", _exit, _enter),
}
# the arguments each hook reads from its target (registry.READS_OF): none, the call itself is the event
READS: dict[str, tuple[tuple[int | None, str | None], ...]] = {}
