"""``sglang-mmtrace report`` outputs beyond the text table: a self-contained HTML page and a Chrome trace.

``report --compare BASE NEW`` has its numbers in :mod:`~sglang_mmtrace.report.compare` and its page in
:mod:`~sglang_mmtrace.report.compare_html` (imported where used: the interval needs numpy).

The numbers come from :mod:`sglang_mmtrace.report.analysis`; stage names, order and colours from the
catalogue (:mod:`sglang_mmtrace.stages`) and the NVTX group colours.
"""

from .chrome_trace import build_trace, write_trace
from .html import render_html, write_html

__all__ = ["build_trace", "render_html", "write_html", "write_trace"]
