"""``report --compare BASE NEW --html``: the comparison as one self-contained page (inline CSS and SVG).

Per group compared (see :mod:`sglang_mmtrace.report.compare`):
- ``sides``: BASE's and NEW's stacked bars one above the other on one scale, built like the plain
  page's breakdown (:func:`~sglang_mmtrace.report.html.stacked_segments`: median exclusive stage
  times, so nested stages do not count twice), each against its TTFT p50 tick;
- ``delta``: one horizontal bar per stage, ranked as in the table (TTFT first, then the leaf stages,
  then below a dashed line, in grey, the stages that contain others), from zero to ``delta_p50``
  with the interval (95% unless ``--confidence`` says otherwise) as a whisker; a ``no change`` bar
  is pale, so what changed stands out;
- the cache hit ratios of both sides, and the ranked stage table.
The groups found on one side only are listed. Every string from the records is escaped.
"""

from __future__ import annotations

import datetime
from collections.abc import Callable, Iterable
from html import escape
from typing import Any

from ..stages import DISPLAY_ORDER
from .analysis import CACHES, format_ratio, group_records, is_ok, report_group
from .colors import UNATTRIBUTED_COLOR, stage_color
from .compare import CONFIDENCE, NO_CHANGE, SIDES, compare, format_ci, level
from .html import BAR_W, CACHE_LABELS, CSS, LABEL_W, stacked_segments
from .markup import UNATTRIBUTED, attr, ms, segment_rects, swatch

TTFT = "TTFT"
TTFT_COLOR = "#424242"
DELTA_HALF_W = 360  # px from the zero line to the largest |delta| or interval end
DELTA_ROW_H = 18
SIDE_LABELS = {"base": "BASE", "new": "NEW"}
CONTAINS_COLOR = "#757575"  # stages that contain others: shown, but muted (their delta repeats their children's)
CONTAINS_ROW = f' style="color:{CONTAINS_COLOR}"'


def _stack(side: str, segs: list[tuple[str, float]], scale: float, ttft_p50: float, y: int) -> str:
    """One side's stacked bar at height ``y`` (label, segments, TTFT p50 tick)."""
    rects, x = segment_rects(segs, scale, 50.0, y, 20, f' data-side="{side}"', f"{SIDE_LABELS[side]} ")
    parts = [f'<text x="0" y="{y + 15}">{SIDE_LABELS[side]}</text>', *rects]
    tick = 50.0 + ttft_p50 * scale
    parts.append(
        f'<line class="ttft-tick" data-side="{side}" x1="{tick:.3f}" x2="{tick:.3f}" y1="{y - 2}" y2="{y + 22}" '
        f'stroke="#000" stroke-width="2"/><text x="{max(x, tick) + 6:.3f}" y="{y + 15}">TTFT p50 {ms(ttft_p50)}</text>'
    )
    return "".join(parts)


def _delta_chart(rows: list[tuple[str, dict[str, Any]]], ci_level: str) -> str:
    """Horizontal bars from zero to each ``delta_p50``, with the interval as a whisker."""
    reach = max(
        (abs(v) for _, d in rows for v in (d["delta_p50"], *(d["ci"] or ()))),
        default=0.0,
    )
    scale = DELTA_HALF_W / reach if reach > 0 else 0.0
    zero = LABEL_W + DELTA_HALF_W
    parts = []
    for i, (name, d) in enumerate(rows):
        y = i * DELTA_ROW_H
        x0, x1 = sorted((zero, zero + d["delta_p50"] * scale))
        color = TTFT_COLOR if name == TTFT else stage_color(name)
        opacity = "0.3" if d["verdict"] == NO_CHANGE else "1"
        ci = d["ci"]
        tip = f"{name}: {d['delta_p50'] * 1e3:+.2f} ms, {ci_level} CI {format_ci(ci)} ms, {d['verdict']}"
        contains = d.get("leaf") is False  # TTFT has no such key
        label_style = f' style="fill:{CONTAINS_COLOR}"' if contains else ""
        if contains and rows[i - 1][1].get("leaf", True):
            parts.append(
                f'<line x1="0" x2="{zero + DELTA_HALF_W}" y1="{y}" y2="{y}" stroke="#999" stroke-dasharray="4,3"/>'
            )
        parts.append(
            f'<g class="delta-row" data-stage="{attr(name)}" data-verdict="{attr(d["verdict"])}" '
            f'data-ms="{d["delta_p50"] * 1e3:.6f}" data-lo="{"" if ci is None else f"{ci[0] * 1e3:.6f}"}" '
            f'data-hi="{"" if ci is None else f"{ci[1] * 1e3:.6f}"}"><title>{escape(tip)}</title>'
            f'<text x="4" y="{y + 13}"{label_style}>{escape(name)}</text>'
            f'<rect class="delta-bar" x="{x0:.3f}" y="{y + 3}" width="{max(x1 - x0, 1.0):.3f}" '
            f'height="{DELTA_ROW_H - 6}" fill="{color}" fill-opacity="{opacity}"/>'
        )
        if ci is not None:
            lo, hi = (zero + v * scale for v in ci)
            mid = y + DELTA_ROW_H / 2
            parts.append(
                f'<path class="ci" d="M{lo:.3f} {mid}H{hi:.3f}M{lo:.3f} {mid - 4}V{mid + 4}M{hi:.3f} {mid - 4}V{mid + 4}" '
                f'stroke="#000" fill="none"/>'
            )
        parts.append(
            f'<text x="{zero + DELTA_HALF_W + 10}" y="{y + 13}">{d["delta_p50"] * 1e3:+.2f} ms '
            f"{escape(format_ci(ci))} {escape(d['verdict'])}</text></g>"
        )
    height = len(rows) * DELTA_ROW_H
    parts.append(f'<line x1="{zero}" x2="{zero}" y1="0" y2="{height}" stroke="#000"/>')
    return f'<svg class="delta" width="{zero + DELTA_HALF_W + 260}" height="{height}" role="img">{"".join(parts)}</svg>'


def _cache_table(cache: dict[str, dict[str, Any]]) -> str:
    rows = "".join(
        f'<tr data-cache="{key}"><td>{escape(CACHE_LABELS[key])}</td>'
        + "".join(f"<td>{escape(format_ratio(cache[side][key]))}</td>" for side in SIDES)
        + "</tr>"
        for key in (*CACHES, "prefix_tokens")
    )
    return f"<table><tr><th>cache hits</th><th>BASE</th><th>NEW</th></tr>{rows}</table>"


def _stage_table(stages: list[dict[str, Any]], ci_level: str) -> str:
    rows = "".join(
        f"<tr{'' if s['leaf'] else CONTAINS_ROW}><td>{escape(s['stage'])}</td><td>{ms(s['base_p50'])}</td><td>{ms(s['new_p50'])}</td>"
        f"<td>{s['delta_p50'] * 1e3:+.2f} ms</td><td>{escape(format_ci(s['ci']))}</td><td>{ms(s['base_p95'])}</td>"
        f"<td>{ms(s['new_p95'])}</td><td>{s['present']['base']}/{s['present']['new']}</td>"
        f"<td>{escape(s['verdict'])}</td></tr>"
        for s in stages
    )
    head = "".join(
        f"<th>{h}</th>"
        for h in (
            "stage",
            "BASE p50",
            "NEW p50",
            "delta",
            f"{ci_level} CI (ms)",
            "BASE p95",
            "NEW p95",
            "present",
            "verdict",
        )
    )
    return f"<table><tr>{head}</tr>{rows}</table>"


def render_compare_html(
    base: Iterable[dict[str, Any]],
    new: Iterable[dict[str, Any]],
    base_label: str,
    new_label: str,
    group: Callable[[dict[str, Any]], str] = report_group,
    confidence: float = CONFIDENCE,
) -> str:
    sides = {"base": list(base), "new": list(new)}
    comparison = compare(sides["base"], sides["new"], group, confidence=confidence)
    ci_level = level(confidence)
    timed = {
        side: {g: [r for r in recs if is_ok(r)] for g, recs in group_records(sides[side], group).items()}
        for side in SIDES
    }
    segs = {name: {side: stacked_segments(timed[side][name]) for side in SIDES} for name in comparison["groups"]}
    widest = max(
        [
            max(sum(v for _, v in segs[name][side]), g["ttft"][f"{side}_p50"])
            for name, g in comparison["groups"].items()
            for side in SIDES
        ],
        default=0.0,
    )
    scale = (BAR_W - 300) / widest if widest > 0 else 0.0
    used = sorted(
        {s for by_side in segs.values() for ss in by_side.values() for s, _ in ss if s != UNATTRIBUTED},
        key=lambda n: DISPLAY_ORDER.get(n, 999),
    )
    legend = "".join(swatch(stage_color(s), s) for s in used) + swatch(UNATTRIBUTED_COLOR, UNATTRIBUTED)
    blocks = []
    for name, g in comparison["groups"].items():
        t = g["ttft"]
        stacks = "".join(
            _stack(side, segs[name][side], scale, t[f"{side}_p50"], 6 + 30 * i) for i, side in enumerate(SIDES)
        )
        rows = [(TTFT, t), *((s["stage"], s) for s in g["stages"])]
        blocks.append(
            f'<section class="group" data-group="{attr(name)}"><h2>{escape(name)} '
            f'<span class="muted">(n={g["n"]["base"]} vs {g["n"]["new"]})</span></h2>'
            f"<div>TTFT p50 {ms(t['base_p50'])} &rarr; {ms(t['new_p50'])}: {t['delta_p50'] * 1e3:+.2f} ms "
            f"{escape(format_ci(t['ci']))} <b>{escape(t['verdict'])}</b>; coverage median "
            f"{g['coverage_p50']['base']:.3f} &rarr; {g['coverage_p50']['new']:.3f}</div>"
            f'<h3>Where TTFT goes (p50 per stage, exclusive)</h3><svg class="sides" width="{BAR_W}" height="66" '
            f'role="img">{stacks}</svg>'
            f"<h3>Change of the p50, NEW &minus; BASE, with {ci_level} interval (ranked)</h3>{_delta_chart(rows, ci_level)}"
            f"{_cache_table(g['cache'])}<details><summary>stage table</summary>{_stage_table(g['stages'], ci_level)}</details>"
            "</section>"
        )
    one_sided = "".join(
        f'<li class="one-sided" data-group="{attr(name)}" data-side="{side}">only in {SIDE_LABELS[side]}: '
        f"{escape(name)}</li>"
        for side in SIDES
        for name in comparison[f"only_{side}"]
    )
    title = "sglang-mmtrace comparison"
    now = datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%d %H:%M UTC")
    return f"""<!DOCTYPE html>
<html lang="en"><head><meta charset="utf-8"><title>{title}</title><style>{CSS}</style></head>
<body>
<h1>{title}</h1>
<div class="muted">BASE = {escape(base_label)} ({len(sides["base"])} records), NEW = {escape(new_label)}
({len(sides["new"])} records); {len(comparison["groups"])} groups compared; generated {now}.
The delta is p50(NEW) &minus; p50(BASE) with a {ci_level} bootstrap interval (each side resampled on its own);
a stage a request did not run counts as 0 ms for it; pale bars: the interval spans zero (no change).
Below the dashed line, in grey: stages that contain others (their delta includes their children's).</div>
<div class="legend">{legend}</div>
{"".join(blocks)}
{f'<section id="one-sided"><h2>Not compared</h2><ul>{one_sided}</ul></section>' if one_sided else ""}
</body></html>
"""


def write_compare_html(
    base: Iterable[dict[str, Any]],
    new: Iterable[dict[str, Any]],
    path: str,
    base_label: str,
    new_label: str,
    group: Callable[[dict[str, Any]], str] = report_group,
    confidence: float = CONFIDENCE,
) -> None:
    with open(path, "w", encoding="utf-8") as fh:
        fh.write(render_compare_html(base, new, base_label, new_label, group, confidence))
