"""``sglang-mmtrace report FILE.jsonl``: the per-stage table, and optionally an HTML page and a Chrome trace.

Groups are the bench's ``experiment / variant`` when the records carry a ``bench`` key (the
output of ``sglang-mmtrace bench``), else the request kind derived from the record.
"""

from __future__ import annotations

import argparse
import json
import sys

from ..analysis import format_table, read_jsonl, report_group, summarize


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("file", help="records: the server's SGLANG_MMTRACE_JSONL or bench output")
    parser.add_argument("--json", action="store_true", help="print the summary as JSON instead of the table")
    parser.add_argument("--html", metavar="OUT", help="write a self-contained HTML page (charts, waterfalls)")
    parser.add_argument(
        "--chrome-trace", metavar="OUT", help="write a Trace Event Format file (Perfetto, chrome://tracing)"
    )


def run(args: argparse.Namespace) -> int:
    records = read_jsonl(args.file)
    if not records:
        print(f"no records in {args.file}", file=sys.stderr)
        return 1
    summary = summarize(records, report_group)
    print(json.dumps(summary, indent=2) if args.json else format_table(summary))
    if args.html:
        from ..report import write_html

        write_html(records, args.html, report_group)
        print(f"HTML report: {args.html}", file=sys.stderr)
    if args.chrome_trace:
        from ..report import write_trace

        slices = write_trace(records, args.chrome_trace, report_group)
        print(f"Chrome trace ({slices} slices): {args.chrome_trace}", file=sys.stderr)
    return 0
