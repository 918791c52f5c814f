"""Robust statistics for the experiments: percentile-bootstrap intervals and paired A/B effects.

Point quantiles are ``analysis.quantile`` (one definition for ``report`` and the bench); the
intervals here use numpy's default quantile method, which is the same linear interpolation.

Latency samples from a shared machine are skewed and carry outliers, so the bench reports medians
and percentiles, each with a bootstrap 95% interval, and A/B effects as paired differences/ratios.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

N_BOOT = 2000


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


def bootstrap_slope_ci(
    xs: Sequence[float], ys: Sequence[float], n_boot: int = N_BOOT, alpha: float = 0.05, seed: int = 0
) -> tuple[float, float]:
    """Percentile bootstrap interval of the least-squares slope of ``ys`` on ``xs`` (the pairs
    resampled together). Resamples whose x values are all equal have no slope and are left out;
    NaN bounds for fewer than 3 pairs or fewer than two distinct x values."""
    x, y = np.asarray(xs, dtype=float), np.asarray(ys, dtype=float)
    if x.size < 3 or x.size != y.size or np.ptp(x) == 0:
        return float("nan"), float("nan")
    rng = np.random.default_rng(seed)
    idx = rng.integers(0, x.size, size=(n_boot, x.size))
    bx, by = x[idx], y[idx]
    dx = bx - bx.mean(axis=1, keepdims=True)
    sxx = (dx * dx).sum(axis=1)
    keep = sxx > 0
    slopes = (dx * (by - by.mean(axis=1, keepdims=True))).sum(axis=1)[keep] / sxx[keep]
    return float(np.quantile(slopes, alpha / 2)), float(np.quantile(slopes, 1 - alpha / 2))


def bootstrap_median_diff_ci(
    a: Sequence[float], b: Sequence[float], n_boot: int = N_BOOT, alpha: float = 0.05, seed: int = 0
) -> tuple[float, float]:
    """Percentile bootstrap interval of ``median(b) - median(a)`` for two independent samples.

    Each side is resampled on its own (``report --compare``: two runs, two servers, no pairing of
    requests), so unequal sizes are fine. NaN bounds when a side has fewer than 2 samples: a
    "bootstrap" of one value is that value, an interval of width zero that would call any
    difference real. The fixed seed makes the same two files give the same interval.
    """
    x, y = np.asarray(a, dtype=float), np.asarray(b, dtype=float)
    if x.size < 2 or y.size < 2:
        return float("nan"), float("nan")
    rng = np.random.default_rng(seed)
    mx = np.median(x[rng.integers(0, x.size, size=(n_boot, x.size))], axis=1)
    my = np.median(y[rng.integers(0, y.size, size=(n_boot, y.size))], axis=1)
    diffs = my - mx
    return float(np.quantile(diffs, alpha / 2)), float(np.quantile(diffs, 1 - alpha / 2))


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


def geomean_ratio_ci(
    strata: Sequence[tuple[Sequence[float], Sequence[float]]],
    n_boot: int = N_BOOT,
    alpha: float = 0.05,
    seed: int = 0,
) -> tuple[float, float, float]:
    """Geometric mean over strata of ``median(b) / median(a)`` (paired samples per stratum), with a
    bootstrap interval that resamples pairs within each stratum independently.

    The crossover estimator: one stratum per orientation (which arm's server started first), so a
    server-position effect enters each orientation's ratio with the opposite sign and cancels.
    """
    if not strata or any(len(a) == 0 or len(a) != len(b) for a, b in strata):
        return float("nan"), float("nan"), float("nan")
    rng = np.random.default_rng(seed)
    logs = np.zeros(n_boot)
    point = 0.0
    for a, b in strata:
        x, y = np.asarray(a, dtype=float), np.asarray(b, dtype=float)
        idx = rng.integers(0, x.size, size=(n_boot, x.size))
        logs += np.log(np.median(y[idx], axis=1) / np.median(x[idx], axis=1))
        point += float(np.log(np.median(y) / np.median(x)))
    k = len(strata)
    boot = np.exp(logs / k)
    return float(np.exp(point / k)), float(np.quantile(boot, alpha / 2)), float(np.quantile(boot, 1 - alpha / 2))


# two-sided 97.5% quantiles of Student's t for 1..30 degrees of freedom (no scipy needed)
_T975 = (
    12.706, 4.303, 3.182, 2.776, 2.571, 2.447, 2.365, 2.306, 2.262, 2.228, 2.201, 2.179, 2.160, 2.145, 2.131,
    2.120, 2.110, 2.101, 2.093, 2.086, 2.080, 2.074, 2.069, 2.064, 2.060, 2.056, 2.052, 2.048, 2.045, 2.042,
)  # fmt: skip


def t975(df: int) -> float:
    return _T975[df - 1] if 1 <= df <= len(_T975) else 1.96


def ratio_of_means_ci(a: Sequence[float], b: Sequence[float]) -> tuple[float, float, float]:
    """``mean(b) / mean(a)`` over paired samples, with a 95% t interval on the pairs' log ratios
    (few pairs, e.g. 3-5 throughput segment pairs: a bootstrap over so few is meaningless).
    The interval is centred on the pairs' geometric mean ratio; NaN bounds for fewer than 2 pairs."""
    x, y = np.asarray(a, dtype=float), np.asarray(b, dtype=float)
    if x.size == 0 or x.size != y.size or np.any(x <= 0) or np.any(y <= 0):
        return float("nan"), float("nan"), float("nan")
    point = float(y.mean() / x.mean())
    if x.size < 2:
        return point, float("nan"), float("nan")
    logs = np.log(y / x)
    half = t975(x.size - 1) * float(logs.std(ddof=1)) / np.sqrt(x.size)
    return point, float(np.exp(logs.mean() - half)), float(np.exp(logs.mean() + half))
