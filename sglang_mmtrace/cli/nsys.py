"""``sglang-mmtrace nsys PROFILE.sqlite``: per-stage NVTX totals next to the plugin's own numbers.

A profile that is not a readable Nsight Systems sqlite export, a records file that cannot be read,
and a profile without the plugin's ranges each end in one line on stderr and exit status 1.
"""

from __future__ import annotations

import argparse
import json
import sqlite3
import sys
from pathlib import Path

PROG = "sglang-mmtrace nsys"


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("profile", help="the sqlite export of an Nsight Systems report (nsys export --type sqlite)")
    p.add_argument("--records", help="the plugin's JSONL records of the profiled requests")
    p.add_argument("--json", action="store_true", help="print the summary as JSON")


def _error(message: str) -> int:
    print(f"{PROG}: {message}", file=sys.stderr)
    return 1


def run(args: argparse.Namespace) -> int:
    from ..profiling.nsys import format_summary, read_ranges, summary
    from ..report.analysis import RecordsError, read_jsonl

    try:
        ranges = read_ranges(args.profile)
    except sqlite3.Error as exc:  # sqlite says "unable to open database file" for a missing file too
        why = exc if Path(args.profile).is_file() else "not a file"
        return _error(f"{args.profile}: not a readable sqlite export ({why})")
    except ValueError as exc:  # a database without the NVTX table
        return _error(str(exc))
    try:
        records = read_jsonl(args.records) if args.records else []
    except RecordsError as exc:
        return _error(str(exc))
    result = summary(ranges, records)
    print(json.dumps(result, indent=2) if args.json else format_summary(result))
    if not ranges:
        return _error(f"no ranges of the sglang_mmtrace NVTX domain in {args.profile} (profile with -t cuda,nvtx)")
    return 0
