"""The resolution fit and the concurrency tail on synthetic records with known answers: the fit is
numpy's least squares, a stage with a per-pixel cost scales and one without does not; a request's
tail parts add up to its TTFT and a batched stage's own share is its exclusive time over the batch."""

from __future__ import annotations

import random
from typing import Any

import numpy as np
import pytest

from sglang_mmtrace.report.html import render_html
from sglang_mmtrace.report.scaling import FLAT, SCALES, fit_line, resolution_summary
from sglang_mmtrace.report.tail import MATES, OWN, UNATTRIBUTED, parts, tail_summary


def stage(name: str, start: float, dur: float, **attrs: Any) -> dict[str, Any]:
    return {"name": name, "process": "api", "start_s": start, "dur_s": dur, "clock": "host", "attrs": attrs}


def record(rid: str, ttft: float, stages: list[dict[str, Any]], bench: dict[str, Any]) -> dict[str, Any]:
    covered = sum(s["dur_s"] for s in stages)  # the test's stages do not overlap
    return {
        "rid": rid, "status": "ok", "ttft_s": ttft, "coverage": covered / ttft, "attributed_s": covered,
        "images": [{"width": bench.get("width", 1), "height": bench.get("height", 1), "visual_tokens": 10, "bytes": 1}],
        "cache": {}, "stages": [stage("request", 0.0, ttft), *stages],
        "bench": {"ok": True, "record": True, "client_ttft_s": ttft + 0.001, **bench},
    }  # fmt: skip


def test_fit_line_is_least_squares() -> None:
    rng = random.Random(1)
    xs = [rng.uniform(0, 4) for _ in range(40)]
    ys = [0.003 + 0.01 * x + rng.gauss(0, 0.001) for x in xs]
    fit = fit_line(xs, ys)
    slope, intercept = np.polyfit(xs, ys, 1)
    assert fit["slope"] == pytest.approx(slope) and fit["intercept"] == pytest.approx(intercept)
    assert fit["verdict"] == SCALES and fit["ci"][0] <= fit["slope"] <= fit["ci"][1]


def test_resolution_summary_says_which_stages_scale() -> None:
    rng = random.Random(2)
    lines = []
    for i, edge in enumerate([256, 512, 1024, 2048] * 5):
        mp = edge * edge / 1e6
        decode = 0.001 + 0.02 * mp * rng.uniform(0.9, 1.1)  # 20 ms per megapixel
        parse = 0.002 * rng.uniform(0.5, 1.5)  # no pixel cost
        bench = {"experiment": "resolution", "variant": f"{edge}x{edge} new", "width": edge, "height": edge,
                 "aspect": "1:1", "kind": "new", "image_bytes": edge * 10}  # fmt: skip
        ttft = parse + decode + 0.001
        lines.append(record(f"r{i}", ttft, [stage("http.parse", 0.0, parse), stage("mm.decode", parse, decode)], bench))
    result = resolution_summary(lines)
    assert [(c["width"], c["n"]) for c in result["cells"]] == [(256, 5), (512, 5), (1024, 5), (2048, 5)]
    fits = result["fits"]["new"]
    assert fits["mm.decode"]["megapixels"]["verdict"] == SCALES
    assert fits["mm.decode"]["megapixels"]["slope"] == pytest.approx(0.02, rel=0.1)
    assert fits["http.parse"]["megapixels"]["verdict"] == FLAT and fits["TTFT"]["megapixels"]["verdict"] == SCALES


def test_tail_parts_add_up_and_share_a_batch() -> None:
    """A request whose encoder call served 4 requests: its own share is a quarter of the encoder's
    exclusive time; queue and encoder are the tail's growth against the median request."""
    lines = []
    for i in range(20):
        slow = i == 19
        queue = 0.5 if slow else 0.01
        enc = 0.2 if slow else 0.05
        n = 4 if slow else 1
        stages = [
            stage("scheduler.queue", 0.001, queue),
            stage("model.vision_encoder", 0.001 + queue, enc, batch_size=n + 1, requests=n, skipped=False),
        ]
        ttft = 0.001 + queue + enc + 0.002
        lines.append(record(f"r{i}", ttft, stages, {"experiment": "concurrency", "variant": "x", "concurrency": 8}))
    p = parts(lines[-1])
    assert p[f"model.vision_encoder · {OWN}"] == pytest.approx(0.05) and p[
        f"model.vision_encoder · {MATES}"
    ] == pytest.approx(0.15)
    assert sum(p.values()) == pytest.approx(lines[-1]["ttft_s"]) and p[UNATTRIBUTED] == pytest.approx(0.003)
    t = tail_summary(lines)["8"]["tail"]
    assert t["n"] == 1 and t["rids"] == ["r19"] and t["growth_s"] == pytest.approx(0.49 + 0.15)
    growth = {r["part"]: r["growth_s"] for r in t["parts"]}
    assert growth["scheduler.queue"] == pytest.approx(0.49)
    assert growth[f"model.vision_encoder · {OWN}"] == pytest.approx(0.0)  # 0.2 / 4 against 0.05 / 1
    assert growth[f"model.vision_encoder · {MATES}"] == pytest.approx(0.15)
    assert t["batches"]["model.vision_encoder"] == {"tail_requests": 4.0, "median_requests": 1}


def test_html_leaves_out_lines_without_the_experiments_keys() -> None:
    """Hand-edited bench lines (no image shape, a concurrency that is not a number) do not break the page."""
    good = record("r0", 0.1, [stage("http.parse", 0.0, 0.05)], {"experiment": "resolution", "variant": "v"})
    odd = record("r1", 0.1, [stage("http.parse", 0.0, 0.05)], {"experiment": "concurrency", "concurrency": "4"})
    page = render_html([good, odd])
    assert 'id="resolution"' not in page and 'id="concurrency"' not in page and 'id="breakdown"' in page


def test_html_fits_each_server_on_its_own() -> None:
    """A bench file with two launches (the two feature transports) gets one chart and fit per server:
    one fit over both would mix configurations; each is labelled by the launch words only it has."""
    lines = []
    for target, per_mp in (
        ("--model-path m --mm-feature-transport cuda_ipc", 0.01),
        ("--model-path m --mm-feature-transport cpu", 0.07),
    ):
        for i, edge in enumerate([256, 512, 1024, 2048] * 3):
            mp = edge * edge / 1e6
            recv = 0.001 + per_mp * mp
            bench = {"experiment": "resolution", "variant": f"{edge}x{edge} new", "width": edge, "height": edge,
                     "aspect": "1:1", "kind": "new", "image_bytes": edge * 10, "target": target}  # fmt: skip
            lines.append(record(f"{target[-3:]}{i}", recv + 0.002, [stage("scheduler.recv", 0.0, recv)], bench))
    page = render_html(lines)
    groups = page.split('class="target-group"')[1:]
    assert len(groups) == 2
    assert "server: <code>--mm-feature-transport cuda_ipc</code>" in groups[0]
    assert "server: <code>--mm-feature-transport cpu</code>" in groups[1]
    assert all(g.count('class="resolution-kind"') == 1 for g in groups)
    # each group's fit is its own server's slope: +10 ms/MP and +70 ms/MP
    assert "+10.000 [" in groups[0] and "+70.000 [" in groups[1]
    one = render_html([ln for ln in lines if ln["bench"]["target"].endswith("cpu")])
    assert 'class="target-group"' in one and "server: <code>" not in one  # one server: no label
