"""SGLang's scheduler profiler (``/start_profile``, ``/stop_profile``, or the step counts they set):
once it has started or stopped, the NVTX sink follows whether a torch profiler records
(``sinks.nvtx.follow_profiler``), so the stages pushed on the scheduler thread meanwhile are also
``record_function`` ranges of its trace.

Set-up hooks, never gated: they run once per start or stop, and the sink itself follows the switch's
``nvtx`` part. SGLang's ``SGLANG_PROFILE_V2`` manager starts its by-stage profiles elsewhere and is
not followed.
"""

from __future__ import annotations

from dataclasses import replace

from ...sinks import nvtx
from ..base import HookSpec, interval


def _followed(st, t0, t1, instance, args, kwargs, result, exc) -> None:
    nvtx.follow_profiler()


PART = "scheduler"  # the switch part that gates these hooks (they are set-up: never gated)

HOOKS: dict[str, HookSpec] = {
    "profiler_manager.start": replace(interval("profiler_manager.start", _followed), gated=False),
    "profiler_manager.stop": replace(interval("profiler_manager.stop", _followed), gated=False),
}

# the arguments each hook reads from its target (registry.READS_OF): none
READS: dict[str, tuple[tuple[int | None, str | None], ...]] = {}
