"""The ``cuda_ipc`` feature pool (api process): count the features that did not fit and went by CPU.

SGLang calls ``MmItemMemoryPool._warn_pool_full_once`` each time a tensor finds no free slice (it
logs only the first); the hook adds one to ``occupancy.cuda_ipc_fallbacks`` and nothing else. The
pool's reserved and leased bytes are read on the API process's occupancy timer.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any

from ... import occupancy
from ..base import HookSpec, before


def _fallback(instance: Any, args: tuple, kwargs: dict) -> None:
    occupancy.cuda_ipc_fallbacks += 1


PART = "mm"  # the switch part that gates these hooks (this one counts for the metrics: never gated)

HOOKS: dict[str, HookSpec] = {
    "cuda_ipc_pool.fallback": replace(before("cuda_ipc_pool.fallback", _fallback), gated=False),
}

# the arguments each hook reads from its target (registry.READS_OF): none
READS: dict[str, tuple[tuple[int | None, str | None], ...]] = {}
