"""Read an Nsight Systems report (its sqlite export) back and set it beside the plugin's records.

``nsys export --type sqlite`` gives the ``sglang_mmtrace`` NVTX ranges (table ``NVTX_EVENTS``), the
CUDA API calls made on each thread (``CUPTI_ACTIVITY_KIND_RUNTIME``) and the GPU work they started
(``CUPTI_ACTIVITY_KIND_KERNEL``/``MEMCPY``/``MEMSET``, joined by correlation id). The GPU time of a
push/pop range is the span from the first to the last GPU operation launched inside it on its
thread: the same window the plugin's CUDA events bracket, measured by a different tool. That makes
the report an independent check of the plugin's ``clock == "cuda"`` stage durations.

Ranges are joined to records by request key (``sinks.nvtx.request_key`` of the record's ``rid``):
a range's int64 payload, or for a batch range the payloads of the marks inside it. Profiles taken
before the key existed name the rids in the message (``<stage> rid=<rid>``, ``<stage> n=<k>
rids=<a,b>``); those are read too, their rids turned into keys.
"""

from __future__ import annotations

import re
import sqlite3
import statistics
from bisect import bisect_right
from collections import defaultdict
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

from ..report.analysis import quantile
from ..sinks.nvtx import DOMAIN, request_key
from ..stages import DISPLAY_ORDER, MODEL_EMBED, MODEL_PREFILL, MODEL_VISION_ENCODER, STAGES

MARK, PUSH_POP, START_END, DOMAIN_CREATE = 34, 59, 60, 75
"""``NVTX_EVENTS.eventType`` values of Nsight Systems' sqlite schema."""
GPU_TABLES = ("CUPTI_ACTIVITY_KIND_KERNEL", "CUPTI_ACTIVITY_KIND_MEMCPY", "CUPTI_ACTIVITY_KIND_MEMSET")
_DETAIL = re.compile(r"^(?P<stage>\S+)(?: (?:rid=(?P<rid>\S+)|n=\d+ rids=(?P<rids>\S+)|.*))?$")

GPU_COMPARED = (MODEL_VISION_ENCODER, MODEL_PREFILL)
"""Stages whose CUDA-event durations the report can check: one push/pop range around the launches."""
REL_TOL, ABS_TOL_S = 0.10, 50e-6


@dataclass
class Range:
    """One ``sglang_mmtrace`` NVTX range and the GPU work launched inside it (times in ns)."""

    stage: str
    keys: tuple[int, ...]
    """The request keys of the requests it worked for (one, a batch's, or none)."""
    start: int
    end: int
    tid: int
    push_pop: bool
    gpu: list[tuple[int, int, int]] = field(default_factory=list)  # (launch time, gpu start, gpu end)
    rids: tuple[str, ...] = ()
    """The rids an old-format message names (``keys`` holds their keys); empty for the payload format."""

    def gpu_span_s(self, launched_after: int | None = None) -> float | None:
        ops = [(s, e) for t, s, e in self.gpu if launched_after is None or t >= launched_after]
        if not ops:
            return None
        return (max(e for _, e in ops) - min(s for s, _ in ops)) / 1e9


def _tables(db: sqlite3.Connection) -> set[str]:
    return {r[0] for r in db.execute("SELECT name FROM sqlite_master WHERE type='table'")}


def _domain_ids(db: sqlite3.Connection, has_strings: bool) -> list[int]:
    text = "COALESCE(text, (SELECT value FROM StringIds WHERE id = textId))" if has_strings else "text"
    rows = db.execute(f"SELECT domainId FROM NVTX_EVENTS WHERE eventType = ? AND {text} = ?", (DOMAIN_CREATE, DOMAIN))
    return [r[0] for r in rows]


def read_ranges(path: str) -> list[Range]:
    """Every closed range of the plugin's NVTX domain, with the GPU work launched inside push/pop ones."""
    db = sqlite3.connect(f"file:{path}?mode=ro", uri=True)
    try:
        tables = _tables(db)
        if "NVTX_EVENTS" not in tables:
            raise ValueError(f"{path}: no NVTX_EVENTS table (was the profile taken with -t nvtx?)")
        has_strings = "StringIds" in tables
        domains = _domain_ids(db, has_strings)
        if not domains:
            return []
        text = "COALESCE(e.text, s.value)" if has_strings else "e.text"
        join = "LEFT JOIN StringIds s ON s.id = e.textId" if has_strings else ""
        columns = {r[1] for r in db.execute("PRAGMA table_info(NVTX_EVENTS)")}
        payload = "e.int64Value" if "int64Value" in columns else "NULL"

        def events(kinds: tuple[int, ...], where: str) -> list[tuple[Any, ...]]:
            return db.execute(
                f"SELECT e.start, e.end, {text}, e.globalTid, e.eventType, {payload} FROM NVTX_EVENTS e {join} "
                f"WHERE e.domainId IN ({','.join('?' * len(domains))}) "
                f"AND e.eventType IN ({','.join('?' * len(kinds))}) AND {where} ORDER BY e.start",
                (*domains, *kinds),
            ).fetchall()

        ranges = [_range(*r) for r in events((PUSH_POP, START_END), "e.end IS NOT NULL") if r[2]]
        if payload != "NULL":
            marks = events((MARK,), "e.int64Value IS NOT NULL")
            _attach_marks(ranges, [(int(t), name, int(tid or 0), int(key)) for t, _, name, tid, _, key in marks])
        if "CUPTI_ACTIVITY_KIND_RUNTIME" in tables:
            _attach_gpu_work(db, tables, [r for r in ranges if r.push_pop])
        return ranges
    finally:
        db.close()


def _range(start: int, end: int, text: str, tid: int, kind: int, payload: int | None) -> Range:
    m = _DETAIL.match(text)
    stage = m["stage"] if m else text
    rids = (m["rid"],) if m and m["rid"] else tuple(m["rids"].split(",")) if m and m["rids"] else ()
    keys = tuple(request_key(r) for r in rids) if rids else (int(payload),) if payload is not None else ()
    return Range(stage, keys, int(start), int(end), int(tid or 0), kind == PUSH_POP, rids=rids)


def _attach_marks(ranges: list[Range], marks: list[tuple[int, str, int, int]]) -> None:
    """Each (time, stage, thread, key) mark -> the innermost range of its stage open on its thread then
    (a batch range's marks are made on its thread right after it opens)."""
    by_place: dict[tuple[int, str], list[Range]] = defaultdict(list)
    for r in ranges:  # in start order
        by_place[(r.tid, r.stage)].append(r)
    starts = {place: [r.start for r in rs] for place, rs in by_place.items()}
    for t, stage, tid, key in marks:
        place = (tid, stage)
        if place not in by_place:
            continue
        # ranges of one stage on one thread rarely nest: the latest one opened by ``t`` holds the mark
        rs = by_place[place]
        i = bisect_right(starts[place], t) - 1
        while i >= 0 and rs[i].end < t:
            i -= 1
        if i >= 0:
            rs[i].keys += (key,)


def _attach_gpu_work(db: sqlite3.Connection, tables: set[str], ranges: list[Range]) -> None:
    """CUDA API calls on a range's thread inside it -> the GPU operations they launched."""
    by_tid: dict[int, list[Range]] = defaultdict(list)
    for r in ranges:
        by_tid[r.tid].append(r)
    if not by_tid:
        return
    gpu: dict[tuple[int, int], tuple[int, int]] = {}
    for table in GPU_TABLES:
        if table in tables:
            for corr, pid, s, e in db.execute(f"SELECT correlationId, globalPid, start, end FROM {table}"):
                gpu[(int(pid) >> 24, int(corr))] = (int(s), int(e))
    tids = ",".join(str(t) for t in by_tid)
    lo, hi = min(r.start for r in ranges), max(r.end for r in ranges)
    calls = db.execute(
        "SELECT globalTid, start, correlationId FROM CUPTI_ACTIVITY_KIND_RUNTIME "
        f"WHERE globalTid IN ({tids}) AND start BETWEEN ? AND ? ORDER BY start",
        (lo, hi),
    )
    for tid, t, corr in calls:
        op = gpu.get((int(tid) >> 24, int(corr)))
        if op is None:
            continue
        for r in by_tid[tid]:
            if r.start <= t <= r.end:
                r.gpu.append((int(t), *op))


@dataclass
class Agreement:
    """One CUDA-event stage duration of a record next to the GPU span of its NVTX range."""

    stage: str
    rid: str
    event_s: float
    kernel_s: float

    @property
    def ok(self) -> bool:
        return abs(self.event_s - self.kernel_s) <= max(REL_TOL * self.kernel_s, ABS_TOL_S)


def _nested_end(r: Range, inner: Iterable[Range]) -> int | None:
    """Latest end of the vision-encoder / embedding ranges nested in ``r`` on its thread."""
    ends = [i.end for i in inner if i.tid == r.tid and r.start <= i.start and i.end <= r.end]
    return max(ends) if ends else None


def records_by_key(records: Iterable[dict[str, Any]]) -> dict[int, dict[str, Any]]:
    """Records by the request key of their rid; two rids with one key are both left out (no guess)."""
    by_key: dict[int, dict[str, Any]] = {}
    shared: set[int] = set()
    for rec in records:
        key = request_key(rec["rid"])
        if key in by_key and by_key[key]["rid"] != rec["rid"]:
            shared.add(key)
        by_key[key] = rec
    for key in shared:
        del by_key[key]
    return by_key


def compare(ranges: list[Range], records: Iterable[dict[str, Any]]) -> list[Agreement]:
    """Pair each CUDA-clocked ``model.vision_encoder`` / ``model.prefill`` stage with its range.

    ``model.prefill`` in a record starts where the embedding injection ended (the forward's range
    also holds the encoder and the injection), so only GPU work launched after the last nested
    ``model.vision_encoder``/``model.embed`` range counts for it.
    """
    by_key = records_by_key(records)
    inner = [r for r in ranges if r.push_pop and r.stage in (MODEL_VISION_ENCODER, MODEL_EMBED)]
    seen: dict[tuple[str, str], int] = defaultdict(int)
    out: list[Agreement] = []
    for r in ranges:
        if not r.push_pop or r.stage not in GPU_COMPARED:
            continue
        rec = next((by_key[k] for k in r.keys if k in by_key), None)
        if rec is None:
            continue
        rid = rec["rid"]
        stages = [
            s for s in rec["stages"] if s["name"] == r.stage and s["clock"] == "cuda" and not s["attrs"].get("skipped")
        ]
        idx = seen[(rid, r.stage)]
        seen[(rid, r.stage)] += 1
        if idx >= len(stages):
            continue
        after = _nested_end(r, inner) if r.stage == MODEL_PREFILL else None
        span = r.gpu_span_s(after)
        if span is not None:
            out.append(Agreement(r.stage, rid, stages[idx]["dur_s"], span))
    return out


def summary(ranges: list[Range], records: list[dict[str, Any]]) -> dict[str, Any]:
    """Per stage: NVTX ranges (count, host median), their GPU span median, and the records' median."""
    keys = {request_key(r["rid"]) for r in records}
    per_stage: dict[str, dict[str, Any]] = {}
    for stage in DISPLAY_ORDER:
        rs = [r for r in ranges if r.stage == stage and (not keys or keys.intersection(r.keys) or not r.keys)]
        durs = [
            s["dur_s"] for rec in records for s in rec["stages"] if s["name"] == stage and not s["attrs"].get("skipped")
        ]
        if not rs and not durs:
            continue
        gpu = [g for r in rs if (g := r.gpu_span_s()) is not None]
        per_stage[stage] = {
            "nvtx_ranges": len(rs),
            "nvtx_host_p50_s": statistics.median([(r.end - r.start) / 1e9 for r in rs]) if rs else None,
            "nvtx_gpu_p50_s": statistics.median(gpu) if gpu else None,
            "record_n": len(durs),
            "record_p50_s": statistics.median(durs) if durs else None,
            "record_clock": sorted({s["clock"] for rec in records for s in rec["stages"] if s["name"] == stage}),
        }
    agreements = compare(ranges, records)
    checks = {}
    for stage in GPU_COMPARED:
        rows = [a for a in agreements if a.stage == stage]
        if rows:
            errs = sorted(abs(a.event_s - a.kernel_s) for a in rows)
            checks[stage] = {
                "n": len(rows),
                "within_tolerance": sum(a.ok for a in rows),
                "abs_err_p50_s": quantile(errs, 0.5),
                "abs_err_max_s": errs[-1],
                "event_p50_s": statistics.median(a.event_s for a in rows),
                "kernel_p50_s": statistics.median(a.kernel_s for a in rows),
            }
    return {
        "stages": per_stage,
        "cuda_event_vs_kernels": checks,
        "unknown_stages": sorted({r.stage for r in ranges} - set(STAGES)),
    }


def format_summary(s: dict[str, Any]) -> str:
    def ms(v: float | None) -> str:
        return f"{v * 1e3:9.3f}" if v is not None else f"{'-':>9}"

    lines = [f"{'stage':<26}{'ranges':>7}{'nvtx p50':>10}{'gpu p50':>10}{'records':>8}{'rec p50':>10}  clock"]
    for stage, row in s["stages"].items():
        lines.append(
            f"{stage:<26}{row['nvtx_ranges']:>7}{ms(row['nvtx_host_p50_s'])} {ms(row['nvtx_gpu_p50_s'])}"
            f"{row['record_n']:>8}{ms(row['record_p50_s'])}  {','.join(row['record_clock'])}"
        )
    lines.append("(ms; nvtx p50 = host duration of the range, gpu p50 = first to last GPU op it launched)")
    for stage, c in s["cuda_event_vs_kernels"].items():
        lines.append(
            f"{stage}: CUDA events vs kernels in its NVTX range: {c['within_tolerance']}/{c['n']} within "
            f"max(10%, 50 us); |diff| p50 {c['abs_err_p50_s'] * 1e6:.1f} us, max {c['abs_err_max_s'] * 1e6:.1f} us; "
            f"event p50 {c['event_p50_s'] * 1e3:.3f} ms, kernels p50 {c['kernel_p50_s'] * 1e3:.3f} ms"
        )
    return "\n".join(lines)
