"""``bench --experiment resolution``: what each stage costs per image size, and which stages scale.

Per image shape (width x height) and kind (a new image; the same image repeated, so the caches hit):
the image's megapixels and encoded bytes (from the bench, known without records), its visual tokens
(the record's ``images[].visual_tokens``: what the model's processor made of it), TTFT and each
stage's p50 and p95 (seconds per request, a repeated stage such as per-image ``mm.decode`` summed).

The fit: per kind and stage, ordinary least squares over the requests, ``seconds = intercept +
slope * x`` with ``x`` the request's megapixels, and again with its visual tokens. The slope gets a
95% percentile-bootstrap interval (requests resampled with their x); a stage ``scales`` only when
the interval lies above zero (``falls``: below zero; ``flat``: spans it; ``no interval``: fewer
than 3 requests or one size, or no numpy). A stage that is absent
from a request counts as 0 s there (a cache hit that skips it), and a stage is fitted only when at
least half of the kind's requests ran it. Per-request values rather than per-shape p50s: the
interval then reflects the spread of the requests, not only of seven medians.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable
from typing import Any

from ..stages import DISPLAY_ORDER, ROOT
from .analysis import format_ms, is_ok, quantile, stage_totals

EXPERIMENT = "resolution"
TTFT = "TTFT"
SCALES, FLAT, FALLS, NO_INTERVAL = "scales", "flat", "falls", "no interval"
XS = {"megapixels": 1.0, "visual_tokens": 1000.0}
"""The fits' x variables and the unit a slope is given per (1 megapixel; 1000 visual tokens)."""


SHAPE_KEYS = {"width": int, "height": int, "image_bytes": int, "kind": str, "aspect": str}


def resolution_lines(lines: Iterable[dict[str, Any]]) -> list[dict[str, Any]]:
    """The bench lines of the resolution experiment (bench key ``experiment: resolution``) that carry
    the image's shape (a hand-edited line without it is left out rather than breaking the report)."""
    return [
        ln
        for ln in lines
        if isinstance(b := ln.get("bench"), dict)
        and b.get("experiment") == EXPERIMENT
        and all(isinstance(b.get(k), t) and not isinstance(b.get(k), bool) for k, t in SHAPE_KEYS.items())
        and b["width"] > 0
        and b["height"] > 0
    ]


def megapixels(line: dict[str, Any]) -> float:
    b = line["bench"]
    return b["width"] * b["height"] / 1e6


def visual_tokens(line: dict[str, Any]) -> int | None:
    imgs = line.get("images") or []
    return sum(int(i.get("visual_tokens") or 0) for i in imgs) if imgs else None


def fit_line(xs: list[float], ys: list[float], seed: int = 0) -> dict[str, Any]:
    """Least squares ``y = intercept + slope * x`` and the slope's 95% bootstrap interval."""
    n = len(xs)
    mx, my = sum(xs) / n, sum(ys) / n
    sxx = sum((x - mx) ** 2 for x in xs)
    slope = sum((x - mx) * (y - my) for x, y in zip(xs, ys, strict=True)) / sxx if sxx > 0 else float("nan")
    try:
        from ..bench.stats import bootstrap_slope_ci
    except ImportError:  # the bootstrap is numpy's; plain report runs without it
        lo = hi = float("nan")
    else:
        lo, hi = bootstrap_slope_ci(xs, ys, seed=seed)
    verdict = NO_INTERVAL if lo != lo else SCALES if lo > 0 else FALLS if hi < 0 else FLAT
    return {"slope": slope, "intercept": my - slope * mx, "ci": [lo, hi], "verdict": verdict, "n": n}


def _cell(lines: list[dict[str, Any]]) -> dict[str, Any]:
    b = lines[0]["bench"]
    ok = [ln for ln in lines if ln["bench"].get("ok")]
    recs = [ln for ln in ok if is_ok(ln)]
    per_stage: dict[str, list[float]] = defaultdict(list)
    for rec in recs:
        for stage, secs in stage_totals(rec).items():
            if stage != ROOT:
                per_stage[stage].append(secs)
    client = [c for ln in ok if isinstance(c := ln["bench"].get("client_ttft_s"), float)]
    tokens = [t for ln in recs if (t := visual_tokens(ln)) is not None]
    return {
        "width": b["width"],
        "height": b["height"],
        "aspect": b["aspect"],
        "kind": b["kind"],
        "megapixels": megapixels(lines[0]),
        "bytes": quantile([ln["bench"]["image_bytes"] for ln in lines], 0.5),
        "visual_tokens": quantile(tokens, 0.5) if tokens else None,
        "n": len(lines),
        "errors": len(lines) - len(ok),
        "records": len(recs),
        "client_ttft_p50": quantile(client, 0.5),
        "client_ttft_p95": quantile(client, 0.95),
        "ttft_p50": quantile([r["ttft_s"] for r in recs], 0.5),
        "ttft_p95": quantile([r["ttft_s"] for r in recs], 0.95),
        "stages": {
            s: {"p50": quantile(v, 0.5), "p95": quantile(v, 0.95), "n": len(v)}
            for s, v in sorted(per_stage.items(), key=lambda kv: DISPLAY_ORDER.get(kv[0], 999))
        },
    }


def _fits(recs: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    """Per stage (and TTFT), per x variable: the fit over these requests (one kind)."""
    totals = [stage_totals(r) for r in recs]
    counts: dict[str, int] = defaultdict(int)
    for t in totals:
        for s in t:
            counts[s] += 1
    names = [TTFT] + sorted(
        (s for s, c in counts.items() if s != ROOT and 2 * c >= len(recs)), key=lambda s: DISPLAY_ORDER.get(s, 999)
    )
    xs = {"megapixels": [megapixels(r) for r in recs], "visual_tokens": [visual_tokens(r) or 0 for r in recs]}
    out: dict[str, dict[str, Any]] = {}
    for i, name in enumerate(names):
        ys = [r["ttft_s"] for r in recs] if name == TTFT else [t.get(name, 0.0) for t in totals]
        out[name] = {
            var: {**fit_line(x, ys, seed=i), "per": unit}
            for (var, x), unit in zip(xs.items(), XS.values(), strict=True)
        }
    return out


def resolution_summary(lines: Iterable[dict[str, Any]]) -> dict[str, Any]:
    """Cells (one per shape and kind, in order of pixels) and per kind the fits (see the module)."""
    lines = resolution_lines(lines)
    cells: dict[tuple[int, int, str], list[dict[str, Any]]] = defaultdict(list)
    for ln in lines:
        b = ln["bench"]
        cells[(b["width"], b["height"], b["kind"])].append(ln)
    ordered = sorted(cells.items(), key=lambda kv: (kv[0][0] * kv[0][1], kv[0][0], kv[0][2]))
    fits = {}
    for kind in dict.fromkeys(k[2] for k, _ in ordered):
        recs = [ln for ln in lines if ln["bench"]["kind"] == kind and is_ok(ln)]
        if len({megapixels(r) for r in recs}) >= 2:  # a line needs two sizes
            fits[kind] = _fits(recs)
    return {"cells": [_cell(v) for _, v in ordered], "fits": fits}


def format_slope(f: dict[str, Any]) -> str:
    """``slope [lo, hi] ms per unit``."""
    k = 1e3 * f["per"]
    return f"{f['slope'] * k:+.3f} [{f['ci'][0] * k:+.3f}, {f['ci'][1] * k:+.3f}]"


def format_resolution(summary: dict[str, Any]) -> list[str]:
    """The bench's text: per shape and kind the sizes, TTFT and top stages; per kind the fits."""
    if not summary["cells"]:
        return []
    out = [
        "== resolution: per image shape (p50/p95 ms over the requests with a record)",
        f"   {'shape':<11}{'kind':<10}{'MP':>7}{'bytes':>10}{'tokens':>8}{'n':>4}{'TTFT p50':>10}{'p95':>9}  top stages p50 ms",
    ]
    for c in summary["cells"]:
        tokens = "-" if c["visual_tokens"] is None else f"{c['visual_tokens']:.0f}"
        top = sorted(c["stages"].items(), key=lambda kv: -kv[1]["p50"])[:3]
        shape = f"{c['width']}x{c['height']}"
        out.append(
            f"   {shape:<11}{c['kind']:<10}{c['megapixels']:>7.3f}"
            f"{c['bytes']:>10.0f}{tokens:>8}{c['n']:>4}{format_ms(c['ttft_p50'], 2):>10}{format_ms(c['ttft_p95'], 2):>9}  "
            + ", ".join(f"{s} {format_ms(v['p50'], 2)}/{format_ms(v['p95'], 2)}" for s, v in top)
        )
    for kind, fits in summary["fits"].items():
        out += [
            "",
            f"== resolution fit, {kind} images: seconds = intercept + slope * x per request; slope with 95% bootstrap CI;",
            "   'scales' only when the interval is above zero",
            f"   {'stage':<26}{'ms per MP [95% CI]':<34}{'at 0 MP':>9}  {'':<7}{'ms per 1k tokens [95% CI]':<34}{'at 0':>8}",
        ]
        for stage, f in fits.items():
            mp, vt = f["megapixels"], f["visual_tokens"]
            out.append(
                f"   {stage:<26}{format_slope(mp):<34}{format_ms(mp['intercept'], 2):>9}  {mp['verdict']:<7}"
                f"{format_slope(vt):<34}{format_ms(vt['intercept'], 2):>8}  {vt['verdict']}"
            )
        grows = [s for s, f in fits.items() if s != TTFT and f["megapixels"]["verdict"] == SCALES]
        flat = [s for s, f in fits.items() if s != TTFT and f["megapixels"]["verdict"] != SCALES]
        out.append(f"   scale with pixels: {', '.join(grows) or 'none'}; do not: {', '.join(flat) or 'none'}")
    return out
