"""The plugin against its skeleton in this folder's three runs: paired deltas per run and pooled, and
the plugin's work (plugin minus skeleton) with a bootstrap interval (independent runs, no pairing).

    python benchmarks/results/overhead-skeleton-h100-20261206/combine.py
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np

from sglang_mmtrace.bench.overhead import CONTROL, KINDS, pairs, ttft_ms
from sglang_mmtrace.bench.stats import bootstrap_median_ci, bootstrap_median_diff_ci
from sglang_mmtrace.report.analysis import read_jsonl

HERE = Path(__file__).parent


def load(run: str) -> list[dict]:
    return read_jsonl(str(HERE / run / "overhead.lines.jsonl.gz"))


RUNS = {run: load(run) for run in ("new", "skel", "new2")}  # each run's lines read once


def deltas(run: str, kind: str, arms: tuple[str, str] = ("off", "on")) -> np.ndarray:
    off, on = ttft_ms(pairs(RUNS[run], kind, arms))
    return on - off


def row(xs: np.ndarray) -> str:
    lo, hi = bootstrap_median_ci(xs)
    return f"{np.median(xs):+.3f} [{lo:+.3f}, {hi:+.3f}] (n={xs.size})"


out = {}
for kind in KINDS:
    real = np.concatenate([deltas("new", kind), deltas("new2", kind)])
    skel = deltas("skel", kind)
    aa = np.concatenate([deltas(r, kind, ("off", CONTROL)) for r in RUNS])
    lo, hi = bootstrap_median_diff_ci(skel, real)
    out[kind] = {
        "plugin_pooled": row(real),
        "skeleton": row(skel),
        "aa_pooled": row(aa),
        "plugin_minus_skeleton": f"{np.median(real) - np.median(skel):+.3f} [{lo:+.3f}, {hi:+.3f}]",
    }
    print(kind, json.dumps(out[kind], indent=1))
(HERE / "combined.json").write_text(json.dumps(out, indent=1) + "\n")
