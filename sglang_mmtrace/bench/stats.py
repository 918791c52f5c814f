"""Robust statistics for the experiments: quantiles with percentile-bootstrap intervals.

Latency samples from a shared machine are skewed and carry outliers, so the bench reports medians
and percentiles, each with a bootstrap 95% interval, and A/B effects as paired differences/ratios.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

N_BOOT = 2000


def quantile(xs: Any, q: float) -> float:
    a = np.asarray(xs, dtype=float)
    return float(np.quantile(a, q)) if a.size else float("nan")


def bootstrap_quantile_ci(
    xs: Any, q: float = 0.5, n_boot: int = N_BOOT, alpha: float = 0.05, seed: int = 0
) -> tuple[float, float]:
    """Percentile bootstrap interval of the ``q`` quantile (resampling the given samples)."""
    a = np.asarray(xs, dtype=float)
    if a.size == 0:
        return float("nan"), float("nan")
    rng = np.random.default_rng(seed)
    stats = np.quantile(a[rng.integers(0, a.size, size=(n_boot, a.size))], q, axis=1)
    return float(np.quantile(stats, alpha / 2)), float(np.quantile(stats, 1 - alpha / 2))


def bootstrap_median_ci(xs: Any, n_boot: int = N_BOOT, alpha: float = 0.05, seed: int = 0) -> tuple[float, float]:
    """Percentile bootstrap interval of the median."""
    return bootstrap_quantile_ci(xs, 0.5, n_boot=n_boot, alpha=alpha, seed=seed)


def paired_ratio_ci(
    a: Sequence[float], b: Sequence[float], n_boot: int = N_BOOT, alpha: float = 0.05, seed: int = 0
) -> tuple[float, float, float]:
    """``median(b) / median(a)`` over paired samples (one pair per round), with a bootstrap interval
    that resamples whole pairs, so round-to-round drift of the machine cancels out."""
    x, y = np.asarray(a, dtype=float), np.asarray(b, dtype=float)
    if x.size == 0 or x.size != y.size:
        return float("nan"), float("nan"), float("nan")
    rng = np.random.default_rng(seed)
    idx = rng.integers(0, x.size, size=(n_boot, x.size))
    ratios = np.median(y[idx], axis=1) / np.median(x[idx], axis=1)
    point = float(np.median(y) / np.median(x))
    return point, float(np.quantile(ratios, alpha / 2)), float(np.quantile(ratios, 1 - alpha / 2))
