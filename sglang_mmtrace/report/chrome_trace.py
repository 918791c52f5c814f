"""``report --chrome-trace``: the records as a Trace Event Format file (Perfetto, chrome://tracing).

One track (pid) per SGLang process, one complete event (``"ph": "X"``) per stage per request, on
one time base (``arrival_unix_s + start_s``, in microseconds from the first arrival, the format's unit). Slices on one thread
must nest without partial overlap, but stages of one request overlap across processes and
concurrent requests overlap in time; so each request gets its own thread lane(s) in each process,
and a slice that would partly overlap another in its lane opens a further lane for that request.
Times are handled in integer nanoseconds so that float rounding cannot turn adjacent stages into
overlapping ones.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterable
from typing import Any

from ..stages import API, DETOKENIZER, DISPLAY_ORDER, SCHEDULER
from .analysis import report_group

PROCESS_PIDS: dict[str, int] = {API: 1, SCHEDULER: 2, DETOKENIZER: 3}
"""Track ids: the roles, not OS pids (records of several servers share one file)."""


def _ns(seconds: float) -> int:
    return round(seconds * 1e9)


def _us(ns: int) -> float:
    return ns / 1000.0


def _place(lanes: list[list[int]], start: int, end: int) -> int:
    """Index of the first lane where [start, end] nests (a new lane if none); pushes it there.

    Each lane is a stack of open slice ends; slices arrive sorted by (start, -end), so an end at or
    before ``start`` is closed for good and can be popped.
    """
    for i, stack in enumerate(lanes):
        while stack and stack[-1] <= start:
            stack.pop()
        if not stack or stack[-1] >= end:
            stack.append(end)
            return i
    lanes.append([end])
    return len(lanes) - 1


def _metadata(name: str, pid: int, tid: int, args: dict[str, Any]) -> dict[str, Any]:
    return {"name": name, "ph": "M", "ts": 0, "pid": pid, "tid": tid, "args": args}


def build_trace(
    records: Iterable[dict[str, Any]], group: Callable[[dict[str, Any]], str] = report_group
) -> dict[str, Any]:
    """The trace as a dict: ``{"traceEvents": [...], "displayTimeUnit": "ms", "otherData": {...}}``."""
    recs = [r for r in records if r.get("stages") and r.get("arrival_unix_s") is not None]
    recs.sort(key=lambda r: r["arrival_unix_s"])
    base = recs[0]["arrival_unix_s"] if recs else 0.0
    events: list[dict[str, Any]] = []
    for process, pid in PROCESS_PIDS.items():
        events.append(_metadata("process_name", pid, 0, {"name": process}))
        events.append(_metadata("process_sort_index", pid, 0, {"sort_index": pid}))
    next_tid = dict.fromkeys(PROCESS_PIDS.values(), 1)
    for rec in recs:
        rid, label = str(rec.get("rid")), group(rec)
        arrival_ns = _ns(rec["arrival_unix_s"] - base)
        by_pid: dict[int, list[tuple[int, int, dict[str, Any]]]] = {}
        for stage in rec["stages"]:
            pid = PROCESS_PIDS.get(stage.get("process"), PROCESS_PIDS[API])
            start = arrival_ns + _ns(stage["start_s"])
            by_pid.setdefault(pid, []).append((start, start + max(0, _ns(stage["dur_s"])), stage))
        for pid, slices in by_pid.items():
            slices.sort(key=lambda s: (s[0], -s[1], DISPLAY_ORDER.get(s[2]["name"], 999)))
            lanes: list[list[int]] = []
            tids: list[int] = []
            for start, end, stage in slices:
                lane = _place(lanes, start, end)
                if lane == len(tids):
                    tids.append(next_tid[pid])
                    next_tid[pid] += 1
                    suffix = f" ({lane + 1})" if lane else ""
                    events.append(_metadata("thread_name", pid, tids[lane], {"name": f"{rid[:8]} {label}{suffix}"}))
                    events.append(_metadata("thread_sort_index", pid, tids[lane], {"sort_index": tids[lane]}))
                events.append(
                    {
                        "name": stage["name"],
                        "cat": stage.get("process", API),
                        "ph": "X",
                        "ts": _us(start),
                        "dur": _us(end - start),
                        "pid": pid,
                        "tid": tids[lane],
                        "args": {
                            "rid": rid,
                            "group": label,
                            "clock": stage.get("clock"),
                            "attrs": stage.get("attrs") or {},
                        },
                    }
                )
    return {
        "traceEvents": events,
        "displayTimeUnit": "ms",
        "otherData": {"source": "sglang-mmtrace report", "time_base_unix_s": base, "requests": len(recs)},
    }


def write_trace(
    records: Iterable[dict[str, Any]], path: str, group: Callable[[dict[str, Any]], str] = report_group
) -> int:
    """Write the trace JSON; returns the number of slices (X events)."""
    trace = build_trace(records, group)
    with open(path, "w", encoding="utf-8") as fh:
        json.dump(trace, fh)
    return sum(1 for e in trace["traceEvents"] if e["ph"] == "X")
