"""``report --compare BASE NEW``: per group and stage, the change of the median, with a confidence interval.

Two record files (two servers, two SGLang versions, a cache on and off) are compared group by group
(``report_group``: bench experiment / variant, else request kind). A group counts on a side when it
has at least one timed request there (``is_ok``); only groups timed on both sides are compared, the
others are listed as one-sided, since a delta against nothing is not a delta.

Per group: TTFT and every stage's p50 and p95 on each side, and ``delta_p50 = p50(NEW) - p50(BASE)``
with a bootstrap interval (:func:`~sglang_mmtrace.bench.stats.bootstrap_median_diff_ci`: the
sides are resampled independently, since requests of two runs do not pair up), 95% unless
``--confidence`` says otherwise: at 95% about one stage in twenty whose time did not move is still
called a change, so a check of many stages, or a check that must not cry wolf (an A/A in CI), asks
for a higher level. A stage absent from a request counts as 0 s for it, so a stage that a cache
skips shows its whole saving instead of dropping out of the comparison. A delta whose interval
spans zero is labelled ``no change``.

Ranking, the largest effect on TTFT first: leaf stages (no child stage in the group) before the
stages that contain others, since a parent's delta repeats its children's (``mm.process`` holds
``mm.decode``) and ranked among them it would always come first and name no cause; within each,
the changes (interval clear of zero) before the ``no change`` ones, since a noisy stage (a
bimodal wait) can have a large median difference that its interval shows to be chance; then by
``|delta_p50|``. Median coverage and the cache
hit ratios are given side by side, because a changed hit ratio is usually the reason for a delta.

Point values use :func:`~sglang_mmtrace.report.analysis.quantile` (the one percentile of ``report``
and the bench); the bootstrap needs numpy, which plain ``report`` does not.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable
from typing import Any

from ..bench.stats import bootstrap_median_diff_ci
from ..stages import DISPLAY_ORDER, ROOT
from .analysis import (
    CACHES,
    cache_ratios,
    format_ms,
    format_ratio,
    group_records,
    is_ok,
    parent_stages,
    quantile,
    report_group,
    stage_totals,
)

NO_CHANGE = "no change"
SLOWER = "slower"
FASTER = "faster"
NO_INTERVAL = "no interval"
"""Verdicts: the interval spans zero, lies above it (NEW takes longer), below it, or a side has < 2 requests."""

SIDES = ("base", "new")
CONFIDENCE = 0.95
"""The interval's default level (``report --compare --confidence``)."""


def level(confidence: float) -> str:
    """``95%``, ``99.9%``: the level as the table, page and help text print it."""
    return f"{confidence * 100:g}%"


def verdict(ci: list[float] | None) -> str:
    """What the interval of ``NEW - BASE`` says: only an interval clear of zero is a change."""
    if ci is None:
        return NO_INTERVAL
    lo, hi = ci
    if lo <= 0.0 <= hi:
        return NO_CHANGE
    return SLOWER if lo > 0.0 else FASTER


def delta(base: list[float], new: list[float], seed: int = 0, confidence: float = CONFIDENCE) -> dict[str, Any]:
    """p50/p95 of each side (seconds), ``delta_p50`` (NEW - BASE), its interval at ``confidence`` and verdict.

    ``ci`` is None (JSON null, not NaN) when a side has fewer than 2 values."""
    lo, hi = bootstrap_median_diff_ci(base, new, alpha=1.0 - confidence, seed=seed)
    ci = None if math.isnan(lo) else [lo, hi]
    return {
        "base_p50": quantile(base, 0.5),
        "base_p95": quantile(base, 0.95),
        "new_p50": quantile(new, 0.5),
        "new_p95": quantile(new, 0.95),
        "delta_p50": quantile(new, 0.5) - quantile(base, 0.5),
        "ci": ci,
        "verdict": verdict(ci),
    }


def compare_group(
    base: list[dict[str, Any]], new: list[dict[str, Any]], seed: int = 0, confidence: float = CONFIDENCE
) -> dict[str, Any]:
    """One group's comparison from its timed records on each side (both non-empty)."""
    sides = dict(zip(SIDES, (base, new), strict=True))
    totals = {side: [stage_totals(r) for r in recs] for side, recs in sides.items()}
    names = {n for side in SIDES for t in totals[side] for n in t if n != ROOT}
    parents = parent_stages(names)
    stages = []
    for name in names:
        values = {side: [t.get(name, 0.0) for t in totals[side]] for side in SIDES}
        present = {side: sum(1 for t in totals[side] if name in t) for side in SIDES}
        stages.append(
            {
                "stage": name,
                **delta(values["base"], values["new"], seed, confidence),
                "present": present,
                "leaf": name not in parents,
            }
        )
    stages.sort(
        key=lambda s: (
            not s["leaf"],
            s["verdict"] in (NO_CHANGE, NO_INTERVAL),
            -abs(s["delta_p50"]),
            DISPLAY_ORDER.get(s["stage"], 999),
            s["stage"],
        )
    )
    return {
        "n": {side: len(recs) for side, recs in sides.items()},
        "ttft": delta([r["ttft_s"] for r in base], [r["ttft_s"] for r in new], seed, confidence),
        "coverage_p50": {side: quantile((r["coverage"] for r in recs), 0.5) for side, recs in sides.items()},
        "cache": {side: cache_ratios(recs) for side, recs in sides.items()},
        "stages": stages,
    }


def compare(
    base: Iterable[dict[str, Any]],
    new: Iterable[dict[str, Any]],
    group: Callable[[dict[str, Any]], str] = report_group,
    seed: int = 0,
    confidence: float = CONFIDENCE,
) -> dict[str, Any]:
    """``groups``: the comparison of every group timed on both sides (in BASE's order), plus
    ``only_base`` / ``only_new``: the groups timed on one side only, ``failed`` per side and group,
    and the intervals' ``confidence``.

    Failed requests are not timed; they are counted so that a group whose NEW requests fail shows as
    one-sided with its failures, not as vanished."""
    grouped = {side: group_records(recs, group) for side, recs in zip(SIDES, (base, new), strict=True)}
    timed = {side: {g: [r for r in recs if is_ok(r)] for g, recs in grouped[side].items()} for side in SIDES}
    timed = {side: {g: recs for g, recs in timed[side].items() if recs} for side in SIDES}
    failed = {
        side: {g: n for g, recs in grouped[side].items() if (n := sum(1 for r in recs if not is_ok(r)))}
        for side in SIDES
    }
    common = [g for g in timed["base"] if g in timed["new"]]
    return {
        "confidence": confidence,
        "groups": {g: compare_group(timed["base"][g], timed["new"][g], seed, confidence) for g in common},
        "only_base": [g for g in timed["base"] if g not in timed["new"]],
        "only_new": [g for g in timed["new"] if g not in timed["base"]],
        "failed": failed,
    }


def format_ci(ci: list[float] | None) -> str:
    """``[+1.20, +3.40]`` in ms, or ``-`` without an interval."""
    return "-" if ci is None else f"[{ci[0] * 1e3:+.2f}, {ci[1] * 1e3:+.2f}]"


def format_compare(comparison: dict[str, Any], base_label: str, new_label: str) -> str:
    """One block per compared group (TTFT line, coverage and cache lines, ranked stage table, in ms),
    then the groups found on one side only."""
    ci_level = level(comparison["confidence"])
    lines = [
        f"BASE = {base_label}",
        f"NEW  = {new_label}",
        f"delta = p50(NEW) - p50(BASE) with a {ci_level} bootstrap interval; 'no change' when it spans zero;",
        "stages ranked: the changes by |delta|, then the rest; stages containing others last",
        "",
    ]
    for name, g in comparison["groups"].items():
        t = g["ttft"]
        failed = [comparison["failed"][side].get(name, 0) for side in SIDES]
        lines += [
            f"== {name}  (n={g['n']['base']} vs {g['n']['new']}"
            + (f"; failed {failed[0]} vs {failed[1]})" if any(failed) else ")"),
            f"   TTFT p50 {format_ms(t['base_p50'], 2)} -> {format_ms(t['new_p50'], 2)} ms: {t['delta_p50'] * 1e3:+.2f} ms"
            f" {format_ci(t['ci'])} {t['verdict']}; p95 {format_ms(t['base_p95'], 2)} -> {format_ms(t['new_p95'], 2)} ms",
            f"   coverage median {g['coverage_p50']['base']:.3f} -> {g['coverage_p50']['new']:.3f}",
            "   cache hits: "
            + ", ".join(
                f"{c} {format_ratio(g['cache']['base'][c])} -> {format_ratio(g['cache']['new'][c])}"
                for c in (*CACHES, "prefix_tokens")
            ),
            f"   {'stage':<30}{'BASE p50':>9}{'NEW p50':>9}{'delta':>9}  {ci_level + ' CI':<18}"
            f"{'BASE p95':>9}{'NEW p95':>9}{'present':>9}  verdict",
        ]
        for i, s in enumerate(g["stages"]):
            if not s["leaf"] and (i == 0 or g["stages"][i - 1]["leaf"]):
                lines.append("   -- stages that contain the ones above (their delta includes their children's):")
            present = f"{s['present']['base']}/{s['present']['new']}"
            lines.append(
                f"   {s['stage']:<30}{format_ms(s['base_p50'], 2):>9}{format_ms(s['new_p50'], 2):>9}{s['delta_p50'] * 1e3:>+9.2f}"
                f"  {format_ci(s['ci']):<18}{format_ms(s['base_p95'], 2):>9}{format_ms(s['new_p95'], 2):>9}{present:>9}  {s['verdict']}"
            )
        lines.append("")
    for key, side in (("only_base", "BASE"), ("only_new", "NEW")):
        for name in comparison[key]:
            other = "NEW" if side == "BASE" else "BASE"
            lines.append(f"only in {side} (no timed request in {other}): {name}")
    return "\n".join(lines).rstrip() + "\n"
