"""``sglang-mmtrace nsys PROFILE.sqlite``: per-stage NVTX totals next to the plugin's own numbers."""

from __future__ import annotations

import argparse
import json


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("profile", help="the sqlite export of an Nsight Systems report (nsys export --type sqlite)")
    p.add_argument("--records", help="the plugin's JSONL records of the profiled requests")
    p.add_argument("--json", action="store_true", help="print the summary as JSON")


def run(args: argparse.Namespace) -> int:
    from ..profiling.nsys import format_summary, read_ranges, summary
    from ..report.analysis import read_jsonl

    ranges = read_ranges(args.profile)
    records = read_jsonl(args.records) if args.records else []
    result = summary(ranges, records)
    print(json.dumps(result, indent=2) if args.json else format_summary(result))
    if not ranges:
        print(f"no ranges of the sglang_mmtrace NVTX domain in {args.profile} (profile with -t cuda,nvtx)")
        return 1
    return 0
