"""NVTX ranges (domain ``sglang_mmtrace``), pushed by the hooks on the thread doing the work.

When no profiler or NVTX tool is attached, ``nvtx.get_domain`` returns a dummy and the plugin
pushes nothing at all: the hooks then pay one global lookup.
"""

from __future__ import annotations

from typing import Any

from .. import config, switch
from ..stages import DETOKENIZE, DISPATCH, REQUEST, STAGES, TOKENIZE

DOMAIN = "sglang_mmtrace"
GROUP_COLORS = {
    REQUEST: 0x9E9E9E,
    "http": 0x9E9E9E,
    "openai": 0x8D6E63,
    TOKENIZE: 0x795548,
    "mm": 0x43A047,
    "transport": 0xFB8C00,
    DISPATCH: 0xFB8C00,
    "scheduler": 0x1E88E5,
    "model": 0xE53935,
    DETOKENIZE: 0x8E24AA,
    "response": 0x8E24AA,
}
"""One colour per stage group (ARGB without alpha); a stage with no dot in its name is a group of its
own (``Stage.group``)."""

domain: Any = None
"""The attached domain while the switch's ``nvtx`` part is on, else None (hooks test this)."""
_attached: Any = None


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
    global _attached
    _attached = domain = d
    switch.LISTENERS.append(_follow_switch)
    return True


def teardown() -> None:
    """Undo ``setup`` (plugin uninstall): no domain, no switch listener."""
    global domain, _attached
    domain = _attached = None
    if _follow_switch in switch.LISTENERS:
        switch.LISTENERS.remove(_follow_switch)


def _follow_switch() -> None:
    """No new ranges while ``nvtx`` is off; ranges already open are still closed (pop/end use the domain they were opened on)."""
    global domain
    domain = _attached if switch.on("nvtx") else None


def color(stage: str) -> int:
    return 0xFF000000 | GROUP_COLORS.get(STAGES[stage].group if stage in STAGES else stage, 0x9E9E9E)


def push(stage: str, detail: str) -> None:
    domain.push_range(message=f"{stage} {detail}" if detail else stage, color=color(stage))


def _opened_on() -> Any:
    """The domain open ranges were pushed on (still there after the switch hid ``domain``)."""
    return domain if domain is not None else _attached


def pop() -> None:
    _opened_on().pop_range()


def start(stage: str, detail: str) -> Any:
    """A start/end range: for coroutines, whose push/pop would interleave on the event loop thread."""
    return domain.start_range(message=f"{stage} {detail}" if detail else stage, color=color(stage))


def end(range_id: Any) -> None:
    _opened_on().end_range(range_id)


def rids_detail(rids: Any) -> str:
    rids = list(rids)
    return f"n={len(rids)} rids={','.join(rids)}"
