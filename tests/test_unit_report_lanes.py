"""Chrome-trace lane packing: every lane holds properly nested slices, whatever the intervals.

Pure algorithm test (no records): intervals are drawn at random, including partial overlaps that
real records can hold (GPU-clock stages, joined inbox waits), and every one must land in a lane
where it nests.
"""

from __future__ import annotations

import random

import pytest

from sglang_mmtrace.report.chrome_trace import _place


def _nesting_problems(lane: list[tuple[int, int]]) -> list[str]:
    out = []
    for i, (s1, e1) in enumerate(lane):
        for s2, e2 in lane[i + 1 :]:
            disjoint = e1 <= s2 or e2 <= s1
            nested = (s1 <= s2 and e2 <= e1) or (s2 <= s1 and e1 <= e2)
            if not (disjoint or nested):
                out.append(f"[{s1},{e1}] and [{s2},{e2}] overlap partially")
    return out


def _pack(intervals: list[tuple[int, int]]) -> dict[int, list[tuple[int, int]]]:
    lanes: list[list[int]] = []
    out: dict[int, list[tuple[int, int]]] = {}
    for start, end in sorted(intervals, key=lambda iv: (iv[0], -iv[1])):
        out.setdefault(_place(lanes, start, end), []).append((start, end))
    return out


@pytest.mark.parametrize("seed", range(20))
def test_random_intervals_pack_into_nested_lanes(seed: int) -> None:
    rng = random.Random(seed)
    intervals = []
    for _ in range(rng.randint(1, 60)):
        start = rng.randint(0, 1000)
        intervals.append((start, start + rng.choice((0, rng.randint(0, 50), rng.randint(0, 800)))))
    packed = _pack(intervals)
    assert sorted(iv for lane in packed.values() for iv in lane) == sorted(intervals)
    for lane, slices in packed.items():
        assert not _nesting_problems(slices), f"lane {lane}: {_nesting_problems(slices)}"


def test_nested_and_adjacent_intervals_share_one_lane() -> None:
    # a root, two children, a grandchild, a zero-length mark and an adjacent sibling: one lane
    intervals = [(0, 100), (0, 40), (10, 20), (40, 40), (40, 100), (100, 130)]
    assert set(_pack(intervals)) == {0}


def test_partial_overlap_opens_a_second_lane() -> None:
    packed = _pack([(0, 100), (10, 50), (40, 120)])
    assert packed == {0: [(0, 100), (10, 50)], 1: [(40, 120)]}
