"""Shared helpers of the benchmarks: robust statistics and a description of the machine."""

from __future__ import annotations

import datetime as _dt
import os
import platform
import subprocess
import sys
from pathlib import Path
from typing import Any

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
RESULTS = Path(__file__).resolve().parent / "results"


def quantile(xs: Any, q: float) -> float:
    return float(np.quantile(np.asarray(xs, dtype=float), q))


def bootstrap_median_ci(xs: Any, n_boot: int = 2000, alpha: float = 0.05, seed: int = 0) -> tuple[float, float]:
    """Percentile bootstrap interval of the median (resampling the given samples)."""
    a = np.asarray(xs, dtype=float)
    if a.size == 0:
        return float("nan"), float("nan")
    rng = np.random.default_rng(seed)
    meds = np.median(a[rng.integers(0, a.size, size=(n_boot, a.size))], axis=1)
    return float(np.quantile(meds, alpha / 2)), float(np.quantile(meds, 1 - alpha / 2))


def cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown"


def git_state() -> dict[str, Any]:
    """The plugin tree the numbers belong to (read-only git queries)."""

    def run(*args: str) -> str:
        try:
            return subprocess.run(["git", *args], cwd=ROOT, capture_output=True, text=True, timeout=10).stdout.strip()
        except Exception:
            return ""

    dirty = run("status", "--porcelain", "--", "sglang_mmtrace")
    return {"commit": run("rev-parse", "--short", "HEAD"), "plugin_tree_dirty": bool(dirty)}


def machine() -> dict[str, Any]:
    try:
        from importlib.metadata import version

        sglang_version = version("sglang")
    except Exception:
        sglang_version = None
    return {
        "date_utc": _dt.datetime.now(_dt.UTC).strftime("%Y-%m-%d %H:%M:%S"),
        "cpus": os.cpu_count(),
        "cpu_model": cpu_model(),
        "accelerator": "none (CPU only)",
        "python": sys.version.split()[0],
        "sglang": sglang_version,
        "loadavg_at_start": list(os.getloadavg()),
        **git_state(),
    }
