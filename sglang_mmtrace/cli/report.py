"""``sglang-mmtrace report FILE.jsonl``: the per-stage table, and optionally an HTML page and a Chrome trace.

``sglang-mmtrace report --compare BASE NEW``: the same groups in two record files, compared: per
group and stage the change of the p50 with a bootstrap interval (95%, or ``--confidence``), ranked
(:mod:`sglang_mmtrace.report.compare`); ``--json`` and ``--html`` as for one file, no Chrome trace.
One file or ``--compare``, not both; exit 1 when the two files have no group in common. ``--compare``
needs the ``bench`` extra (its bootstrap is numpy's): without it, one line and exit status 2.

Groups are the bench's ``experiment / variant`` when the records carry a ``bench`` key (the
output of ``sglang-mmtrace bench``), else the request kind derived from the record.

Bad input ends in one line on stderr and exit status 1, never a traceback: a file that cannot be
read, a file without a single valid record, an output that cannot be written. Lines that are not
records are skipped and counted on stderr, with their line numbers: the file may be a live server's
``SGLANG_MMTRACE_JSONL``, whose last line is normally half-written, and one bad line should not
cost the rest. ``--html`` and ``--chrome-trace`` create a missing parent folder, as ``bench --out``
does (an output path names where the result should be; the folder is part of that).

Warm-up records (``"warmup": true``: SGLang's start-up request, requests sent with
``X-Mmtrace-Warmup: 1``) are left out unless ``--include-warmup``: a JIT-bound first request would
otherwise be the p95 of a short run.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

from ..report.analysis import RecordsError, format_table, load_records, report_group, summarize
from .extras import lacks_extra, needs_extra

PROG = "sglang-mmtrace report"
SHOWN_SKIPS = 3  # bad lines named on stderr; the rest are counted


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "file",
        nargs="?",
        help="records: the server's SGLANG_MMTRACE_JSONL or bench output, .gz too (not with --compare)",
    )
    parser.add_argument(
        "--compare",
        nargs=2,
        metavar=("BASE", "NEW"),
        help="compare two record files: per group and stage, p50(NEW) - p50(BASE) with an interval, ranked",
    )
    parser.add_argument(
        "--confidence",
        type=_confidence,
        metavar="LEVEL",
        help="with --compare: the intervals' level, between 0 and 1 (default 0.95); at 0.95 about one"
        " unmoved stage in twenty is still called a change, so checking many stages, ask for 0.99 or 0.999",
    )
    parser.add_argument(
        "--json", action="store_true", help="print the summary (or the comparison) as JSON instead of the table"
    )
    parser.add_argument(
        "--html",
        metavar="OUT",
        help="write a self-contained HTML page (charts, waterfalls; with --compare the deltas); creates OUT's folder",
    )
    parser.add_argument(
        "--chrome-trace",
        metavar="OUT",
        help="write a Trace Event Format file (Perfetto, chrome://tracing); creates OUT's folder",
    )
    parser.add_argument(
        "--include-warmup",
        action="store_true",
        help="keep warm-up records (SGLang's start-up request, X-Mmtrace-Warmup requests); left out by default",
    )


def _confidence(text: str) -> float:
    """``--confidence``'s type: a level strictly between 0 and 1 (0.95, not 95)."""
    value = float(text)
    if not 0.0 < value < 1.0:
        raise argparse.ArgumentTypeError(f"{text} is not between 0 and 1 (write 0.99, not 99)")
    return value


def _error(message: str) -> int:
    print(f"{PROG}: {message}", file=sys.stderr)
    return 1


def _describe_skipped(skipped: list[tuple[int, str]]) -> str:
    """``N line(s) skipped (line 3: not JSON (...); line 9: incomplete last line; ...)``."""
    named = "; ".join(f"line {n}: {why}" for n, why in skipped[:SHOWN_SKIPS])
    more = f"; {len(skipped) - SHOWN_SKIPS} more" if len(skipped) > SHOWN_SKIPS else ""
    return f"{len(skipped)} line{'s' if len(skipped) != 1 else ''} skipped ({named}{more})"


def _load(path: str, include_warmup: bool) -> list[dict[str, Any]]:
    """The records of ``path`` to report on; skipped lines and left-out warm-ups are said on stderr.

    Raises :class:`RecordsError` (one line) for a file that cannot be read, holds no valid record,
    or only warm-up records."""
    loaded = load_records(path)
    if not loaded.records:
        raise RecordsError(
            f"{path}: no valid records; {_describe_skipped(loaded.skipped)}"
            if loaded.skipped
            else f"{path}: no records (empty file)"
        )
    if loaded.skipped:
        print(f"{PROG}: {path}: {_describe_skipped(loaded.skipped)}", file=sys.stderr)
    records = loaded.records
    if not include_warmup:
        warm = sum(1 for r in records if r.get("warmup"))
        if warm:
            records = [r for r in records if not r.get("warmup")]
            if not records:
                raise RecordsError(f"{path}: only warm-up records; --include-warmup shows them")
            print(f"{PROG}: {path}: {warm} warm-up record(s) left out (--include-warmup keeps them)", file=sys.stderr)
    sampled = sampled_by_windows(records)
    if sampled:
        print(f"{PROG}: {path}: {sampled}", file=sys.stderr)
    return records


def sampled_by_windows(records: list[dict[str, Any]]) -> str | None:
    """The line that says the records are a sample: served in tracing windows (``SGLANG_MMTRACE_WINDOW``,
    the record's ``window``), so counts and rates are those of the windows, not of the server."""
    schedules = sorted({(w["window_s"], w["period_s"]) for r in records if (w := r.get("window"))})
    if not schedules:
        return None
    shown = ", ".join(f"{w:g} s every {p:g} s" for w, p in schedules)
    n = sum(1 for r in records if r.get("window"))
    return f"sampled by tracing windows: {shown} ({n} of {len(records)} records; counts and rates are a sample)"


def _write_error(exc: OSError, outputs: tuple[str | None, ...]) -> int:
    """A file where the folder should be, an output that is a folder, no permission, disk full."""
    what = "write" if exc.filename in outputs else "create folder"
    return _error(f"cannot {what} {exc.filename}: {exc.strerror or exc}")


def run(args: argparse.Namespace) -> int:
    if args.compare:
        return _run_compare(args)
    if args.file is None:
        return _error("a records file, or --compare BASE NEW, is required")
    if args.confidence is not None:
        return _error("--confidence is the level of --compare's intervals; one file has none")
    try:
        records = _load(args.file, args.include_warmup)
    except RecordsError as exc:
        return _error(str(exc))
    summary = summarize(records, report_group)
    print(json.dumps(summary, indent=2) if args.json else format_table(summary))
    try:
        if args.html:
            from ..report import write_html

            Path(args.html).parent.mkdir(parents=True, exist_ok=True)
            write_html(records, args.html, report_group)
            print(f"HTML report: {args.html}", file=sys.stderr)
        if args.chrome_trace:
            from ..report import write_trace

            Path(args.chrome_trace).parent.mkdir(parents=True, exist_ok=True)
            slices = write_trace(records, args.chrome_trace, report_group)
            print(f"Chrome trace ({slices} slices): {args.chrome_trace}", file=sys.stderr)
    except OSError as exc:
        return _write_error(exc, (args.html, args.chrome_trace))
    return 0


def _run_compare(args: argparse.Namespace) -> int:
    """``--compare BASE NEW``: load both (same rules as one file), compare, print, optionally --html."""
    if args.file is not None:
        return _error(f"give either a records file or --compare BASE NEW, not both ({args.file})")
    if args.chrome_trace:
        return _error("--chrome-trace takes one records file, not --compare")
    try:
        from ..report.compare import CONFIDENCE, compare, format_compare
    except ModuleNotFoundError as exc:  # the bootstrap is the lab's (numpy); plain report runs without it
        if not lacks_extra(exc):
            raise
        return needs_extra(f"{PROG} --compare")
    base_path, new_path = args.compare
    try:
        base, new = (_load(path, args.include_warmup) for path in (base_path, new_path))
    except RecordsError as exc:
        return _error(str(exc))
    confidence = CONFIDENCE if args.confidence is None else args.confidence
    comparison = compare(base, new, report_group, confidence=confidence)
    if not comparison["groups"]:
        return _error(
            f"no group in common: BASE has {', '.join(comparison['only_base']) or 'no timed group'};"
            f" NEW has {', '.join(comparison['only_new']) or 'no timed group'}"
        )
    print(json.dumps(comparison, indent=2) if args.json else format_compare(comparison, base_path, new_path))
    if args.html:
        from ..report.compare_html import write_compare_html

        try:
            Path(args.html).parent.mkdir(parents=True, exist_ok=True)
            write_compare_html(base, new, args.html, base_path, new_path, report_group, confidence)
        except OSError as exc:
            return _write_error(exc, (args.html,))
        print(f"HTML comparison: {args.html}", file=sys.stderr)
    return 0
