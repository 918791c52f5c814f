"""``bench --experiment concurrency``: the TTFT percentiles per level, and what the slow tail is made of.

Per level (number of concurrent streams): client and server TTFT p50/p95/p99. Then the slowest 5%
of the level's requests with a record (at least one) against the level's median request (the one
whose TTFT is the median; the lower middle for an even count), both split into their parts: each
stage's exclusive time (:func:`~sglang_mmtrace.report.analysis.exclusive_times`: the time it was the
most specific stage running) plus the unattributed rest. A request's parts add up to its TTFT, so
the tail's mean parts add up to the tail's mean TTFT, and the growth of the parts (tail mean minus
the median request) adds up to the tail's TTFT growth: shares of it are shares of a whole.

Batched stages (the catalogue's ``batch`` stages: one vision-encoder call, one prefill forward for
several requests) are split in two parts: the request's ``own share`` (its exclusive time divided
by the number of requests that shared the interval) and the rest, time spent on its ``batch
mates``. Summed over the requests of one batch, the own shares give the interval once, so a tail
of several requests from one batch does not count the batch's work several times. The number of
requests is the vision encoder's ``requests`` attribute (the requests whose images that call
encoded), else the stage's ``batch_size`` (the requests of the forward).
"""

from __future__ import annotations

import math
from collections import defaultdict
from collections.abc import Iterable
from typing import Any

from ..stages import DISPLAY_ORDER, STAGES
from .analysis import exclusive_times, is_ok, quantile, unattributed_s
from .analysis import format_ms as _ms

EXPERIMENT = "concurrency"
UNATTRIBUTED = "unattributed"
OWN, MATES = "own share", "batch mates"
TAIL_PERCENT = 5  # the tail: the slowest 5% of a level's requests (at least one)


def batch_requests(rec: dict[str, Any], stage: str) -> int | None:
    """How many requests shared this request's ``stage`` interval (None: not a batched stage)."""
    if stage not in STAGES or not STAGES[stage].batch:
        return None
    for s in rec.get("stages", ()):
        attrs = s.get("attrs") or {}
        if s["name"] == stage and not attrs.get("skipped"):
            n = attrs.get("requests", attrs.get("batch_size"))
            return int(n) if n else 1
    return None


def parts(rec: dict[str, Any]) -> dict[str, float]:
    """Seconds per part of this request's TTFT (they add up to ``ttft_s``): each stage's exclusive
    time, batched stages as ``"<stage> · own share"`` and ``"<stage> · batch mates"``, then
    ``unattributed``."""
    out: dict[str, float] = {}
    for stage, secs in exclusive_times(rec).items():
        k = batch_requests(rec, stage)
        if k is None:
            out[stage] = secs
        else:
            out[f"{stage} · {OWN}"] = secs / k
            out[f"{stage} · {MATES}"] = secs - secs / k
    out[UNATTRIBUTED] = unattributed_s(rec)
    return out


def part_stage(part: str) -> str:
    """The stage a part belongs to (``unattributed`` for the rest)."""
    return part.split(" · ", 1)[0]


def part_order(part: str) -> tuple[int, str]:
    stage = part_stage(part)
    return (DISPLAY_ORDER.get(stage, 999) if stage != UNATTRIBUTED else 1000, part)


def _mean_parts(recs: list[dict[str, Any]]) -> dict[str, float]:
    total: dict[str, float] = defaultdict(float)
    for r in recs:
        for p, v in parts(r).items():
            total[p] += v / len(recs)
    return dict(total)


def _level(lines: list[dict[str, Any]]) -> dict[str, Any]:
    ok = [ln for ln in lines if ln["bench"].get("ok")]
    recs = sorted((ln for ln in ok if is_ok(ln)), key=lambda r: r["ttft_s"])
    client = [c for ln in ok if isinstance(c := ln["bench"].get("client_ttft_s"), float)]
    ttft = [r["ttft_s"] for r in recs]
    out: dict[str, Any] = {
        "n": len(lines),
        "errors": len(lines) - len(ok),
        "records": len(recs),
        **{f"client_ttft_p{q}": quantile(client, q / 100) for q in (50, 95, 99)},
        **{f"ttft_p{q}": quantile(ttft, q / 100) for q in (50, 95, 99)},
    }
    if not recs:
        return out
    k = max(1, math.ceil(len(recs) * TAIL_PERCENT / 100))
    tail, median = recs[-k:], recs[(len(recs) - 1) // 2]
    tail_parts, median_parts = _mean_parts(tail), parts(median)
    names = sorted({*tail_parts, *median_parts}, key=part_order)
    growth = sum(tail_parts.values()) - sum(median_parts.values())
    rows = [
        {
            "part": p,
            "stage": part_stage(p),
            "tail_s": tail_parts.get(p, 0.0),
            "median_s": median_parts.get(p, 0.0),
            "growth_s": tail_parts.get(p, 0.0) - median_parts.get(p, 0.0),
        }
        for p in names
    ]
    for row in rows:
        row["share_of_growth"] = row["growth_s"] / growth if growth > 0 else None
    batches = {
        stage: {
            "tail_requests": sum(batch_requests(r, stage) or 1 for r in tail) / len(tail),
            "median_requests": batch_requests(median, stage),
        }
        for stage in dict.fromkeys(part_stage(p) for p in names if f" · {OWN}" in p)
    }
    out["tail"] = {
        "n": len(tail),
        "rids": [r["rid"] for r in tail],
        "ttft_mean": sum(r["ttft_s"] for r in tail) / len(tail),
        "parts_sum": sum(tail_parts.values()),
        "median_rid": median["rid"],
        "median_ttft": median["ttft_s"],
        "growth_s": growth,
        "parts": rows,
        "batches": batches,
    }
    return out


def tail_summary(lines: Iterable[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    """Per level (``str(streams)``, in increasing order): percentiles and the tail's parts."""
    levels: dict[int, list[dict[str, Any]]] = defaultdict(list)
    for ln in lines:
        b = ln.get("bench")
        if isinstance(b, dict) and b.get("experiment") == EXPERIMENT and type(b.get("concurrency")) is int:
            levels[b["concurrency"]].append(ln)
    return {str(c): _level(levels[c]) for c in sorted(levels)}


def top_growth(level: dict[str, Any], k: int = 3) -> list[dict[str, Any]]:
    """The stages (own share and batch mates taken together) whose time grew most in the tail."""
    by_stage: dict[str, float] = defaultdict(float)
    for row in level["tail"]["parts"]:
        by_stage[row["stage"]] += row["growth_s"]
    growth = level["tail"]["growth_s"]
    ranked = sorted(by_stage.items(), key=lambda kv: -kv[1])[:k]
    return [{"stage": s, "growth_s": g, "share": g / growth if growth > 0 else None} for s, g in ranked if g > 0]


def tail_sentence(streams: str, level: dict[str, Any]) -> str:
    """``at 64 streams the slowest 5% (4 requests, TTFT 812 ms vs the median's 240 ms) grew by 572 ms:
    scheduler.queue +401 ms (70%), model.vision_encoder +120 ms (21%; batch of 9.5 requests, ...)``."""
    t = level["tail"]
    bits = []
    for g in top_growth(level):
        share = f"{g['share'] * 100:.0f}%" if g["share"] is not None else "-"
        batch = t["batches"].get(g["stage"])
        if batch and max(batch["tail_requests"], batch["median_requests"] or 1) > 1:
            rows = {r["part"]: r for r in t["parts"] if r["stage"] == g["stage"]}
            own, mates = rows.get(f"{g['stage']} · {OWN}"), rows.get(f"{g['stage']} · {MATES}")
            share += (
                f"; batches of {batch['tail_requests']:.1f} requests (the median's: {batch['median_requests'] or 1}), own share "
                f"{_ms(own['growth_s'] if own else 0.0)} ms, batch mates {_ms(mates['growth_s'] if mates else 0.0)} ms"
            )
        bits.append(f"{g['stage']} +{_ms(g['growth_s'])} ms ({share})")
    return (
        f"at {streams} stream{'s' if streams != '1' else ''} the slowest 5% ({t['n']} request{'s' if t['n'] != 1 else ''}, "
        f"TTFT {_ms(t['ttft_mean'])} ms vs the median's {_ms(t['median_ttft'])} ms) "
        + (f"grew by {_ms(t['growth_s'])} ms: " + ", ".join(bits) if bits else "did not grow")
    )


def format_tail(summary: dict[str, dict[str, Any]]) -> list[str]:
    """The bench's text: per level the percentiles, then one sentence on the tail."""
    if not summary:
        return []
    out = [
        "== concurrency: TTFT per level (ms), and what the slowest 5% grew by against the level's median request",
        "   (exclusive time per stage plus the unattributed rest, so the parts add up to TTFT; batched stages split"
        " into the request's own share and its batch mates')",
        f"   {'streams':>7}{'n':>5}{'rec':>5}{'client p50':>12}{'p95':>8}{'p99':>8}{'server p50':>12}{'p95':>8}{'p99':>8}",
    ]
    for c, lv in summary.items():
        out.append(
            f"   {c:>7}{lv['n']:>5}{lv['records']:>5}{_ms(lv['client_ttft_p50']):>12}{_ms(lv['client_ttft_p95']):>8}"
            f"{_ms(lv['client_ttft_p99']):>8}{_ms(lv['ttft_p50']):>12}{_ms(lv['ttft_p95']):>8}{_ms(lv['ttft_p99']):>8}"
        )
    out += [f"   {tail_sentence(c, lv)}" for c, lv in summary.items() if "tail" in lv]
    return out
