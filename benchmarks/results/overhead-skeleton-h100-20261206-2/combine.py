"""This host's plugin and skeleton runs, and the skeleton pooled with the first skeleton run
(``../overhead-skeleton-h100-20261206/skel``, another H100): paired deltas in ms, % of the off median.

    python benchmarks/results/overhead-skeleton-h100-20261206-2/combine.py
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np

from sglang_mmtrace.bench.overhead import KINDS, pairs, ttft_ms
from sglang_mmtrace.bench.stats import bootstrap_median_ci, bootstrap_median_diff_ci
from sglang_mmtrace.report.analysis import read_jsonl

HERE = Path(__file__).parent


def load(path: str) -> list[dict]:
    return read_jsonl(str(HERE.parent / path / "overhead.lines.jsonl.gz"))


RUNS = {
    "plugin": load(HERE.name + "/plugin"),
    "skel": load(HERE.name + "/skel"),
    "skel_first": load("overhead-skeleton-h100-20261206/skel"),
}


def on_minus_off(names: tuple[str, ...], kind: str) -> tuple[np.ndarray, float]:
    """Paired deltas (ms) of the runs, and their pooled 'off' median (ms)."""
    off, on = ttft_ms([p for name in names for p in pairs(RUNS[name], kind)])
    return on - off, float(np.median(off))


out: dict[str, dict[str, str]] = {}
for kind in KINDS:
    out[kind] = {}
    deltas: dict[str, np.ndarray] = {}
    for label, names in (
        ("plugin", ("plugin",)),
        ("skeleton", ("skel",)),
        ("skeleton_both_hosts", ("skel", "skel_first")),
    ):
        d, off = on_minus_off(names, kind)
        deltas[label] = d
        lo, hi = bootstrap_median_ci(d)
        m = float(np.median(d))
        out[kind][label] = (
            f"{m:+.3f} [{lo:+.3f}, {hi:+.3f}] ms, {100 * m / off:+.2f}% [{100 * lo / off:+.2f}, {100 * hi / off:+.2f}] (n={d.size})"
        )
    real, skel = deltas["plugin"], deltas["skeleton"]
    lo, hi = bootstrap_median_diff_ci(skel, real)
    out[kind]["plugin_minus_skeleton"] = f"{np.median(real) - np.median(skel):+.3f} [{lo:+.3f}, {hi:+.3f}] ms"
    print(kind, json.dumps(out[kind], indent=1))
(HERE / "combined.json").write_text(json.dumps(out, indent=1) + "\n")
