"""NVTX ranges (domain ``sglang_mmtrace``), pushed by the hooks on the thread doing the work.

When no profiler or NVTX tool is attached, ``nvtx.get_domain`` returns a dummy and the plugin
pushes nothing at all: the hooks then pay one global lookup.
"""

from __future__ import annotations

from typing import Any

from . import config
from .stages import STAGES

DOMAIN = "sglang_mmtrace"
GROUP_COLORS = {
    "request": 0x9E9E9E,
    "http": 0x9E9E9E,
    "openai": 0x8D6E63,
    "tokenize": 0x795548,
    "mm": 0x43A047,
    "transport": 0xFB8C00,
    "dispatch": 0xFB8C00,
    "scheduler": 0x1E88E5,
    "model": 0xE53935,
    "detokenize": 0x8E24AA,
    "response": 0x8E24AA,
}
"""One colour per stage group (ARGB without alpha)."""

domain: Any = None
_attrs: dict[str, Any] = {}


def setup() -> bool:
    """Open the domain if a tool is attached; returns whether ranges will be pushed."""
    global domain
    if not config.get().nvtx:
        return False
    try:
        import nvtx
    except ImportError:
        return False
    d = nvtx.get_domain(DOMAIN)
    if type(d).__name__ == "DummyDomain":
        return False
    domain = d
    return True


def color(stage: str) -> int:
    return 0xFF000000 | GROUP_COLORS.get(STAGES[stage].group if stage in STAGES else stage, 0x9E9E9E)


def push(stage: str, detail: str) -> None:
    domain.push_range(message=f"{stage} {detail}" if detail else stage, color=color(stage))


def pop() -> None:
    domain.pop_range()


def start(stage: str, detail: str) -> Any:
    """A start/end range: for coroutines, whose push/pop would interleave on the event loop thread."""
    return domain.start_range(message=f"{stage} {detail}" if detail else stage, color=color(stage))


def end(range_id: Any) -> None:
    domain.end_range(range_id)


def rids_detail(rids: Any) -> str:
    rids = list(rids)
    return f"n={len(rids)} rids={','.join(rids)}"
