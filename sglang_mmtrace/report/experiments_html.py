"""The ``report --html`` sections of two bench experiments, present when their lines are.

- ``resolution``: per kind (new, repeated image) an SVG line chart of TTFT and each leaf stage's p50
  against the image's megapixels (one point per image shape), the fit table (slope per megapixel and
  per 1000 visual tokens with its 95% interval, the intercept, ``scales`` or not), and the per-shape
  table (bytes, visual tokens, p50/p95 of TTFT and every stage). See :mod:`.scaling`.
- ``concurrency``: a line chart of TTFT p50/p95/p99 against the number of streams (log scale), and
  per level two stacked bars on one scale: the level's median request and the mean of its slowest 5%,
  in exclusive parts that add up to TTFT, a batched stage's batch-mates part pale; then the sentence
  naming the stages that grew. See :mod:`.tail`.
"""

from __future__ import annotations

import math
from html import escape
from typing import Any

from ..stages import DISPLAY_ORDER, STAGES
from .analysis import parent_stages
from .colors import UNATTRIBUTED_COLOR, stage_color
from .markup import attr, ms, segment_color, segment_rects, swatch
from .scaling import TTFT, format_slope, resolution_lines, resolution_summary
from .tail import EXPERIMENT as TAIL_EXPERIMENT
from .tail import MATES, UNATTRIBUTED, part_stage, tail_sentence, tail_summary

PLOT_W, PLOT_H, MARGIN_L, MARGIN_B, LEGEND_W = 640, 260, 60, 36, 280
TTFT_COLOR = "#212121"
SHOWN_SHARE = 0.02  # resolution chart: a leaf stage is drawn when its p50 reaches 2% of the top TTFT p50
MIN_LABEL_GAP = 34  # px between two x tick labels
PERCENTILE_COLORS = {"p50": "#1E88E5", "p95": "#FB8C00", "p99": "#E53935"}


def _nice_max(v: float) -> float:
    """The smallest 1, 2, 2.5 or 5 times a power of ten at or above ``v``."""
    if v <= 0:
        return 1.0
    p = 10 ** math.floor(math.log10(v))
    return next(m * p for m in (1, 2, 2.5, 5, 10) if m * p >= v)


def line_chart(
    series: list[tuple[str, str, list[tuple[float, float]]]], x_label: str, log_x: bool = False, cls: str = "lines"
) -> str:
    """Lines of (x, seconds) points, one per ``(name, colour, points)``; y in ms from 0, x linear
    (or log2) over the points' range, ticks at the distinct x values when there are few."""
    pts = [(x, y) for _, _, ps in series for x, y in ps if y == y]
    if not pts:
        return ""
    fx = (lambda v: math.log2(v)) if log_x else (lambda v: v)
    xs = sorted({x for x, _ in pts})
    x0, x1 = (fx(xs[0]), fx(xs[-1])) if log_x else (0.0, xs[-1])
    ymax = _nice_max(max(y for _, y in pts) * 1e3)

    def px(x: float) -> float:
        return MARGIN_L + (fx(x) - x0) / (x1 - x0) * PLOT_W if x1 > x0 else MARGIN_L + PLOT_W / 2

    def py(y: float) -> float:
        return 10 + PLOT_H - y * 1e3 / ymax * PLOT_H

    parts = [
        f'<line x1="{MARGIN_L}" x2="{MARGIN_L + PLOT_W}" y1="{10 + PLOT_H}" y2="{10 + PLOT_H}" stroke="#000"/>',
        f'<line x1="{MARGIN_L}" x2="{MARGIN_L}" y1="10" y2="{10 + PLOT_H}" stroke="#000"/>',
    ]
    for i in range(6):
        v = ymax * i / 5
        y = py(v / 1e3)
        parts.append(
            f'<line x1="{MARGIN_L - 4}" x2="{MARGIN_L + PLOT_W}" y1="{y:.2f}" y2="{y:.2f}" stroke="#eee"/>'
            f'<text x="{MARGIN_L - 6}" y="{y + 4:.2f}" text-anchor="end">{v:g}</text>'
        )
    ticks = xs if len(xs) <= 12 else [xs[0] + (xs[-1] - xs[0]) * i / 5 for i in range(6)]
    last_label = -math.inf
    for v in ticks:
        parts.append(
            f'<line x1="{px(v):.2f}" x2="{px(v):.2f}" y1="{10 + PLOT_H}" y2="{10 + PLOT_H + 4}" stroke="#000"/>'
        )
        if px(v) - last_label >= MIN_LABEL_GAP:  # crowded small values: every tick, fewer labels
            last_label = px(v)
            parts.append(f'<text x="{px(v):.2f}" y="{10 + PLOT_H + 16}" text-anchor="middle">{v:.3g}</text>')
    parts.append(
        f'<text x="{MARGIN_L + PLOT_W / 2}" y="{10 + PLOT_H + 32}" text-anchor="middle">{escape(x_label)}</text>'
        f'<text x="12" y="{10 + PLOT_H / 2}" transform="rotate(-90 12 {10 + PLOT_H / 2})" text-anchor="middle">ms</text>'
    )
    for i, (name, color, ps) in enumerate(series):
        ps = sorted((x, y) for x, y in ps if y == y)
        coords = " ".join(f"{px(x):.2f},{py(y):.2f}" for x, y in ps)
        dots = "".join(
            f'<circle class="pt" data-x="{x:g}" data-ms="{y * 1e3:.6f}" cx="{px(x):.2f}" cy="{py(y):.2f}" r="3" '
            f'fill="{color}"><title>{escape(name)}: {x:g}, {ms(y)}</title></circle>'
            for x, y in ps
        )
        ly = 14 + 15 * i
        parts.append(
            f'<g class="series" data-series="{attr(name)}"><polyline points="{coords}" fill="none" stroke="{color}" '
            f'stroke-width="2"/>{dots}<line x1="{MARGIN_L + PLOT_W + 14}" x2="{MARGIN_L + PLOT_W + 34}" y1="{ly}" '
            f'y2="{ly}" stroke="{color}" stroke-width="3"/><text x="{MARGIN_L + PLOT_W + 40}" y="{ly + 4}">'
            f"{escape(name)}</text></g>"
        )
    height = max(10 + PLOT_H + MARGIN_B + 6, 20 + 15 * len(series))
    return (
        f'<svg class="{cls}" width="{MARGIN_L + PLOT_W + LEGEND_W}" height="{height}" role="img">{"".join(parts)}</svg>'
    )


def _fit_table(fits: dict[str, Any]) -> str:
    rows = "".join(
        f'<tr class="fit" data-stage="{attr(stage)}" data-verdict="{attr(f["megapixels"]["verdict"])}" '
        f'data-slope-ms-per-mp="{f["megapixels"]["slope"] * 1e3:.6f}"><td>{escape(stage)}</td>'
        f"<td>{format_slope(f['megapixels'])}</td><td>{ms(f['megapixels']['intercept'])}</td>"
        f"<td><b>{escape(f['megapixels']['verdict'])}</b></td><td>{format_slope(f['visual_tokens'])}</td>"
        f"<td>{ms(f['visual_tokens']['intercept'])}</td><td>{escape(f['visual_tokens']['verdict'])}</td></tr>"
        for stage, f in fits.items()
    )
    head = "".join(
        f"<th>{h}</th>"
        for h in ("stage", "ms per MP [95% CI]", "at 0 MP", "pixels", "ms per 1k tokens [95% CI]", "at 0", "tokens")
    )
    return f"<table><tr>{head}</tr>{rows}</table>"


def _count(v: float | None) -> str:
    return "-" if v is None else f"{v:.0f}"


def _percent(v: float | None) -> str:
    return "-" if v is None else f"{v * 100:.0f}%"


def _cells_table(cells: list[dict[str, Any]]) -> str:
    rows = "".join(
        f'<tr data-shape="{c["width"]}x{c["height"]}" data-kind="{attr(c["kind"])}"><td>{c["width"]}x{c["height"]}</td>'
        f"<td>{escape(c['kind'])}</td><td>{c['megapixels']:.3f}</td><td>{c['bytes']:.0f}</td>"
        f"<td>{_count(c['visual_tokens'])}</td><td>{c['records']}/{c['n']}</td>"
        f"<td>{ms(c['ttft_p50'])}</td><td>{ms(c['ttft_p95'])}</td><td>"
        + "; ".join(f"{escape(s)} {v['p50'] * 1e3:.2f}/{v['p95'] * 1e3:.2f}" for s, v in c["stages"].items())
        + "</td></tr>"
        for c in cells
    )
    head = "".join(
        f"<th>{h}</th>"
        for h in ("shape", "kind", "MP", "bytes", "visual tokens", "rec/n", "TTFT p50", "TTFT p95", "stages p50/p95 ms")
    )
    return f"<table><tr>{head}</tr>{rows}</table>"


def by_target(lines: list[dict[str, Any]]) -> list[tuple[str | None, list[dict[str, Any]]]]:
    """The lines per bench target (server), in order of appearance; each labelled by the launch words
    only it has (``--mm-feature-transport cpu``), or None when all lines come from one target. A fit or
    a tail over two servers' requests would mix their configurations."""
    groups: dict[str, list[dict[str, Any]]] = {}
    for ln in lines:
        groups.setdefault(str((ln.get("bench") or {}).get("target") or ""), []).append(ln)
    if len(groups) < 2:
        return [(None, lines)]
    options = {t: _options(t) for t in groups}
    common = set.intersection(*(set(o) for o in options.values()))
    return [(" ".join(o for o in options[t] if o not in common) or t or "(no target)", g) for t, g in groups.items()]


def _options(launch: str) -> list[str]:
    """``--flag value`` groups (and ``KEY=VALUE`` words) of a launch's words, in order."""
    out: list[str] = []
    for word in launch.split():
        if word.startswith("-") or not out or ("=" in word and not out[-1].startswith("-")):
            out.append(word)
        else:
            out[-1] += " " + word
    return out


def _target_heading(label: str | None) -> str:
    return "" if label is None else f'<h3 class="target">server: <code>{escape(label)}</code></h3>'


def resolution_section(records: list[dict[str, Any]]) -> str:
    lines = resolution_lines(records)
    if not lines:
        return ""
    body = "".join(
        f'<div class="target-group" data-target="{attr(label or "")}">{_target_heading(label)}{_resolution_body(group)}</div>'
        for label, group in by_target(lines)
    )
    return (
        '<section id="resolution"><h2>Resolution: what each stage costs per image size</h2>'
        '<div class="muted">One point per image shape (p50 over its requests). The fit is least squares over the '
        "requests: seconds = intercept + slope &times; megapixels (and &times; visual tokens); a stage "
        "<b>scales</b> only when the slope's 95% bootstrap interval is above zero. The charts draw TTFT and the "
        f"leaf stages whose p50 reaches {SHOWN_SHARE:.0%} of the largest TTFT p50; the tables have every stage. "
        "Each server (bench target) gets its own charts and fits.</div>" + body + "</section>"
    )


def _resolution_body(lines: list[dict[str, Any]]) -> str:
    summary = resolution_summary(lines)
    blocks = []
    for kind in dict.fromkeys(c["kind"] for c in summary["cells"]):
        cells = [c for c in summary["cells"] if c["kind"] == kind and c["records"]]
        names = {s for c in cells for s in c["stages"]}
        leaves = sorted(names - parent_stages(names), key=lambda s: DISPLAY_ORDER.get(s, 999))
        top = max((c["ttft_p50"] for c in cells), default=0.0)
        series = [(TTFT, TTFT_COLOR, [(c["megapixels"], c["ttft_p50"]) for c in cells])]
        series += [
            (s, stage_color(s), [(c["megapixels"], c["stages"][s]["p50"]) for c in cells if s in c["stages"]])
            for s in leaves
            if max(c["stages"].get(s, {}).get("p50", 0.0) for c in cells) >= SHOWN_SHARE * top
        ]
        fits = summary["fits"].get(kind)
        blocks.append(
            f'<div class="resolution-kind" data-kind="{attr(kind)}"><h3>{escape(kind)} images: p50 per image shape</h3>'
            + line_chart(series, "megapixels", cls="lines resolution")
            + (_fit_table(fits) if fits else '<div class="muted">one image size: no fit</div>')
            + "</div>"
        )
    return "".join(blocks) + f"<details><summary>per shape</summary>{_cells_table(summary['cells'])}</details>"


def _part_color(part: str) -> str:
    return segment_color(part_stage(part))


def _part_opacity(part: str) -> float:
    return 0.35 if part.endswith(MATES) else 1.0


def concurrency_section(records: list[dict[str, Any]]) -> str:
    lines = [ln for ln in records if (ln.get("bench") or {}).get("experiment") == TAIL_EXPERIMENT]
    groups = [(label, summary) for label, group in by_target(lines) if (summary := tail_summary(group))]
    if not groups:
        return ""
    body = "".join(
        f'<div class="target-group" data-target="{attr(label or "")}">{_target_heading(label)}'
        f"{_concurrency_body(summary)}</div>"
        for label, summary in groups
    )
    return (
        '<section id="concurrency"><h2>Concurrency: TTFT percentiles and the slow tail</h2>'
        '<div class="muted">Per level, the median request and the mean of the slowest 5%, split into exclusive '
        "parts (the time each stage was the most specific one running, plus the unattributed rest), so each bar "
        "adds up to its TTFT. A batched stage (one encoder call or prefill for several requests) is split into the "
        "request's own share (its time divided by the requests in the batch, solid) and the batch mates' (pale). "
        "Each server (bench target) gets its own chart and tails.</div>" + body + "</section>"
    )


def _concurrency_body(summary: dict[str, dict[str, Any]]) -> str:
    series = [
        (f"TTFT {q}", color, [(float(c), lv[f"ttft_{q}"]) for c, lv in summary.items() if lv["records"]])
        for q, color in PERCENTILE_COLORS.items()
    ]
    chart = line_chart(series, "concurrent streams", log_x=True, cls="lines concurrency")
    tails = {c: lv["tail"] for c, lv in summary.items() if "tail" in lv}
    widest = max([max(t["parts_sum"], t["median_ttft"]) for t in tails.values()], default=0.0)
    scale = (1000 - 300) / widest if widest > 0 else 0.0
    used: set[str] = set()
    blocks = []
    for c, t in tails.items():
        rows = t["parts"]
        svg = []
        for i, (side, key) in enumerate((("median", "median_s"), ("tail", "tail_s"))):
            segs = [(r["part"], r[key]) for r in rows if r[key] > 0]
            used |= {part_stage(p) for p, _ in segs}
            y = 4 + 28 * i
            rects, end = segment_rects(
                segs, scale, 130.0, y, 20, f' data-side="{side}"', f"{side} ", _part_color, _part_opacity
            )
            label = "median request" if side == "median" else f"slowest 5% (n={t['n']})"
            total = t["median_ttft"] if side == "median" else t["ttft_mean"]
            svg += [f'<text x="0" y="{y + 15}">{label}</text>', *rects]
            svg.append(f'<text x="{end + 6:.3f}" y="{y + 15}">TTFT {ms(total)}</text>')
        growth = "".join(
            f'<tr data-part="{attr(r["part"])}"><td>{escape(r["part"])}</td><td>{ms(r["median_s"])}</td>'
            f"<td>{ms(r['tail_s'])}</td><td>{r['growth_s'] * 1e3:+.2f} ms</td>"
            f"<td>{_percent(r['share_of_growth'])}</td></tr>"
            for r in sorted(rows, key=lambda r: -r["growth_s"])
        )
        batches = "; ".join(
            f"{escape(s)}: {b['tail_requests']:.1f} requests per batch in the tail, {b['median_requests'] or 1} for the median"
            for s, b in t["batches"].items()
        )
        blocks.append(
            f'<div class="tail" data-streams="{attr(c)}"><h3>{escape(c)} stream{"" if c == "1" else "s"}</h3>'
            f'<div class="sentence">{escape(tail_sentence(c, summary[c]))}</div>'
            f'<svg class="tail-bars" width="1000" height="62" role="img">{"".join(svg)}</svg>'
            f'<details><summary>parts (growth ranked)</summary><div class="muted">{batches}</div><table><tr><th>part</th>'
            f"<th>median request</th><th>slowest 5% (mean)</th><th>growth</th><th>share of growth</th></tr>{growth}"
            "</table></details></div>"
        )
    ordered = sorted(used - {UNATTRIBUTED}, key=lambda s: DISPLAY_ORDER.get(s, 999))
    legend = "".join(swatch(stage_color(s), s) for s in ordered if s in STAGES) + swatch(
        UNATTRIBUTED_COLOR, UNATTRIBUTED
    )
    table = "".join(
        f'<tr data-streams="{attr(c)}"><td>{escape(c)}</td><td>{lv["n"]}</td><td>{lv["records"]}</td>'
        + "".join(f"<td>{ms(lv[f'client_ttft_{q}'])}</td>" for q in PERCENTILE_COLORS)
        + "".join(f"<td>{ms(lv[f'ttft_{q}'])}</td>" for q in PERCENTILE_COLORS)
        + "</tr>"
        for c, lv in summary.items()
    )
    return (
        chart + "<table><tr><th>streams</th><th>n</th><th>records</th><th>client p50</th><th>client p95</th>"
        f"<th>client p99</th><th>server p50</th><th>server p95</th><th>server p99</th></tr>{table}</table>"
        f'<div class="legend">{legend}</div>{"".join(blocks)}'
    )


def experiment_sections(records: list[dict[str, Any]]) -> str:
    """The resolution and concurrency sections (empty strings when their lines are absent)."""
    return resolution_section(records) + concurrency_section(records)
