"""OpenAI serving layer (api process): where HTTP parsing ends and the OpenAI conversion runs."""

from __future__ import annotations

from typing import Any

from ...join.context import current_http
from ..base import HookSpec, arg, before, interval, now


def _handle_request(instance: Any, args: tuple, kwargs: dict) -> None:
    http = current_http.get()
    if http is not None and http.t_handle is None:
        http.t_handle = now()


def _convert_exit(st, t0, t1, instance, args, kwargs, result, exc) -> None:
    # Runs on the asyncio default executor: contextvars are not propagated there, the scope is.
    raw_request = arg(args, kwargs, 1, "raw_request")
    state = getattr(raw_request, "scope", {}).get("state") or {}
    http = state.get("mmtrace")
    if http is not None:
        # From the handler's entry: the hop onto the executor thread is part of the conversion's cost.
        start = http.t_handle if http.t_handle is not None and http.t_handle <= t0 else t0
        http.add("openai.convert", start, t1, {"executor_wait_s": round(t0 - start, 9)})


PART = "http"  # the switch part that gates these hooks

HOOKS: dict[str, HookSpec] = {
    "openai_serving.handle_request": before("openai_serving.handle_request", _handle_request),
    "openai_serving.convert": interval(
        "openai_serving.convert", _convert_exit, nvtx=("openai.convert", lambda i, a, k: "")
    ),
}

# the arguments each hook reads from its target (registry.READS_OF)
READS: dict[str, tuple[tuple[int | None, str | None], ...]] = {
    "openai_serving.convert": ((1, "raw_request"),),
}
