"""The first token's way from the scheduler to the client, from the records of a bench run.

The hand-off window of a request is its server TTFT (the first body bytes written) minus the end of
its ``scheduler.output`` stage (``stream_output`` returned, or the detokenizer began, whichever came
first): the detokenizer, the API process's output handling and the first chunk. Whatever else runs
on the machine in those few milliseconds (a plugin's ZMQ send waking the collector, its threads) can
only lengthen it, and unlike the whole TTFT it has no model forward in it, so it is a sharp measure of
such contention on a small machine. Only requests with a record have one (the plugin's 'on' arm).

    python -m benchmarks.handoff_window run1.jsonl run2.jsonl ...      # bench --out files, per kind
    python -m benchmarks.handoff_window --slim IN OUT                   # lines without the records' bulk

``--slim`` keeps, per line, the rid, status, server TTFT, coverage, the bench fields and the stages as
``[name, start_s, dur_s]``: what this script and the bench's summaries read.
"""

from __future__ import annotations

import argparse
import gzip
import json
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any

from ._common import bootstrap_median_ci, quantile


def read_lines(path: Path) -> Iterator[dict[str, Any]]:
    opener = gzip.open if path.suffix == ".gz" else open
    with opener(path, "rt") as f:
        for line in f:
            if line.strip():
                yield json.loads(line)


def _stages(line: dict[str, Any]) -> Iterable[tuple[str, float, float]]:
    for s in line.get("stages") or ():
        yield (s["name"], s["start_s"], s["dur_s"]) if isinstance(s, dict) else tuple(s)


def window_ms(line: dict[str, Any]) -> float | None:
    """Server TTFT minus the end of ``scheduler.output``, in ms (None without a record or that stage)."""
    ttft = line.get("ttft_s")
    out = next(((t0, d) for name, t0, d in _stages(line) if name == "scheduler.output"), None)
    if ttft is None or out is None:
        return None
    return (ttft - out[0] - out[1]) * 1e3


def windows_by_kind(lines: Iterable[dict[str, Any]]) -> dict[str, list[float]]:
    out: dict[str, list[float]] = {}
    for line in lines:
        w = window_ms(line)
        kind = (line.get("bench") or {}).get("kind")
        if w is not None and kind is not None and (line.get("bench") or {}).get("round", 0) >= 0:
            out.setdefault(kind, []).append(w)
    return out


def summary(windows: list[float]) -> dict[str, Any]:
    lo, hi = bootstrap_median_ci(windows)
    return {
        "n": len(windows),
        "p50_ms": quantile(windows, 0.5),
        "p50_ci_ms": [lo, hi],
        "p75_ms": quantile(windows, 0.75),
        "p90_ms": quantile(windows, 0.9),
    }


def slim(line: dict[str, Any]) -> dict[str, Any]:
    keep = {k: line.get(k) for k in ("rid", "status", "ttft_s", "coverage")}
    if line.get("stages"):
        keep["stages"] = [[n, round(t0, 9), round(d, 9)] for n, t0, d in _stages(line)]
    keep["bench"] = line.get("bench")
    return keep


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("files", nargs="+", type=Path)
    p.add_argument("--slim", action="store_true", help="FILES = IN OUT: write IN's lines slimmed to OUT (.gz ok)")
    p.add_argument("--json", action="store_true", help="print the summaries as JSON")
    args = p.parse_args(argv)
    if args.slim:
        src, dst = args.files
        opener = gzip.open if dst.suffix == ".gz" else open
        with opener(dst, "wt") as f:
            for line in read_lines(src):
                f.write(json.dumps(slim(line)) + "\n")
        return
    result = {str(f): {k: summary(v) for k, v in sorted(windows_by_kind(read_lines(f)).items())} for f in args.files}
    if args.json:
        print(json.dumps(result, indent=1))
        return
    print("| file | kind | n | window p50 ms [95% CI] | p75 | p90 |")
    print("|---|---|---:|---|---:|---:|")
    for f, kinds in result.items():
        for kind, s in kinds.items():
            lo, hi = s["p50_ci_ms"]
            print(
                f"| {Path(f).name} | {kind} | {s['n']} | {s['p50_ms']:.2f} [{lo:.2f}, {hi:.2f}] "
                f"| {s['p75_ms']:.2f} | {s['p90_ms']:.2f} |"
            )


if __name__ == "__main__":
    main()
