"""``sglang-mmtrace bench`` against the real CPU server: its lines match the plugin's records by rid,
its usage-based token counts agree with them, each experiment shows the cache behaviour it exists to
show, and the same-instance overhead experiments (runtime switch) leave records for exactly the
requests sent while on (small N; the numbers themselves are benchmarks, not asserted)."""

from __future__ import annotations

import json
import time
from collections import Counter, defaultdict
from pathlib import Path
from typing import Any

import pytest
from conftest import read_records, records, state
from peers.chromium import dump_dom, ink, parse_dom

from sglang_mmtrace import switch
from sglang_mmtrace.bench import overhead
from sglang_mmtrace.bench.records import rid_keys
from sglang_mmtrace.bench.summary import encoder_ran, summaries
from sglang_mmtrace.cli.main import main
from sglang_mmtrace.harness import ensure_tiny_model
from sglang_mmtrace.report.analysis import exclusive_times
from sglang_mmtrace.report.scaling import resolution_summary
from sglang_mmtrace.report.tail import OWN, parts, tail_summary

pytestmark = pytest.mark.server


def bench(tmp_path: Path, *args: str) -> list[dict[str, Any]]:
    out = tmp_path / "bench.jsonl"
    assert main(["bench", *args, "--seed", "7", "--out", str(out)]) == 0
    return [json.loads(line) for line in out.read_text().splitlines()]


def by_variant(lines: list[dict[str, Any]]) -> dict[str, list[dict[str, Any]]]:
    out: dict[str, list[dict[str, Any]]] = defaultdict(list)
    for ln in lines:
        out[ln["bench"]["variant"]].append(ln)
    return out


def check_matches_records(server, lines: list[dict[str, Any]]) -> None:
    """Every line is ok, carries the server's record for its rid verbatim, and usage agrees with it."""
    assert lines and all(ln["bench"]["ok"] and ln["bench"]["error"] is None for ln in lines)
    assert all(ln["bench"]["record"] for ln in lines)
    recs = records(server, [ln["rid"] for ln in lines])
    for ln in lines:
        assert {k: v for k, v in ln.items() if k != "bench"} == recs[ln["rid"]]
        u = ln["bench"]["usage"]
        assert u["prompt_tokens"] == ln["prompt_tokens"] and u["cached_tokens"] == ln["cached_tokens"]
        assert u["completion_tokens"] == ln["output_tokens"]
        assert ln["bench"]["client_ttft_s"] >= ln["ttft_s"] > 0


def visual(line: dict[str, Any]) -> int:
    return sum(img["visual_tokens"] for img in line["images"])


def test_new_vs_repeat(server, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    url = ["--url", server.base_url, "--records", str(server.jsonl_path)]
    lines = bench(tmp_path, *url, "--experiment", "new-vs-repeat", "--n", "3", "--warmup", "1", "--size", "256")
    check_matches_records(server, lines)
    v = by_variant(lines)
    new, rep = v["new image"], v["repeated image"]
    assert len(new) == len(rep) == 3 and len({ln["rid"] for ln in lines}) == 6
    assert len({ln["images"][0]["content_hash"] for ln in new}) == 3  # three distinct images
    assert len({ln["images"][0]["content_hash"] for ln in rep}) == 1
    for ln in new:
        assert encoder_ran(ln) and ln["cache"]["embedding"] == "miss" and not ln["cache"]["image_prefix_hit"]
    uncached_new = min(ln["prompt_tokens"] - ln["cached_tokens"] for ln in new)
    for ln in rep:
        assert not encoder_ran(ln) and ln["cache"]["image_prefix_hit"]
        # cached_tokens near prompt_tokens: what is left to compute is less than a new image's text part
        assert ln["prompt_tokens"] - ln["cached_tokens"] <= uncached_new - visual(ln)
    s = {x["variant"]: x for x in summaries(lines)}
    assert s["new image"]["cache"]["encoder_ran"] == 3 and s["repeated image"]["cache"]["encoder_ran"] == 0
    printed = capsys.readouterr().out
    assert "== new-vs-repeat" in printed and "repeated image vs new image:" in printed


def test_order(server, tmp_path: Path) -> None:
    url = ["--url", server.base_url, "--records", str(server.jsonl_path)]
    lines = bench(tmp_path, *url, "--experiment", "order", "--questions", "3", "--warmup", "1", "--size", "256")
    check_matches_records(server, lines)
    v = by_variant(lines)
    img_first, q_first = v["image first"], v["question first"]
    assert len(img_first) == len(q_first) == 3
    assert len({ln["images"][0]["content_hash"] for ln in lines}) == 1  # one image throughout
    for ln in img_first:
        assert ln["cache"]["image_prefix_hit"] and ln["cached_tokens"] >= visual(ln)
    template_and_image = min(ln["cached_tokens"] for ln in img_first)
    for ln in q_first:
        # only the template prefix is cached: less than what image-first shares besides the image
        assert ln["cached_tokens"] <= template_and_image - visual(ln)
        assert not ln["cache"]["image_prefix_hit"]
        # the image is not in the prefix, but its embedding is cached from the earlier requests
        assert ln["cache"]["embedding"] == "hit" and not encoder_ran(ln)


@pytest.fixture(scope="module")
def concurrency_lines(server, tmp_path_factory) -> list[dict[str, Any]]:
    url = ["--url", server.base_url, "--records", str(server.jsonl_path)]
    return bench(
        tmp_path_factory.mktemp("concurrency"), *url, "--experiment", "concurrency", "--concurrency", "1,4", "--n", "4",
        "--warmup", "1", "--size", "128",
    )  # fmt: skip


def test_concurrency(server, concurrency_lines: list[dict[str, Any]]) -> None:
    lines = concurrency_lines
    check_matches_records(server, lines)
    levels: dict[int, list[dict[str, Any]]] = defaultdict(list)
    for ln in lines:
        levels[ln["bench"]["concurrency"]].append(ln)
    assert {c: len(v) for c, v in levels.items()} == {1: 4, 4: 4}
    for ln in lines:
        assert "scheduler.queue" in {s["name"] for s in ln["stages"]}

    def max_in_flight(group: list[dict[str, Any]]) -> int:
        events = sorted(
            (t, d)
            for ln in group
            for t, d in (
                (ln["bench"]["sent_unix_s"], 1),
                (ln["bench"]["sent_unix_s"] + ln["bench"]["client_e2e_s"], -1),
            )
        )
        cur = best = 0
        for _, d in events:
            cur += d
            best = max(best, cur)
        return best

    assert max_in_flight(levels[1]) == 1
    assert max_in_flight(levels[4]) >= 2  # the 4 clients really overlapped
    s = {x["variant"]: x for x in summaries(lines)}
    assert s["4 clients"]["stages"]["scheduler.queue"]["n"] == 4


def encoder_stages(rec: dict[str, Any]) -> list[dict[str, Any]]:
    return [s for s in rec["stages"] if s["name"] == "model.vision_encoder" and not s["attrs"]["skipped"]]


def encoder_interval(rec: dict[str, Any], stage: dict[str, Any]) -> tuple[float, float]:
    """The encoder call on the wall clock: (start, duration); the requests of one call share it."""
    return rec["arrival_unix_s"] + stage["start_s"], stage["dur_s"]


def test_concurrency_tail(concurrency_lines: list[dict[str, Any]]) -> None:
    """Per level the slowest 5% (here 1 of 4 requests) against the median request: the parts (exclusive
    stage times, unattributed rest) add up to each request's TTFT, so the growths add up to the TTFT
    difference; a batched stage's own share is its exclusive time over the requests that shared it, and
    the vision encoder's ``requests`` is the number of this run's requests whose record has that call."""
    result = tail_summary(concurrency_lines)
    assert list(result) == ["1", "4"]
    calls = [encoder_interval(ln, st) for ln in concurrency_lines for st in encoder_stages(ln)]
    for c, level in result.items():
        recs = sorted(
            (ln for ln in concurrency_lines if ln["bench"]["concurrency"] == int(c)), key=lambda r: r["ttft_s"]
        )
        assert level["records"] == 4 and level["ttft_p99"] <= recs[-1]["ttft_s"]
        t = level["tail"]
        assert t["n"] == 1 and t["rids"] == [recs[-1]["rid"]] and t["median_rid"] == recs[1]["rid"]
        for rec in (recs[1], recs[-1]):
            p = parts(rec)
            assert sum(p.values()) == pytest.approx(rec["ttft_s"], abs=1e-6)
            excl = exclusive_times(rec)
            for st in encoder_stages(rec):
                k = st["attrs"]["requests"]
                here = encoder_interval(rec, st)
                same_call = sum(abs(here[0] - a) < 2e-3 and abs(here[1] - b) < 2e-3 for a, b in calls)
                assert k == same_call <= st["attrs"]["batch_size"], (k, same_call, st["attrs"])
                assert p[f"model.vision_encoder · {OWN}"] == pytest.approx(excl["model.vision_encoder"] / k)
        assert t["parts_sum"] == pytest.approx(recs[-1]["ttft_s"], abs=1e-6)
        assert sum(r["growth_s"] for r in t["parts"]) == pytest.approx(t["growth_s"], abs=1e-6)
        assert t["growth_s"] == pytest.approx(recs[-1]["ttft_s"] - recs[1]["ttft_s"], abs=1e-6)


@pytest.fixture(scope="module")
def resolution_lines(server, tmp_path_factory) -> list[dict[str, Any]]:
    url = ["--url", server.base_url, "--records", str(server.jsonl_path)]
    return bench(
        tmp_path_factory.mktemp("resolution"), *url, "--experiment", "resolution", "--sizes", ",".join(map(str, SIZES)),
        "--aspects", "1:1,16:9", "--n", str(ROUNDS), "--warmup", "1",
    )  # fmt: skip


SIZES = (256, 384, 512)  # long edges: small, for the CPU; 256x144 is below the processor's minimum pixels
ROUNDS = 3


def expected_tokens(width: int, height: int) -> int:
    """Visual tokens as the Qwen3-VL processor computes them: ``smart_resize`` to multiples of
    patch x merge (32 px) within the tiny model's min/max pixels, then one token per 32x32 px."""
    from transformers.models.qwen2_vl.image_processing_qwen2_vl import smart_resize

    cfg = json.loads((ensure_tiny_model() / "processor_config.json").read_text())["image_processor"]
    factor = cfg["patch_size"] * cfg["merge_size"]
    h, w = smart_resize(
        height, width, factor, min_pixels=cfg["size"]["shortest_edge"], max_pixels=cfg["size"]["longest_edge"]
    )
    return h * w // factor**2


def test_resolution(server, resolution_lines: list[dict[str, Any]]) -> None:
    """Every shape x kind, interleaved; sizes, bytes and visual tokens as the image and the processor
    say; repeats skip decoding and the encoder; the per-request fit finds decoding or resizing
    growing with pixels, and no stage that a repeat skips is fitted for the repeats."""
    lines = resolution_lines
    check_matches_records(server, lines)
    shapes = {(w, h) for e in SIZES for w, h in ((e, e), (e, round(e * 9 / 16)))}
    cells = Counter((ln["bench"]["width"], ln["bench"]["height"], ln["bench"]["kind"]) for ln in lines)
    assert cells == {(w, h, k): ROUNDS for w, h in shapes for k in ("new", "repeated")}
    first_round = [ln["bench"]["variant"] for ln in lines[: 2 * len(shapes)]]
    assert len(set(first_round)) == 2 * len(shapes)  # each round sends every cell once
    for ln in lines:
        b, (img,) = ln["bench"], ln["images"]
        assert (img["width"], img["height"], img["bytes"]) == (b["width"], b["height"], b["image_bytes"])
        assert img["visual_tokens"] == expected_tokens(b["width"], b["height"]), b["variant"]
        if b["kind"] == "repeated":
            assert ln["cache"]["image_prefix_hit"] and not encoder_ran(ln) and ln["cache"]["preprocess"] == "hit"
        else:
            assert encoder_ran(ln) and ln["cache"]["preprocess"] == "miss"
    result = resolution_summary(lines)
    by_cell = {(c["width"], c["height"], c["kind"]): c for c in result["cells"]}
    assert [c["megapixels"] for c in result["cells"]] == sorted(c["megapixels"] for c in result["cells"])
    for (w, h, _), c in by_cell.items():
        assert c["visual_tokens"] == expected_tokens(w, h) and c["records"] == ROUNDS
    tokens = [by_cell[(e, e, "new")]["visual_tokens"] for e in SIZES]
    assert tokens == sorted(tokens) and tokens[0] < tokens[-1]
    new, repeated = result["fits"]["new"], result["fits"]["repeated"]
    scaling = {s for s, f in new.items() if f["megapixels"]["verdict"] == "scales"}
    assert scaling & {"mm.decode", "mm.resize_normalize", "model.vision_encoder"}, table(new)
    for stage in scaling:
        assert new[stage]["megapixels"]["ci"][0] > 0 and new[stage]["megapixels"]["slope"] > 0
    assert not {"mm.decode", "mm.resize_normalize", "model.vision_encoder"} & set(repeated), table(repeated)


def table(fits: dict[str, Any]) -> str:
    return "\n".join(f"{s}: {f['megapixels']}" for s, f in fits.items())


def test_resolution_and_concurrency_html_in_headless_chromium(
    resolution_lines: list[dict[str, Any]], concurrency_lines: list[dict[str, Any]], tmp_path: Path
) -> None:
    """``report --html`` of both experiments' lines: the resolution charts have one point per shape on
    every line, the concurrency chart one per level, the tail bars are drawn, and the screenshot is not blank."""
    src = tmp_path / "both.jsonl"
    src.write_text("".join(json.dumps(ln) + "\n" for ln in [*resolution_lines, *concurrency_lines]))
    page = tmp_path / "report.html"
    assert main(["report", str(src), "--html", str(page)]) == 0
    non_white, colours = ink(page, tmp_path / "report.png")
    assert non_white > 0.03 and colours > 50, f"blank-looking screenshot: {non_white:.3f} non-white, {colours} colours"
    dom = parse_dom(dump_dom(page))
    (res,) = [s for s in dom.iter("section") if s.attrs.get("id") == "resolution"]
    kinds = {d.attrs["data-kind"]: d for d in res.iter("div", "resolution-kind")}
    assert set(kinds) == {"new", "repeated"}
    n_shapes = len({(ln["bench"]["width"], ln["bench"]["height"]) for ln in resolution_lines})
    for kind, block in kinds.items():
        series = {g.attrs["data-series"]: g for g in block.iter("g", "series")}
        assert "TTFT" in series and len(series) >= 2, kind
        ttft_points = list(series["TTFT"].iter("circle", "pt"))
        assert len(ttft_points) == n_shapes and any(float(p.attrs["data-ms"]) > 0 for p in ttft_points), kind
        assert {r.attrs["data-stage"] for r in block.iter("tr", "fit")} >= {"TTFT"}
    (conc,) = [s for s in dom.iter("section") if s.attrs.get("id") == "concurrency"]
    lines = {g.attrs["data-series"]: g for g in conc.iter("g", "series")}
    assert set(lines) == {"TTFT p50", "TTFT p95", "TTFT p99"}
    assert all(len(list(g.iter("circle", "pt"))) == 2 for g in lines.values())
    tails = {d.attrs["data-streams"]: d for d in conc.iter("div", "tail")}
    assert set(tails) == {"1", "4"}
    for c, block in tails.items():
        for side in ("median", "tail"):
            width = sum(float(r.attrs["width"]) for r in block.iter("rect", "seg") if r.attrs["data-side"] == side)
            assert width > 5, (c, side)


def test_caches_launch_mode(tmp_path: Path) -> None:
    """Launch mode, two configurations one after the other: radix cache on vs off."""
    lines = bench(
        tmp_path, "--launcher", "cpu", "--work-dir", str(tmp_path / "work"), "--experiment", "caches",
        "--launch", "--mm-preprocess-cache-size-mb 64",
        "--launch", "--mm-preprocess-cache-size-mb 64 --disable-radix-cache",
        "--n", "2", "--warmup", "1", "--size", "256",
    )  # fmt: skip
    assert all(ln["bench"]["ok"] and ln["bench"]["record"] for ln in lines)
    v = by_variant(lines)
    on, off = "--mm-preprocess-cache-size-mb 64", "--mm-preprocess-cache-size-mb 64 --disable-radix-cache"
    assert {k: len(x) for k, x in v.items()} == {
        f"{cfg}: {kind}": 2
        for cfg in (on, off)
        for kind in ("new image", "same image again", "same image, new question first")
    }
    for ln in lines:
        assert ln["bench"]["usage"]["cached_tokens"] == ln["cached_tokens"]
    for ln in v[f"{on}: same image again"]:
        assert ln["cache"]["image_prefix_hit"] and not encoder_ran(ln) and ln["cache"]["preprocess"] == "hit"
    for ln in v[f"{off}: same image again"]:
        # no radix cache: nothing cached, the embedding cache is what skips the encoder
        assert ln["cached_tokens"] == 0 and ln["cache"]["embedding"] == "hit" and not encoder_ran(ln)
        assert ln["cache"]["preprocess"] == "hit"
    for cfg in (on, off):
        assert all(encoder_ran(ln) for ln in v[f"{cfg}: new image"])
    assert all(ln["cached_tokens"] == 0 for ln in lines if ln["bench"]["config"] == off)


def test_overhead_and_ablation_on_one_instance(server, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """The same-instance experiments flip the real server's runtime switch before every request: both
    arms answer, the pairs are counted, and the server's JSONL holds a record for exactly the requests
    sent while the plugin (with its jsonl part) was on, none for the others. The switch is left as found."""
    url = ["--url", server.base_url, "--records", str(server.jsonl_path), "--json", "--size", "160x120"]
    url += ["--max-tokens", "2", "--gap-ms", "0", "--keep-records"]

    def run(*args: str) -> tuple[list[dict[str, Any]], dict[str, Any]]:
        capsys.readouterr()
        lines = bench(tmp_path, *url, *args)
        return lines, json.loads(capsys.readouterr().out)["results"]

    before = state_switch(server)
    ov_lines, res = run("--experiment", "overhead", "--n", "4", "--warmup", "1")
    ov = res["overhead"]  # with the A/A arm (off again) by default
    assert ov["aa"] is True and {k: v["n_rounds"] for k, v in ov["kinds"].items()} == {k: 4 for k in overhead.KINDS}
    for s in ov["kinds"].values():  # µs, each interval around its point, the A/A's verdict on 0 given
        assert s["delta_ci_us"][0] <= s["delta_us"] <= s["delta_ci_us"][1]
        assert s["aa_ci_us"][0] <= s["aa_us"] <= s["aa_ci_us"][1]
        assert s["aa_ci_contains_zero"] == (s["aa_ci_us"][0] <= 0 <= s["aa_ci_us"][1])
        assert s["target"]["met"] is None and s["target"]["not_judged"]  # 4 rounds judge nothing
        assert 1000 < s["off_median_us"] < 60e6
    assert len(ov_lines) == 36 and all(ln["bench"]["ok"] for ln in ov_lines)
    assert {(ln["bench"]["kind"], ln["bench"]["arm"]) for ln in ov_lines} == {
        (k, a) for k in overhead.KINDS for a in ("on", "off", "ctl")
    }
    for r in range(4):  # the three arms' order rotates by round
        lead = {ln["bench"]["arm"] for ln in ov_lines if ln["bench"]["round"] == r and ln["bench"]["order"] == 0}
        assert lead == {overhead.arm_order(r, control=True)[0]}
    assert len({ln["bench"]["generation"] for ln in ov_lines}) == 36  # a flip before every request
    check_records_only_when_on(server, ov_lines)
    assert ov["records"] == {"on_ok": 12, "on_with_record": 12, "off_ok": 24, "off_with_record": 0}
    assert state_switch(server) == {**before, "generation": state_switch(server)["generation"]}

    ab_lines, res = run("--experiment", "ablation", "--n", "2", "--warmup", "0")
    ab = res["ablation"]
    assert len(ab_lines) == 2 * 3 * 13 and all(ln["bench"]["ok"] for ln in ab_lines)
    assert sorted((ln["bench"]["kind"], ln["bench"]["level"]) for ln in ab_lines) == sorted(
        (k, i) for k in ("new_image", "same_image", "text") for i in range(13) for _ in range(2)
    )
    jsonl_level = switch.PARTS.index("jsonl") + 1
    assert all(ln["bench"]["expect_record"] == (ln["bench"]["level"] >= jsonl_level) for ln in ab_lines)
    check_records_only_when_on(server, ab_lines)
    assert ab["rounds"] == 2 and [row["part"] for row in ab["rows"]] == list(switch.PARTS)
    assert all(row[k]["n"] == 2 for row in [*ab["rows"], ab["whole"]] for k in ("new_image", "same_image", "text"))
    assert ab["records"] == {"expected": 24, "expected_found": 24, "unexpected_found": 0}
    assert "| part | new image us [CI] | same image us [CI] | text us [CI] |" in ab["markdown"]
    assert state_switch(server) == {**before, "generation": state_switch(server)["generation"]}


def state_switch(server) -> dict[str, Any]:
    return state(server)["api"]["switch"]


def check_records_only_when_on(server, lines: list[dict[str, Any]]) -> None:
    """By the response id (SGLang's rid) in the server's JSONL: one record per request that expected
    one (sent while on, with the jsonl part), none for the rest, also after the collector's grace."""
    want = [ln["rid"] for ln in lines if ln["bench"]["expect_record"]]
    records(server, want)
    time.sleep(3.0)  # SGLANG_MMTRACE_GRACE_S (2 s): a late record for an 'off' request would be written by now
    written = [r["rid"] for r in read_records(server.jsonl_path)]
    for ln in lines:
        n = sum(written.count(k) for k in rid_keys(ln["rid"]))
        assert n == (1 if ln["bench"]["expect_record"] else 0), (ln["bench"], n)
        assert ln["bench"]["record"] == ln["bench"]["expect_record"]
