"""``report --html``: one self-contained page (inline CSS and SVG, no script, no network).

Sections, per group (bench experiment / variant, else request kind):
- ``breakdown``: a stacked bar of median exclusive stage times (the time a stage was the most
  specific one running, so nested and cross-process overlapping stages do not count twice), in
  catalogue display order, plus the median ``unattributed`` time, against the TTFT p50 tick;
- ``resolution``, ``concurrency``: for those bench experiments' lines, their charts
  (:mod:`~sglang_mmtrace.report.experiments_html`);
- ``waterfalls``: the fastest, median and slowest request, one row per stage of its record, each bar
  at ``start_s`` for ``dur_s``, coloured by the process that measured it;
- ``cache``: hit ratios of the preprocessing cache, the embedding cache and the image prefix;
- ``coverage``: min/median coverage and every request's coverage as a dot;
- ``stages``: the per-stage table (p50, p95, share of TTFT, n).
Every string from the records (rids, labels, attributes) is escaped.
"""

from __future__ import annotations

import datetime
from collections.abc import Callable, Iterable
from html import escape
from typing import Any

from ..stages import DISPLAY_ORDER, ROOT, STAGES
from .analysis import (
    CACHES,
    exclusive_times,
    format_ratio,
    group_records,
    is_ok,
    quantile,
    report_group,
    summarize,
    unattributed_s,
)
from .colors import PROCESS_COLORS, UNATTRIBUTED_COLOR, process_color, stage_color
from .experiments_html import experiment_sections
from .markup import UNATTRIBUTED, attr, ms, segment_rects, swatch

BAR_W = 1000  # px of the widest stacked bar
LABEL_W = 230  # px for waterfall row labels
ROW_H = 16
CACHE_LABELS = {
    "preprocess": "preprocess cache",
    "embedding": "embedding cache",
    "image_prefix": "image prefix (radix)",
    "prefix_tokens": "prefix tokens cached",
}

CSS = """
body{font:13px/1.4 system-ui,-apple-system,Segoe UI,Roboto,sans-serif;margin:20px;color:#212121;background:#fff}
h1{font-size:20px;margin:0 0 4px}h2{font-size:16px;margin:28px 0 8px;border-bottom:1px solid #ddd}
h3{font-size:13px;margin:14px 0 4px}.muted{color:#757575}
table{border-collapse:collapse;margin:4px 0 10px}td,th{padding:2px 8px;text-align:right;border-bottom:1px solid #eee}
td:first-child,th:first-child{text-align:left}.legend span{display:inline-block;margin:0 12px 4px 0}
.sw{display:inline-block;width:11px;height:11px;margin-right:4px;vertical-align:-1px}
svg text{font:11px system-ui,sans-serif;fill:#212121}details{margin:4px 0 10px}
"""


def stacked_segments(recs: list[dict[str, Any]]) -> list[tuple[str, float]]:
    """(stage, median exclusive seconds) in display order, then ``unattributed`` (its median) when positive.

    A stage absent from a request counts as 0 s for it, so the stack shows a typical request. For
    one request the segments add up to its TTFT; over many, medians of the parts need not add up to
    the median of the whole, and the page shows both rather than forcing one onto the other.
    """
    per_req = [exclusive_times(r) for r in recs]
    names = sorted({n for t in per_req for n in t if n != ROOT}, key=lambda n: DISPLAY_ORDER.get(n, 999))
    segs = [(n, quantile([t.get(n, 0.0) for t in per_req], 0.5)) for n in names]
    segs = [(n, v) for n, v in segs if v > 0]
    rest = quantile([unattributed_s(r) for r in recs], 0.5)
    if rest > 0:
        segs.append((UNATTRIBUTED, rest))
    return segs


def pick_requests(recs: list[dict[str, Any]]) -> list[tuple[str, dict[str, Any]]]:
    """The fastest, median and slowest request by TTFT (each once)."""
    ordered = sorted(recs, key=lambda r: r["ttft_s"])
    picks = [("fastest", ordered[0]), ("median", ordered[(len(ordered) - 1) // 2]), ("slowest", ordered[-1])]
    seen: set[int] = set()
    out = []
    for label, rec in picks:
        if id(rec) not in seen:
            seen.add(id(rec))
            out.append((label, rec))
    return out


def _breakdown(name: str, recs: list[dict[str, Any]], scale: float, ttft_p50: float) -> str:
    parts, x = segment_rects(stacked_segments(recs), scale, 0.0, 4, 22)
    tick = ttft_p50 * scale
    parts.append(
        f'<line class="ttft-tick" x1="{tick:.3f}" x2="{tick:.3f}" y1="0" y2="30" stroke="#000" stroke-width="2"/>'
    )
    width = max(x, tick) + 260
    parts.append(
        f'<text x="{max(x, tick) + 6:.3f}" y="19">TTFT p50 {ms(ttft_p50)} (stack {ms(x / scale if scale else 0.0)})</text>'
    )
    return (
        f'<div class="bar" data-group="{attr(name)}"><h3>{escape(name)} <span class="muted">(n={len(recs)})</span></h3>'
        f'<svg class="breakdown" width="{width:.0f}" height="30" role="img">{"".join(parts)}</svg></div>'
    )


def _waterfall(label: str, rec: dict[str, Any]) -> str:
    stages = sorted(rec["stages"], key=lambda s: (DISPLAY_ORDER.get(s["name"], 999), s["start_s"]))
    span = max([rec["ttft_s"], *(s["start_s"] + s["dur_s"] for s in stages)])
    scale = (BAR_W - LABEL_W) / span if span > 0 else 0.0
    rows = []
    for i, s in enumerate(stages):
        y = i * ROW_H
        depth = STAGES[s["name"]].depth if s["name"] in STAGES else 1
        attrs = ", ".join(f"{k}={v}" for k, v in (s.get("attrs") or {}).items())
        tip = f"{s['name']} ({s.get('process')}): start {ms(s['start_s'])}, {ms(s['dur_s'])}" + (
            f"; {attrs}" if attrs else ""
        )
        x = LABEL_W + s["start_s"] * scale
        skipped = " (skipped)" if (s.get("attrs") or {}).get("skipped") else ""
        rows.append(
            f'<g class="wf-row" data-stage="{attr(s["name"])}" data-process="{attr(s.get("process"))}">'
            f'<text x="{4 + 10 * depth}" y="{y + 12}">{escape(s["name"])}{skipped}</text>'
            f'<rect x="{x:.3f}" y="{y + 2}" width="{max(s["dur_s"] * scale, 1.0):.3f}" height="{ROW_H - 4}" '
            f'fill="{process_color(str(s.get("process")))}"><title>{escape(tip)}</title></rect></g>'
        )
    tick = LABEL_W + rec["ttft_s"] * scale
    height = len(stages) * ROW_H + 4
    rows.append(f'<line x1="{tick:.3f}" x2="{tick:.3f}" y1="0" y2="{height}" stroke="#000" stroke-dasharray="3,2"/>')
    cache = rec.get("cache") or {}
    head = (
        f"{escape(label)}: rid <code>{escape(str(rec.get('rid')))}</code>, TTFT {ms(rec['ttft_s'])}, "
        f"coverage {rec.get('coverage', 0):.3f}, {len(rec.get('images') or [])} image(s), "
        f"tokens cached {rec.get('cached_tokens')}/{rec.get('prompt_tokens')}, "
        f"preprocess {escape(str(cache.get('preprocess')))}, embedding {escape(str(cache.get('embedding')))}"
    )
    return (
        f'<div class="waterfall" data-rid="{attr(rec.get("rid"))}" data-stages="{len(stages)}"><div>{head}</div>'
        f'<svg width="{BAR_W + 10}" height="{height}" role="img">{"".join(rows)}</svg></div>'
    )


def _cache_row(name: str, cache: dict[str, dict[str, Any]]) -> str:
    cells = []
    for key in (*CACHES, "prefix_tokens"):
        entry = cache[key]
        ratio = entry.get("ratio")
        fill = 0.0 if ratio is None else ratio * 120
        cells.append(
            f'<td><svg width="124" height="14"><rect x="0" y="1" width="120" height="12" fill="#EEE"/>'
            f'<rect class="cache-bar" data-cache="{key}" data-ratio="{"" if ratio is None else f"{ratio:.6f}"}" '
            f'x="0" y="1" width="{fill:.2f}" height="12" fill="#43A047"/></svg> {escape(format_ratio(entry))}</td>'
        )
    return f'<tr data-group="{attr(name)}"><td>{escape(name)}</td>{"".join(cells)}</tr>'


def _coverage_row(name: str, recs: list[dict[str, Any]], g: dict[str, Any]) -> str:
    lo = min(0.9, g["coverage_min"])
    dots = "".join(
        f'<circle class="cov-dot" cx="{(r["coverage"] - lo) / (1 - lo) * 300 + 5:.2f}" cy="8" r="3" '
        f'fill="#1E88E5" fill-opacity="0.5"><title>{attr(r.get("rid"))}: {r["coverage"]:.4f}</title></circle>'
        for r in recs
    )
    return (
        f'<tr data-group="{attr(name)}"><td>{escape(name)}</td><td>{g["coverage_min"]:.3f}</td>'
        f"<td>{g['coverage_p50']:.3f}</td><td>{ms(g['unattributed_p50'])}</td>"
        f'<td><svg width="310" height="16"><line x1="5" x2="305" y1="8" y2="8" stroke="#ccc"/>{dots}</svg>'
        f' <span class="muted">{lo:.2f} … 1</span></td></tr>'
    )


def _stage_table(g: dict[str, Any]) -> str:
    rows = "".join(
        f'<tr><td style="padding-left:{8 + 12 * (STAGES[s].depth if s in STAGES else 1)}px">{escape(s)}</td>'
        f"<td>{v['p50'] * 1e3:.2f}</td><td>{v['p95'] * 1e3:.2f}</td><td>{v['share'] * 100:.1f}%</td><td>{v['n']}</td></tr>"
        for s, v in g["stages"].items()
        if s != ROOT
    )
    return f"<table><tr><th>stage</th><th>p50 ms</th><th>p95 ms</th><th>share</th><th>n</th></tr>{rows}</table>"


def render_html(
    records: Iterable[dict[str, Any]],
    group: Callable[[dict[str, Any]], str] = report_group,
    title: str = "sglang-mmtrace report",
) -> str:
    records = list(records)
    summary = summarize(records, group)
    groups = {name: [r for r in recs if is_ok(r)] for name, recs in group_records(records, group).items()}
    timed = {name: recs for name, recs in groups.items() if recs}
    widest = max(
        [max(sum(v for _, v in stacked_segments(r)), summary[n]["ttft_p50"]) for n, r in timed.items()], default=0.0
    )
    scale = BAR_W / widest if widest > 0 else 0.0
    used = sorted(
        {s for recs in timed.values() for s, _ in stacked_segments(recs) if s != UNATTRIBUTED},
        key=lambda n: DISPLAY_ORDER.get(n, 999),
    )
    legend = "".join(swatch(stage_color(s), s) for s in used) + swatch(UNATTRIBUTED_COLOR, UNATTRIBUTED)
    overview = "".join(
        f"<tr><td>{escape(n)}</td><td>{g['n']}</td><td>{g['failed']}</td>"
        + (
            f"<td>{ms(g['ttft_p50'])}</td><td>{ms(g['ttft_p95'])}</td><td>{ms(g['client_ttft_p50'])}</td>"
            f"<td>{g['coverage_p50']:.3f}</td>"
            if g["n"]
            else "<td>-</td><td>-</td><td>-</td><td>-</td>"
        )
        + "</tr>"
        for n, g in summary.items()
    )
    breakdown = "".join(_breakdown(n, r, scale, summary[n]["ttft_p50"]) for n, r in timed.items())
    waterfalls = "".join(
        f'<div class="wf-group" data-group="{attr(n)}"><h3>{escape(n)}</h3>'
        + "".join(_waterfall(label, rec) for label, rec in pick_requests(r))
        + "</div>"
        for n, r in timed.items()
    )
    process_legend = "".join(swatch(c, p) for p, c in PROCESS_COLORS.items())
    cache_rows = "".join(_cache_row(n, summary[n]["cache"]) for n in timed)
    cache_head = "".join(f"<th>{escape(CACHE_LABELS[k])}</th>" for k in (*CACHES, "prefix_tokens"))
    coverage_rows = "".join(_coverage_row(n, r, summary[n]) for n, r in timed.items())
    stage_tables = "".join(
        f"<details><summary>{escape(n)}</summary>{_stage_table(summary[n])}</details>" for n in timed
    )
    unattributed_total = sum(unattributed_s(r) for recs in timed.values() for r in recs)
    now = datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%d %H:%M UTC")
    return f"""<!DOCTYPE html>
<html lang="en"><head><meta charset="utf-8"><title>{escape(title)}</title><style>{CSS}</style></head>
<body>
<h1>{escape(title)}</h1>
<div class="muted">{len(records)} records, {sum(len(r) for r in timed.values())} with a first token, {len(summary)} groups;
generated {now}; total unattributed {ms(unattributed_total)}</div>
<section id="overview"><h2>Groups</h2>
<table><tr><th>group</th><th>n</th><th>failed</th><th>TTFT p50</th><th>TTFT p95</th><th>client TTFT p50</th><th>coverage p50</th></tr>
{overview}</table></section>
<section id="breakdown"><h2>Where TTFT goes (p50 per stage)</h2>
<div class="muted">Each segment is a stage's median exclusive time (the time it was the most specific stage
running, so nested and overlapping stages do not count twice), in catalogue order, then the median unattributed time. The black tick is TTFT p50: for one request the stack
ends on it; over many, medians of the parts need not add up to the median of the whole.</div>
<div class="legend">{legend}</div>{breakdown}</section>
{experiment_sections(records)}
<section id="cache"><h2>Cache hit ratios</h2>
<table><tr><th>group</th>{cache_head}</tr>{cache_rows}</table></section>
<section id="coverage"><h2>Coverage (share of TTFT the stages explain)</h2>
<table><tr><th>group</th><th>min</th><th>median</th><th>unattributed p50</th><th>per request</th></tr>{coverage_rows}</table></section>
<section id="waterfalls"><h2>Per-request waterfalls (fastest, median, slowest per group)</h2>
<div class="legend">{process_legend}</div>{waterfalls}</section>
<section id="stages"><h2>Per-stage table</h2>{stage_tables}</section>
</body></html>
"""


def write_html(
    records: Iterable[dict[str, Any]], path: str, group: Callable[[dict[str, Any]], str] = report_group
) -> None:
    with open(path, "w", encoding="utf-8") as fh:
        fh.write(render_html(records, group))
