"""One quantile definition: ``report`` and the bench summaries print the same p50 for the same records."""

import math
import random
import statistics

import numpy as np
import pytest

from sglang_mmtrace.bench.summary import variant_summary
from sglang_mmtrace.report.analysis import quantile, summarize


@pytest.mark.parametrize("n", [1, 2, 3, 4, 7, 20, 101])
def test_quantile_is_numpys_linear_interpolation(n):
    rng = random.Random(n)
    xs = [rng.lognormvariate(0, 1) for _ in range(n)]
    for q in (0.0, 0.05, 0.5, 0.9, 0.95, 1.0):
        assert quantile(xs, q) == pytest.approx(float(np.quantile(xs, q)), rel=1e-12)
    assert quantile(xs, 0.5) == pytest.approx(statistics.median(xs), rel=1e-12)


def test_quantile_pins():
    assert quantile([4.0, 1.0, 3.0, 2.0], 0.5) == 2.5  # interpolated, not the nearest rank (2 or 3)
    assert quantile([1.0, 2.0, 3.0, 4.0, 5.0], 0.95) == pytest.approx(4.8)
    assert math.isnan(quantile([], 0.5))


def _line(i, ttft):
    rec = {
        "rid": f"r{i}",
        "status": "ok",
        "ttft_s": ttft,
        "coverage": 1.0,
        "attributed_s": ttft,
        "images": [],
        "cache": {},
        "stages": [{"name": "request", "process": "api", "start_s": 0.0, "dur_s": ttft, "clock": "host", "attrs": {}}],
    }
    bench = {"experiment": "e", "variant": "v", "ok": True, "record": True, "client_ttft_s": ttft, "usage": {}}
    return {**rec, "bench": bench}


def test_report_and_bench_agree_on_p50():
    lines = [_line(i, t) for i, t in enumerate([0.4, 0.1, 0.3, 0.2])]
    report = summarize(lines, group=lambda r: "all")["all"]
    bench = variant_summary(lines)
    assert report["ttft_p50"] == bench["server_ttft_p50"] == bench["client_ttft_p50"] == pytest.approx(0.25)
    assert report["ttft_p95"] == bench["client_ttft_p95"]
