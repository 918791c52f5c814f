"""The paired probe's analysis (``benchmarks/gpu/probe_017.py --paired``), on synthetic calls with known
effects: it attributes the H200's TTFT cost in the issue-11 results, so a wrong window or pairing
would misplace it. The probe itself runs on a server (the device, or ``--cpu`` here by hand)."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import pytest

PROBE = Path(__file__).resolve().parents[1] / "benchmarks" / "gpu" / "probe_017.py"


@pytest.fixture(scope="module")
def probe():
    spec = importlib.util.spec_from_file_location("probe_017", PROBE)
    assert spec is not None and spec.loader is not None
    mod = importlib.util.module_from_spec(spec)
    sys.modules["probe_017"] = mod
    spec.loader.exec_module(mod)
    yield mod
    sys.modules.pop("probe_017", None)


def test_in_windows_sums_the_overlap_only(probe) -> None:
    flat = [0.5, 1.5, 2.0, 2.5, 2.9, 4.0, 9.0, 9.5]  # calls: [0.5,1.5], [2,2.5], [2.9,4], [9,9.5]
    got = probe.in_windows(flat, [(1.0, 3.0), (5.0, 6.0)])
    assert got[0] == (pytest.approx(0.5 + 0.5 + 0.1), 3)  # clipped at both ends
    assert got[1] == (0.0, 0)


def test_first_in_windows_is_the_first_call_starting_inside(probe) -> None:
    flat = [0.5, 1.5, 2.0, 2.5, 2.2, 2.3]  # unsorted: the probe's threads append as calls end
    got = probe.first_in_windows(flat, [(1.0, 3.0), (3.0, 4.0)])
    assert got[0] == (pytest.approx(1.0), pytest.approx(1.5))  # [2.0, 2.5] relative to 1.0
    assert got[1] is None


def _requests(rounds: int, ttft: dict[str, float]) -> list[dict]:
    """One request per kind and arm per round, 1 s apart; ``ttft`` per arm."""
    sent, t = [], 100.0
    for r in range(rounds):
        for kind in ("new_image", "same_image", "text"):
            for arm in ("on", "off") if r % 2 == 0 else ("off", "on"):
                sent.append({"round": r, "kind": kind, "arm": arm, "t_send": t, "ttft_s": ttft[arm]})
                t += 1.0
    return sent


def test_a_cost_before_a_point_shows_from_that_point_on(probe) -> None:
    """The 'on' arm's scheduler call starts 300 µs later and lasts 50 µs longer: the checkpoints put
    +300 µs at its start and +350 µs at its end; the durations table, +50 µs on that target only."""
    sent = _requests(30, {"on": 0.0104, "off": 0.0100})
    flat = []
    for s in sent:
        late, longer = (300e-6, 50e-6) if s["arm"] == "on" else (0.0, 0.0)
        start = s["t_send"] + 0.004 + late
        flat += [start, start + 0.002 + longer]
    calls = {"scheduler": {"scheduler.run_batch": flat}}
    points = {row["point"]: row for row in probe.checkpoints(sent, calls)["text"]}
    assert points["scheduler:scheduler.run_batch start"]["delta_us"] == pytest.approx(300.0)
    assert points["scheduler:scheduler.run_batch end"]["delta_us"] == pytest.approx(350.0)
    assert points["client.first_chunk"]["delta_us"] == pytest.approx(400.0)
    rows = probe.paired_table(sent, calls)["text"]
    assert rows["pairs"] == 30
    assert rows["targets"]["scheduler:scheduler.run_batch"]["delta_us"] == pytest.approx(50.0)
    assert rows["targets"]["client.ttft"]["delta_us"] == pytest.approx(400.0)
