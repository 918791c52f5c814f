"""Pool same-instance overhead runs: the plugin's paired TTFT cost per kind over one or more runs.

Each run folder holds the ``overhead.lines.jsonl.gz`` that ``sglang-mmtrace bench --experiment
overhead --out`` (or ``benchmarks/gpu/overhead_017.py``) wrote. For each named group of runs and each
request kind it prints the paired delta TTFT(on) - TTFT(off), the median over rounds in ms with a
bootstrap 95% interval, also as a share of the group's 'off' median; with ``--aa`` the same for the
control arm (plugin off twice, ``--control`` runs): how far the method alone lands from 0. ``--diff A
B`` adds median(B) - median(A) of two groups' deltas with an interval that resamples each group on
its own (independent runs, no pairing), e.g. the plugin against its bare-wrapper skeleton
(``benchmarks/skeleton.py``). Paired deltas pool across runs; ratios of medians do not, since runs on
different hosts have different TTFTs.

    python -m benchmarks.overhead_pool \\
        --group plugin=benchmarks/results/overhead-skeleton-h100-20261206/run-2/plugin \\
        --group skeleton=benchmarks/results/overhead-skeleton-h100-20261206/run-2/skel,benchmarks/results/overhead-skeleton-h100-20261206/skel \\
        --aa --diff skeleton plugin
    python -m benchmarks.overhead_pool --table --group h100=RUN_A/overhead_peer.jsonl.gz,RUN_B/overhead_peer.jsonl.gz
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import numpy as np

from sglang_mmtrace.bench import overhead
from sglang_mmtrace.bench.overhead import CONTROL, KINDS, pairs, ttft_ms
from sglang_mmtrace.bench.stats import bootstrap_median_ci, bootstrap_median_diff_ci
from sglang_mmtrace.report.analysis import read_jsonl

LINES = "overhead.lines.jsonl.gz"


def read_run(folder: str) -> list[dict]:
    """One run's request lines: the folder's ``overhead.lines.jsonl.gz`` (or a lines file itself)."""
    path = Path(folder)
    return read_jsonl(str(path / LINES if path.is_dir() else path))


def pooled(runs: list[list[dict]]) -> list[dict]:
    """The runs' lines as one run whose rounds stay paired within their own run: each run's lines get
    the run's index as their ``launch`` (``overhead.rounds`` keys a round by launch and number)."""
    return [{**ln, "bench": {**ln["bench"], "launch": i}} for i, lines in enumerate(runs) for ln in lines]


def deltas(runs: list[list[dict]], kind: str, arms: tuple[str, str]) -> tuple[np.ndarray, float]:
    """Paired deltas (ms) pooled over the runs, and the pooled median of the first arm (ms)."""
    first, second = ttft_ms([p for lines in runs for p in pairs(lines, kind, arms)])
    return second - first, float(np.median(first)) if first.size else float("nan")


def summary(xs: np.ndarray, base: float) -> str:
    lo, hi = bootstrap_median_ci(xs)
    m = float(np.median(xs))
    pct = f"{100 * m / base:+.2f}% [{100 * lo / base:+.2f}, {100 * hi / base:+.2f}]"
    return f"{m:+.3f} [{lo:+.3f}, {hi:+.3f}] ms, {pct} (n={xs.size})"


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument(
        "--group", action="append", required=True, metavar="NAME=DIR[,DIR...]", help="runs pooled under NAME"
    )
    ap.add_argument("--aa", action="store_true", help="also the A/A control (off vs off again) per group")
    ap.add_argument("--diff", nargs=2, metavar=("A", "B"), help="median delta of group B minus group A")
    ap.add_argument(
        "--table",
        action="store_true",
        help="per group, the bench's own table (every arm the runs have: A/A, SGLang tracing, between windows) over "
        "the pooled runs, each run's rounds paired within it",
    )
    ap.add_argument("--out", help="write the table as JSON here too")
    args = ap.parse_args(argv)
    groups: dict[str, list[list[dict]]] = {}
    for spec in args.group:
        name, _, folders = spec.partition("=")
        groups[name] = [read_run(f) for f in folders.split(",") if f]
    if args.table:
        for name, runs in groups.items():
            lines = pooled(runs)
            print("\n".join(overhead.notes(overhead.summary(lines), f"{name}: {len(runs)} run(s) pooled")))
        return
    out: dict[str, dict[str, str]] = {}
    for kind in KINDS:
        out[kind] = {}
        ab: dict[str, np.ndarray] = {}
        for name, runs in groups.items():
            ab[name], off = deltas(runs, kind, ("off", "on"))
            out[kind][name] = summary(ab[name], off)
            if args.aa:
                aa, off = deltas(runs, kind, ("off", CONTROL))
                if aa.size:
                    out[kind][f"{name} A/A"] = summary(aa, off)
        if args.diff:
            a, b = args.diff
            lo, hi = bootstrap_median_diff_ci(ab[a], ab[b])
            out[kind][f"{b} - {a}"] = f"{np.median(ab[b]) - np.median(ab[a]):+.3f} [{lo:+.3f}, {hi:+.3f}] ms"
        print(kind)
        for label, text in out[kind].items():
            print(f"  {label:<24} {text}")
    if args.out:
        Path(args.out).write_text(json.dumps(out, indent=1) + "\n")


if __name__ == "__main__":
    main()
