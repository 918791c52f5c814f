"""Coverage is the union of non-root stage intervals inside [0, ttft], over ttft."""

from __future__ import annotations

import pytest

from sglang_mmtrace.join.record import StageEvent, coverage, stage_dicts, union_length


def test_union_merges_overlaps_and_clips():
    assert union_length([(0, 1), (0.5, 2), (3, 4)], 0, 10) == pytest.approx(3.0)
    assert union_length([(-1, 1), (9, 12)], 0, 10) == pytest.approx(2.0)
    assert union_length([], 0, 1) == 0.0
    assert union_length([(2, 3)], 0, 1) == 0.0


def test_nested_stages_do_not_double_count():
    stages = stage_dicts(
        [
            StageEvent("request", "api", 10.0, 11.0),
            StageEvent("tokenize", "api", 10.1, 10.5),
            StageEvent("mm.process", "api", 10.2, 10.4),
            StageEvent("model.forward", "scheduler", 10.6, 10.9),
        ],
        arrival=10.0,
    )
    attributed, cov = coverage(stages, ttft_s=1.0)
    assert attributed == pytest.approx(0.7)
    assert cov == pytest.approx(0.7)
    assert [s["name"] for s in stages] == ["request", "tokenize", "mm.process", "model.forward"]
    assert stages[1]["start_s"] == pytest.approx(0.1) and stages[1]["dur_s"] == pytest.approx(0.4)


def test_no_ttft_means_no_coverage():
    assert coverage([{"name": "tokenize", "start_s": 0.0, "dur_s": 1.0}], None) == (0.0, 0.0)
