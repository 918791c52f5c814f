"""Per-stage tables from records (the demo's breakdown and ``sglang-mmtrace report``)."""

from __future__ import annotations

import json
import statistics
from collections import defaultdict
from collections.abc import Callable, Iterable
from typing import Any

from .stages import DISPLAY_ORDER, ROOT, STAGES


def read_jsonl(path: str) -> list[dict[str, Any]]:
    with open(path, encoding="utf-8") as fh:
        return [json.loads(line) for line in fh if line.strip()]


def request_kind(rec: dict[str, Any]) -> str:
    """A label derived from the record alone: what the caches did for this request."""
    if not rec.get("images"):
        return "text"
    cache = rec.get("cache") or {}
    if cache.get("image_prefix_hit"):
        return "image: prefix-cache hit"
    if cache.get("embedding") == "hit":
        return "image: embedding-cache hit"
    return "image: encoded"


def stage_totals(rec: dict[str, Any]) -> dict[str, float]:
    """Seconds per stage name for one request (repeated stages, e.g. per image, are summed)."""
    out: dict[str, float] = defaultdict(float)
    for s in rec.get("stages", ()):
        out[s["name"]] += s["dur_s"]
    return out


def percentile(values: list[float], q: float) -> float:
    if not values:
        return float("nan")
    ordered = sorted(values)
    idx = min(len(ordered) - 1, max(0, round(q * (len(ordered) - 1))))
    return ordered[idx]


def summarize(
    records: Iterable[dict[str, Any]], group: Callable[[dict[str, Any]], str] = request_kind
) -> dict[str, dict[str, Any]]:
    """Per group: n, ttft p50/p95, coverage min/median, and per stage p50/p95/share of TTFT."""
    groups: dict[str, list[dict[str, Any]]] = defaultdict(list)
    for rec in records:
        if rec.get("status") == "ok" and rec.get("ttft_s"):
            groups[group(rec)].append(rec)
    out: dict[str, dict[str, Any]] = {}
    for name, recs in groups.items():
        per_stage: dict[str, list[float]] = defaultdict(list)
        shares: dict[str, list[float]] = defaultdict(list)
        for rec in recs:
            for stage, dur in stage_totals(rec).items():
                per_stage[stage].append(dur)
                shares[stage].append(dur / rec["ttft_s"])
        ttfts = [r["ttft_s"] for r in recs]
        covs = [r["coverage"] for r in recs]
        out[name] = {
            "n": len(recs),
            "ttft_p50": percentile(ttfts, 0.5),
            "ttft_p95": percentile(ttfts, 0.95),
            "coverage_min": min(covs),
            "coverage_p50": statistics.median(covs),
            "stages": {
                s: {
                    "p50": percentile(v, 0.5),
                    "p95": percentile(v, 0.95),
                    "share": statistics.median(shares[s]),
                    "n": len(v),
                }
                for s, v in sorted(per_stage.items(), key=lambda kv: DISPLAY_ORDER.get(kv[0], 999))
            },
        }
    return out


def format_table(summary: dict[str, dict[str, Any]]) -> str:
    """One block per group: stages indented under their parents, in ms."""
    lines = []
    for name, g in summary.items():
        lines.append(
            f"== {name}  (n={g['n']})  TTFT p50 {g['ttft_p50'] * 1e3:.1f} ms, p95 {g['ttft_p95'] * 1e3:.1f} ms;"
            f" coverage min {g['coverage_min']:.3f}, median {g['coverage_p50']:.3f}"
        )
        lines.append(f"   {'stage':<34}{'p50 ms':>10}{'p95 ms':>10}{'share':>8}{'n':>5}")
        for stage, s in g["stages"].items():
            if stage == ROOT:
                continue
            depth = STAGES[stage].depth if stage in STAGES else 1
            label = "  " * max(0, depth - 1) + stage
            lines.append(
                f"   {label:<34}{s['p50'] * 1e3:>10.2f}{s['p95'] * 1e3:>10.2f}{s['share'] * 100:>7.1f}%{s['n']:>5}"
            )
        lines.append("")
    return "\n".join(lines)
