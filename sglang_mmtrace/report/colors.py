"""Colours for the report: one hue per stage group (the NVTX colours), one colour per process."""

from __future__ import annotations

from ..sinks.nvtx import GROUP_COLORS
from ..stages import API, DETOKENIZER, SCHEDULER, STAGES

PROCESS_COLORS: dict[str, str] = {API: "#43A047", SCHEDULER: "#1E88E5", DETOKENIZER: "#8E24AA"}
"""Waterfall bars are coloured by the process that measured the stage."""

UNATTRIBUTED_COLOR = "#BDBDBD"
UNKNOWN_COLOR = "#9E9E9E"


def _mix(rgb: int, towards_white: float) -> str:
    r, g, b = (rgb >> 16) & 0xFF, (rgb >> 8) & 0xFF, rgb & 0xFF
    r, g, b = (round(c + (255 - c) * towards_white) for c in (r, g, b))
    return f"#{r:02X}{g:02X}{b:02X}"


def stage_color(name: str) -> str:
    """The stage's group hue, lighter for each later stage of the same group (so neighbours differ)."""
    stage = STAGES.get(name)
    if stage is None:
        return UNKNOWN_COLOR
    members = [s for s in STAGES.values() if s.group == stage.group]
    shade = members.index(stage) / max(len(members), 1) * 0.65
    return _mix(GROUP_COLORS.get(stage.group, 0x9E9E9E), shade)


def process_color(process: str) -> str:
    return PROCESS_COLORS.get(process, UNKNOWN_COLOR)
