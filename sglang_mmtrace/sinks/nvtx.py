"""NVTX ranges (domain ``sglang_mmtrace``), pushed by the hooks on the thread doing the work.

A range's message is its stage name and the request it works for is its payload
(``request_key``): the nvtx package registers every distinct message for the life of the process,
so messages that named requests would grow with every request a profiled server serves, while
stage names stay within the catalogue. A batch stage's range (one pass for several requests)
carries no payload and holds one mark per request of the batch, with the same message and the
request's key as payload. Each stage group (``mm``, ``scheduler``, ``model``...) is an NVTX
category, named once when the domain is opened.

When no profiler or NVTX tool is attached, ``nvtx.get_domain`` returns a dummy and the plugin
pushes nothing at all: the hooks then pay one global lookup.
"""

from __future__ import annotations

import hashlib
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
own (``Stage.group``). The groups are also the NVTX categories."""

Requests = str | tuple[str, ...]
"""Whom a range works for: one rid, the rids of a batch (a tuple), or ``""`` for no request."""

domain: Any = None
"""The attached domain while the switch's ``nvtx`` part is on, else None (hooks test this)."""
_attached: Any = None
_styles: dict[str, tuple[int, int]] = {}
"""Stage -> (colour, category id) in the attached domain."""


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
    categories = {group: d.get_category_id(group) for group in GROUP_COLORS}
    _styles.update({name: (color(name), categories.get(stage.group, 0)) for name, stage in STAGES.items()})
    _attached = domain = d
    switch.LISTENERS.append(_follow_switch)
    return True


def teardown() -> None:
    """Undo ``setup`` (plugin uninstall): no domain, no switch listener."""
    global domain, _attached
    domain = _attached = None
    _styles.clear()
    if _follow_switch in switch.LISTENERS:
        switch.LISTENERS.remove(_follow_switch)


def _follow_switch() -> None:
    """No new ranges while ``nvtx`` is off; ranges already open are still closed (pop/end use the domain they were opened on)."""
    global domain
    domain = _attached if switch.on("nvtx") else None


def color(stage: str) -> int:
    return 0xFF000000 | GROUP_COLORS.get(STAGES[stage].group if stage in STAGES else stage, 0x9E9E9E)


def request_key(rid: str) -> int:
    """The NVTX payload that names request ``rid``: the 64-bit BLAKE2b digest of the rid, as a signed int64.

    Derived from the rid rather than counted, so that every process of a server gives a request the
    same key with nothing passed between them, and ``sglang-mmtrace nsys`` finds a record's ranges
    from its ``rid`` alone. Two rids of one profile share a key with a probability of about
    n^2 / 2^65 for n requests; the reader leaves such requests out of its join rather than guess.
    """
    digest = hashlib.blake2b(rid.encode("utf-8", "surrogatepass"), digest_size=8).digest()
    return int.from_bytes(digest, "big", signed=True)


def _open(d: Any, opener: Any, stage: str, requests: Requests) -> Any:
    """``opener`` (the domain's push or start) with the stage's message, colour, category and payload;
    for a batch, then one mark per request inside the range just opened."""
    argb, category = _styles.get(stage) or (color(stage), 0)
    if isinstance(requests, str):
        payload = request_key(requests) if requests else None
        return opener(message=stage, color=argb, category=category, payload=payload)
    opened = opener(message=stage, color=argb, category=category)
    for rid in requests:
        d.mark(message=stage, color=argb, category=category, payload=request_key(rid))
    return opened


def push(stage: str, requests: Requests) -> None:
    _open(domain, domain.push_range, stage, requests)


def _opened_on() -> Any:
    """The domain open ranges were pushed on (still there after the switch hid ``domain``)."""
    return domain if domain is not None else _attached


def pop() -> None:
    _opened_on().pop_range()


def start(stage: str, requests: Requests) -> Any:
    """A start/end range: for coroutines, whose push/pop would interleave on the event loop thread."""
    return _open(domain, domain.start_range, stage, requests)


def end(range_id: Any) -> None:
    _opened_on().end_range(range_id)
