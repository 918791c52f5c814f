"""OpenAI serving layer (api process): the OpenAI conversion's NVTX range.

``openai.convert`` needs no clock of ours: SGLang notes the OpenAI handler's start before it calls
the conversion (the adapted request's ``received_time``, ``perf_counter``), and the request's trace
is made when the TokenizerManager takes the converted request (``tokenizer_manager.init_req_state``),
after the conversion has returned. The collector files the stage between the two (``build_record``),
so the conversion call itself is wrapped only to bracket it with its NVTX range, where a tool is
attached (``ranged``): without one, the request passes no frame of ours here.
"""

from __future__ import annotations

from ...stages import OPENAI_CONVERT
from ..base import HookSpec, ranged

PART = "http"  # the switch part that gates these hooks

HOOKS: dict[str, HookSpec] = {
    "openai_serving.convert": ranged("openai_serving.convert", (OPENAI_CONVERT, lambda i, a, k: "")),
}

# the arguments each hook reads from its target (registry.READS_OF)
READS: dict[str, tuple[tuple[int | None, str | None], ...]] = {}
