"""Carry-over in a same-instance overhead run: each arm's TTFT by the arm of the request sent before it.

With the arms alternating request by request (``bench --experiment overhead`` without ``--lead-in``),
the request right after another arm's pays for what that request and the switch flip before it left
behind, and each arm follows a fixed set of other arms.
This tool shows it: per kind and arm, the median client TTFT (ms) of the requests whose predecessor
(in sending order, the previous line) was each other arm, and the difference between predecessors
on the plugin's switch (``on``) and off it, for the arms that have both. A run with lead-ins has
untimed requests between its lines, so its predecessors are not in the lines: use it on runs without.

    python -m benchmarks.carryover RUN/overhead_peer.jsonl.gz [MORE ...]
"""

from __future__ import annotations

import argparse
import itertools
from collections import defaultdict

import numpy as np

from sglang_mmtrace.bench.overhead import ALL_ARMS, KINDS
from sglang_mmtrace.report.analysis import read_jsonl


def by_predecessor(lines: list[dict]) -> dict[tuple[str, str, str], list[float]]:
    """(kind, arm, the previous line's arm) -> client TTFTs in ms, of the timed requests that answered."""
    out: dict[tuple[str, str, str], list[float]] = defaultdict(list)
    ordered = sorted(lines, key=lambda ln: ln["bench"]["sent_unix_s"])
    for prev, ln in itertools.pairwise(ordered):
        b = ln["bench"]
        if b["ok"] and b.get("client_ttft_s") is not None:
            out[(b["kind"], b["arm"], prev["bench"]["arm"])].append(b["client_ttft_s"] * 1e3)
    return out


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("lines", nargs="+", help="a run's request lines (jsonl, gzipped or not)")
    ap.add_argument("--min-n", type=int, default=20, help="leave out cells with fewer requests (%(default)s)")
    args = ap.parse_args(argv)
    for path in args.lines:
        cells = by_predecessor(read_jsonl(path))
        print(path)
        for kind in KINDS:
            for arm in ALL_ARMS:
                row = {p: v for p in ALL_ARMS if len(v := cells.get((kind, arm, p), ())) >= args.min_n}
                if not row:
                    continue
                shown = "  ".join(f"after {p}: {np.median(v):.2f} (n={len(v)})" for p, v in row.items())
                others = [np.median(v) for p, v in row.items() if p != "on"]
                gap = (
                    f"  after on - after another: {np.median(row['on']) - np.median(others):+.2f}"
                    if "on" in row and others
                    else ""
                )
                print(f"  {kind:<11} {arm:<7} {shown}{gap}")


if __name__ == "__main__":
    main()
