"""The runtime switch: every part of the plugin on or off, in every process, without a restart.

``POST /mmtrace/enabled {"on": false}`` (API process) takes every hook out (SGLang's own functions go
back in place, ``patch.follow``; a reference SGLang holds to a hook passes straight through) and idles
the plugin's background threads; ``{"on": true}`` turns it back on; ``{"on": true, "parts": [...]}``
enables only the named parts (the overhead ablation). The API process applies it at once and
publishes it to the schedulers and the detokenizer, which apply it and confirm with their next
heartbeat; the HTTP answer waits for every confirmation.

Hot path: a hook reads one attribute (``Gate.on``) before doing anything. Each process's state shows
``hooks``: [in place, applied] of its gated hooks. Each flip starts a new
``generation``; a request is recorded only if it started and ended in the same generation, so no
record is half-built across a flip.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

PARTS: tuple[str, ...] = (
    "http",
    "tokenizer",
    "mm",
    "scheduler",
    "detokenizer",
    "cuda_events",
    "ship",
    "records",
    "jsonl",
    "prometheus",
    "otlp",
    "nvtx",
)
"""Every part the switch controls, in stack order (each needs the ones before it to record anything)."""

DESCRIPTION: dict[str, str] = {
    "http": "ASGI middleware and OpenAI-layer hooks (api)",
    "tokenizer": "TokenizerManager hooks (api)",
    "mm": "multimodal processor and feature transport hooks (api)",
    "scheduler": "scheduler hooks: receive, queue, radix match, batch, forward, output (scheduler)",
    "detokenizer": "detokenizer hooks (detokenizer)",
    "cuda_events": "GPU stages timed by CUDA events instead of the host clock (api, scheduler)",
    "ship": "hooks hand their events on to the collector (all processes)",
    "records": "the collector joins events and builds records",
    "jsonl": "JSONL sink",
    "prometheus": "Prometheus sink",
    "otlp": "OTLP sink",
    "nvtx": "NVTX ranges (only pushed when an NVTX tool is attached)",
}


class Gate:
    """One part's switch. Hooks close over it and read ``on``; ``enabled`` is the same setting as a
    list (``[True]`` or empty) that ``patch.hooked`` tests for truth before each call of a gated target
    (wrapt in C, the closures as their first step): while off, the target is called directly and no
    hook code runs. That test is the fallback for references taken while the hook was in place: off,
    the hooks are taken out altogether (``plugin.follow_switch``)."""

    __slots__ = ("name", "on", "enabled", "since")

    def __init__(self, name: str) -> None:
        self.name = name
        self.on = True
        self.enabled: list[bool] = [True]
        self.since = 0.0
        """When the part was last switched on (``perf_counter``; 0.0: on from the start). Work that
        began before it, while the part's hooks were out, is not picked up half-way."""

    def set(self, on: bool) -> None:
        if on and not self.on:
            self.since = time.perf_counter()
        self.on = on
        self.enabled[:] = [True] if on else []


GATES: dict[str, Gate] = {name: Gate(name) for name in PARTS}
LISTENERS: list[Callable[[], None]] = []
"""Called after every applied flip (parts that keep state of their own, e.g. the NVTX domain)."""
generation = 0
"""Bumped by every applied flip (the API process sets it; peers copy the API's number)."""


def gate(part: str) -> Gate:
    return GATES[part]


def on(part: str) -> bool:
    return GATES[part].on


@dataclass(frozen=True)
class Setting:
    on: bool
    parts: tuple[str, ...]

    @property
    def enabled(self) -> tuple[str, ...]:
        """The parts that are on (none while off)."""
        return self.parts if self.on else ()

    @classmethod
    def parse(cls, body: Any) -> Setting:
        """``{"on": bool, "parts": [names]?}`` -> Setting; raises ValueError on anything else."""
        if not isinstance(body, dict) or not isinstance(body.get("on"), bool):
            raise ValueError('expected a JSON object {"on": true|false, "parts": [...]?}')
        parts = body.get("parts")
        if parts is None:
            parts = PARTS
        if not isinstance(parts, list | tuple) or not all(isinstance(p, str) for p in parts):
            raise ValueError('"parts" must be a list of part names')
        unknown = sorted(set(parts) - set(PARTS))
        if unknown:
            raise ValueError(f"unknown parts {unknown}; known: {list(PARTS)}")
        return cls(body["on"], tuple(p for p in PARTS if p in parts))


def apply(setting: Setting, gen: int) -> None:
    """Set every gate of this process (any thread; each store is atomic under the GIL)."""
    global generation
    for name, g in GATES.items():
        g.set(name in setting.enabled)
    generation = gen
    for listener in LISTENERS:
        listener()


def current() -> Setting:
    return Setting(any(g.on for g in GATES.values()), tuple(n for n, g in GATES.items() if g.on))


def _no_hooks() -> tuple[int, int]:
    """``hook_count`` before ``plugin`` is imported (the collector process): no hooks."""
    return 0, 0


hook_count: Callable[[], tuple[int, int]] = _no_hooks
"""Set by ``plugin``: [in place, applied] of this process's gated hooks (``patch.follow``; set-up hooks
are never taken out and not counted). A callback, because every hook imports this module: it reads
none of the plugin's process state itself."""


def snapshot() -> dict[str, Any]:
    """This process's setting, and ``hooks``: ``hook_count()``."""
    s = current()
    placed, gated = hook_count()
    return {"on": s.on, "parts": list(s.parts), "generation": generation, "hooks": [placed, gated]}
