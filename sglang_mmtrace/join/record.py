"""Build the per-request record (docs/contract.md, "Per-request record") from the joined stage events.

Pure functions: the collector calls them off the request path, and tests call them directly.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

from ..stages import ORDER, ROOT, STAGES


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


@dataclass(slots=True, frozen=True)
class HttpFacts:
    """The HTTP exchange as the API process's middleware saw it, for the root span's HTTP server
    attributes: the path without its query string, the matched route's template (None where none
    matched), the status sent (None where no response started), whether the body went out in more
    than one message (a streamed response). No header, no body."""

    method: str
    scheme: str
    path: str
    route: str | None = None
    status_code: int | None = None
    streamed: bool = False


@dataclass(slots=True)
class EmitContext:
    """What sinks may need beyond the record: never written to the record itself."""

    carrier: dict[str, str] = field(default_factory=dict)
    """The incoming trace context's headers (``OTEL_PROPAGATORS``' fields: by default ``traceparent``,
    ``tracestate``, ``baggage``), for the configured propagator to extract."""
    pids: dict[str, int] = field(default_factory=dict)  # SGLang process kind -> pid
    http: HttpFacts | None = None  # None for an offline Engine call


def merge_chunks(events: list[StageEvent]) -> list[StageEvent]:
    """One interval per stage, as the contract has it, where SGLang ran a stage in parts.

    SGLang splits a prompt longer than ``--chunked-prefill-size`` into chunks, one prefill forward
    each, and the scheduler's hooks time each chunk's forward (``model.*``, ``scheduler.overlap_wait``).
    A stage that comes more than once becomes one interval from its first part's start to its last
    part's end, with the first part's attributes (where the request entered the forward: its batch,
    its embedding-cache outcome) plus ``chunks``, how many parts, and ``chunks_s``, their summed
    durations (the interval also holds the gaps between them). Per-image stages repeat by design and
    stay as they are. New events, never edited ones: a batch event's attrs are shared by all its
    requests.
    """
    parts: dict[str, list[StageEvent]] = {}
    for e in events:
        parts.setdefault(e.name, []).append(e)
    if len(parts) == len(events):
        return events
    out = []
    for name, group in parts.items():
        stage = STAGES.get(name)
        if len(group) == 1 or (stage is not None and stage.per_image):
            out.extend(group)
            continue
        first = group[0]
        attrs = {**first.attrs, "chunks": len(group), "chunks_s": round(sum(e.t1 - e.t0 for e in group), 9)}
        t0, t1 = min(e.t0 for e in group), max(e.t1 for e in group)
        out.append(StageEvent(name, first.process, t0, t1, first.clock, attrs, first.pid))
    return out


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


def stage_totals(rec: dict[str, Any]) -> dict[str, float]:
    """Seconds per stage name for one request (repeated stages, e.g. per image, are summed).

    A ``skipped`` marker (the encoder the radix prefix made unnecessary) is no work: not counted."""
    out: dict[str, float] = defaultdict(float)
    for s in rec.get("stages", ()):
        if not s.get("attrs", {}).get("skipped"):
            out[s["name"]] += s["dur_s"]
    return out
