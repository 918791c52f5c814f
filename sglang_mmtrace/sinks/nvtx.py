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

While SGLang's scheduler runs its torch profiler (``/start_profile``), ``domain`` is a
``TorchRanges`` (``follow_profiler``): the ranges pushed on the thread that started the profiler are
also ``record_function`` ranges of its trace, and still reach the NVTX domain when a tool is attached.
"""

from __future__ import annotations

import hashlib
import threading
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
_profiled: Any = None
"""The ``TorchRanges`` standing in for ``_attached`` while a torch profiler records, else None."""
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
    global domain, _attached, _profiled
    domain = _attached = _profiled = None
    _styles.clear()
    if _follow_switch in switch.LISTENERS:
        switch.LISTENERS.remove(_follow_switch)


def _follow_switch() -> None:
    """No new ranges while ``nvtx`` is off; ranges already open are still closed (pop/end use the domain they were opened on)."""
    global domain
    domain = (_profiled or _attached) if switch.on("nvtx") else None


def follow_profiler() -> None:
    """After SGLang's scheduler started or stopped its profiler, on the thread that did: ``domain`` is a
    ``TorchRanges`` while a torch profiler records on this thread, and the attached domain (or None)
    again once none does. Reads torch's own state, so a start that failed, or one with no torch
    activity (``CUDA_PROFILER``, ``MEM``), changes nothing."""
    global _profiled
    if not config.get().nvtx:
        return
    import torch  # loaded: the scheduler runs on it

    if not torch._C._autograd._profiler_enabled():
        _profiled = None
    elif _profiled is None:
        _profiled = TorchRanges(_attached)
    if _follow_switch not in switch.LISTENERS:
        switch.LISTENERS.append(_follow_switch)
    _follow_switch()


class TorchRanges:
    """The domain's push/pop, start/end and mark, also as torch profiler ranges of one thread.

    A range pushed on the thread that started the profiler (the only thread whose calls it records)
    is a ``record_function`` range named by its stage, in the trace's ``user_annotation`` category;
    the request key has no place there. Start/end ranges (coroutines, which interleave on an event
    loop where ``record_function`` ranges must nest) and marks go to the NVTX domain only. Every call
    reaches the NVTX domain ``inner`` when a tool is attached.
    """

    def __init__(self, inner: Any) -> None:
        import torch

        self._inner = inner
        self._thread = threading.get_ident()
        self._open: list[Any] = []
        """The ``record_function`` handles of the ranges open on the profiled thread, innermost last."""
        self._enter = torch.ops.profiler._record_function_enter_new
        self._exit = torch.ops.profiler._record_function_exit

    def push_range(self, message: str, color: int, category: int, payload: int | None = None) -> None:
        if self._inner is not None:
            self._inner.push_range(message=message, color=color, category=category, payload=payload)
        if threading.get_ident() == self._thread:
            self._open.append(self._enter(message, None))

    def pop_range(self) -> None:
        # A range pushed before the profiler started has no handle here: its pop only reaches the domain.
        if self._open and threading.get_ident() == self._thread:
            self._exit(self._open.pop())
        if self._inner is not None:
            self._inner.pop_range()

    def start_range(self, message: str, color: int, category: int, payload: int | None = None) -> Any:
        if self._inner is None:
            return None
        return self._inner.start_range(message=message, color=color, category=category, payload=payload)

    def end_range(self, range_id: Any) -> None:
        if self._inner is not None:
            self._inner.end_range(range_id)

    def mark(self, message: str, color: int, category: int, payload: int | None = None) -> None:
        if self._inner is not None:
            self._inner.mark(message=message, color=color, category=category, payload=payload)


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
    """The domain open ranges were pushed on (still there after the switch hid ``domain``); None when a
    range outlived the torch profiler it was pushed under and no tool is attached."""
    return domain if domain is not None else _profiled or _attached


def pop() -> None:
    d = _opened_on()
    if d is not None:
        d.pop_range()


def start(stage: str, requests: Requests) -> Any:
    """A start/end range: for coroutines, whose push/pop would interleave on the event loop thread."""
    return _open(domain, domain.start_range, stage, requests)


def end(range_id: Any) -> None:
    d = _opened_on()
    if d is not None:
        d.end_range(range_id)
