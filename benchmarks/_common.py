"""Shared helpers of the benchmarks: a description of the machine; the statistics are the bench's
(``sglang_mmtrace.bench.stats``), re-exported here."""

from __future__ import annotations

import datetime as _dt
import os
import platform
import subprocess
import sys
from pathlib import Path
from typing import Any

from sglang_mmtrace.bench.stats import bootstrap_median_ci
from sglang_mmtrace.report.analysis import quantile

__all__ = ["ROOT", "bootstrap_median_ci", "machine", "quantile"]

ROOT = Path(__file__).resolve().parents[1]


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
