"""OpenAI serving layer (api process): the OpenAI conversion.

Where HTTP parsing ends needs no hook: SGLang notes the OpenAI handler's start itself (the adapted
request's ``received_time``, ``perf_counter``), which ``tokenizer_manager.init_req_state`` reads. The
conversion's call is kept as its two times; the collector files ``openai.convert`` from the handler's
start (``build_record``), off the request's path.
"""

from __future__ import annotations

from ...stages import OPENAI_CONVERT
from ..base import HookSpec, arg, interval


def _convert_exit(st, t0, t1, instance, args, kwargs, result, exc) -> None:
    # Runs on the asyncio default executor (0.5.23): contextvars are not propagated there, the scope is.
    raw_request = arg(args, kwargs, 1, "raw_request")
    state = getattr(raw_request, "scope", {}).get("state") or {}
    http = state.get("mmtrace")
    if http is not None:
        http.convert = (t0, t1)


PART = "http"  # the switch part that gates these hooks

HOOKS: dict[str, HookSpec] = {
    "openai_serving.convert": interval(
        "openai_serving.convert", _convert_exit, nvtx=(OPENAI_CONVERT, lambda i, a, k: "")
    ),
}

# the arguments each hook reads from its target (registry.READS_OF)
READS: dict[str, tuple[tuple[int | None, str | None], ...]] = {
    "openai_serving.convert": ((1, "raw_request"),),
}
