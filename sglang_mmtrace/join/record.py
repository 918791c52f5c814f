"""Build the per-request record (docs/contract.md, "Per-request record") from the joined stage events.

Pure functions: the collector calls them off the request path, and tests call them directly.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

from ..stages import ORDER, ROOT


@dataclass(slots=True)
class StageEvent:
    """One measured interval; times are ``time.perf_counter()`` seconds (CLOCK_MONOTONIC, all processes)."""

    name: str
    process: str
    t0: float
    t1: float
    clock: str = "host"
    attrs: dict[str, Any] = field(default_factory=dict)
    pid: int | None = None  # the sending process (several schedulers with --dp-size > 1); not in the record


@dataclass(slots=True)
class EmitContext:
    """What sinks may need beyond the record: never written to the record itself."""

    traceparent: str | None = None
    pids: dict[str, int] = field(default_factory=dict)  # SGLang process kind -> pid


def union_length(intervals: Iterable[tuple[float, float]], lo: float, hi: float) -> float:
    """Length of the union of intervals clipped to ``[lo, hi]``."""
    clipped = sorted((max(a, lo), min(b, hi)) for a, b in intervals if min(b, hi) > max(a, lo))
    total, cur_a, cur_b = 0.0, None, None
    for a, b in clipped:
        if cur_b is None or a > cur_b:
            if cur_b is not None:
                total += cur_b - cur_a
            cur_a, cur_b = a, b
        elif b > cur_b:
            cur_b = b
    if cur_b is not None:
        total += cur_b - cur_a
    return total


def coverage(stages: Sequence[dict[str, Any]], ttft_s: float | None) -> tuple[float, float]:
    """``(attributed_s, coverage)``: union of non-root stage intervals inside ``[0, ttft_s]``."""
    if not ttft_s or ttft_s <= 0:
        return 0.0, 0.0
    spans = [(s["start_s"], s["start_s"] + s["dur_s"]) for s in stages if s["name"] != ROOT]
    attributed = union_length(spans, 0.0, ttft_s)
    return attributed, attributed / ttft_s


def stage_dicts(events: Iterable[StageEvent], arrival: float) -> list[dict[str, Any]]:
    """Stage events as record entries, relative to arrival, in catalogue-then-time order."""
    out = [
        {
            "name": e.name,
            "process": e.process,
            "start_s": round(e.t0 - arrival, 9),
            "dur_s": round(max(0.0, e.t1 - e.t0), 9),
            "clock": e.clock,
            "attrs": e.attrs,
        }
        for e in events
    ]
    out.sort(key=lambda s: (s["start_s"], ORDER.get(s["name"], 999)))
    return out
