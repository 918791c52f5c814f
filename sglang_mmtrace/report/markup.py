"""The HTML pieces the report's pages share: escaped text, legend swatches and stacked-bar rects.

The report page (``html``), its experiment sections (``experiments_html``) and the comparison page
(``compare_html``) draw with these, so a bar or a number reads the same on every page.
"""

from __future__ import annotations

from collections.abc import Callable
from html import escape
from typing import Any

from .colors import UNATTRIBUTED_COLOR, stage_color

UNATTRIBUTED = "unattributed"
"""The segment after the stages: the part of TTFT no stage explains."""


def ms(seconds: float | None) -> str:
    """Seconds as milliseconds, ``-`` for none."""
    return "-" if seconds is None else f"{seconds * 1e3:.2f} ms"


def attr(value: Any) -> str:
    """``value`` escaped for an attribute value in double quotes."""
    return escape(str(value), quote=True)


def swatch(color: str, label: str) -> str:
    """A legend entry: a coloured square and its label."""
    return f'<span><i class="sw" style="background:{color}"></i>{escape(label)}</span>'


def segment_color(stage: str) -> str:
    return UNATTRIBUTED_COLOR if stage == UNATTRIBUTED else stage_color(stage)


def segment_rects(
    segs: list[tuple[str, float]],
    scale: float,
    x: float,
    y: float,
    height: float,
    data: str = "",
    title: str = "",
    color: Callable[[str], str] = segment_color,
    opacity: Callable[[str], float] | None = None,
) -> tuple[list[str], float]:
    """One stacked bar: a ``seg`` rect per (stage, seconds) from ``x`` on, each ``data-stage`` and
    ``data-ms`` (plus ``data``, extra attributes); returns the rects and where the bar ends.
    Shared by the report's breakdown, the comparison's sides and the concurrency tail."""
    parts = []
    for stage, secs in segs:
        w = max(secs * scale, 0.0)
        fade = f' fill-opacity="{opacity(stage):g}"' if opacity is not None else ""
        parts.append(
            f'<rect class="seg" data-stage="{attr(stage)}" data-ms="{secs * 1e3:.6f}"{data} x="{x:.3f}" y="{y}" '
            f'width="{w:.3f}" height="{height}" fill="{color(stage)}"{fade} stroke="#fff" stroke-width="0.5">'
            f"<title>{escape(title + stage)}: {ms(secs)}</title></rect>"
        )
        x += w
    return parts, x
