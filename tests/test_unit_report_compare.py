"""``sglang-mmtrace report --compare BASE NEW`` on synthetic records with known differences.

The records are drawn from fixed seeds, so every interval below is the same on every run: a stage
made 10 ms slower in NEW must come first with an interval clear of zero, two draws from one
distribution must be "no change" everywhere, a stage that one side never ran counts as 0 ms there,
groups on one side only are listed, warm-ups are left out unless asked, a higher ``--confidence``
widens every interval, and bad input is one line on stderr with exit status 1.
"""

from __future__ import annotations

import json
import math
import random
from pathlib import Path
from typing import Any

import pytest
from peers.chromium import parse_dom

from sglang_mmtrace.bench.stats import bootstrap_median_diff_ci
from sglang_mmtrace.cli.main import main
from sglang_mmtrace.report.compare import FASTER, NO_CHANGE, NO_INTERVAL, SLOWER, compare
from sglang_mmtrace.report.compare_html import render_compare_html

IMAGE = "image: encoded"
BASE_MS = {"tokenize": 4.0, "mm.decode": 3.0, "mm.resize_normalize": 6.0, "model.vision_encoder": 12.0}
NESTED = {"mm.decode", "mm.resize_normalize"}  # inside tokenize: not added to TTFT twice


def _record(rid: str, ms: dict[str, float], images: bool = True, **extra: Any) -> dict[str, Any]:
    """An ok record whose TTFT is the sum of its top-level stages (nested ones counted in tokenize)."""
    tok = ms.get("tokenize", 0.0) + sum(v for k, v in ms.items() if k in NESTED)
    ttft = (tok + sum(v for k, v in ms.items() if k not in NESTED and k != "tokenize")) / 1e3 + 0.002
    stages, t = (
        [{"name": "request", "process": "api", "start_s": 0.0, "dur_s": ttft, "clock": "host", "attrs": {}}],
        0.0,
    )
    for name, v in ms.items():
        dur = (tok if name == "tokenize" else v) / 1e3
        start = 0.0 if name in NESTED else t
        stages.append({"name": name, "process": "api", "start_s": start, "dur_s": dur, "clock": "host", "attrs": {}})
        if name not in NESTED:
            t += dur
    return {
        "rid": rid,
        "status": "ok",
        "arrival_unix_s": 1_700_000_000.0,
        "ttft_s": ttft,
        "images": [{"bytes": 100}] if images else [],
        "cache": {"preprocess": "miss", "embedding": "off", "image_prefix_hit": False},
        "stages": stages,
        "coverage": 0.95,
        **extra,
    }


def _draw(seed: int, n: int = 24, shift: dict[str, float] | None = None, drop: tuple[str, ...] = ()) -> list[dict]:
    """``n`` image records, each stage around ``BASE_MS`` (+ ``shift``) with 0.5 ms noise; ``drop``: not run."""
    rng = random.Random(seed)
    out = []
    for i in range(n):
        ms = {k: v + (shift or {}).get(k, 0.0) + rng.gauss(0.0, 0.5) for k, v in BASE_MS.items() if k not in drop}
        out.append(_record(f"s{seed}-{i}", ms))
    return out


def _by_stage(group: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {s["stage"]: s for s in group["stages"]}


def test_bootstrap_median_diff_ci_covers_the_shift_and_needs_two_per_side() -> None:
    rng = random.Random(1)
    a = [rng.gauss(10.0, 1.0) for _ in range(40)]
    b = [rng.gauss(13.0, 1.0) for _ in range(30)]
    lo, hi = bootstrap_median_diff_ci(a, b)
    assert 0.0 < lo < 3.0 < hi < 6.0
    assert bootstrap_median_diff_ci(a, b) == (lo, hi), "fixed seed: the same interval every time"
    assert all(math.isnan(v) for v in bootstrap_median_diff_ci([1.0], b))
    assert all(math.isnan(v) for v in bootstrap_median_diff_ci(a, []))


def test_a_stage_10ms_slower_is_ranked_first_with_an_interval_clear_of_zero() -> None:
    result = compare(_draw(1), _draw(2, shift={"mm.resize_normalize": 10.0}))
    assert list(result["groups"]) == [IMAGE] and not result["only_base"] and not result["only_new"]
    g = result["groups"][IMAGE]
    first = g["stages"][0]
    assert first["stage"] == "mm.resize_normalize"
    assert first["delta_p50"] == pytest.approx(0.010, abs=0.001)
    lo, hi = first["ci"]
    assert 0.008 < lo < 0.010 < hi < 0.012 and first["verdict"] == SLOWER
    # tokenize holds the resize, so it moved as much, but it names no cause: it comes after the leaves
    assert [s["stage"] for s in g["stages"] if not s["leaf"]] == ["tokenize"] and g["stages"][-1]["stage"] == "tokenize"
    assert g["stages"][-1]["verdict"] == SLOWER
    assert _by_stage(g)["model.vision_encoder"]["verdict"] == NO_CHANGE
    keys = [(s["verdict"] == NO_CHANGE, -abs(s["delta_p50"])) for s in g["stages"][:-1]]
    assert keys == sorted(keys), "leaves: the changes, then the rest, each by |delta p50|"
    assert g["ttft"]["verdict"] == SLOWER and g["ttft"]["delta_p50"] == pytest.approx(0.010, abs=0.001)
    # the same comparison the other way round: the same stage, faster
    back = compare(_draw(2, shift={"mm.resize_normalize": 10.0}), _draw(1))["groups"][IMAGE]
    assert back["stages"][0]["stage"] == "mm.resize_normalize" and back["stages"][0]["verdict"] == FASTER


def test_a_noisy_stage_with_a_larger_median_difference_ranks_after_a_clear_change() -> None:
    """A bimodal wait (0 or 20 ms, as a polling loop gives) differs by chance in its median; a 2 ms
    shift that every request shows is the finding, so it comes first."""

    def draw(seed: int, shift: float) -> list[dict[str, Any]]:
        rng = random.Random(seed)
        ms = ({**BASE_MS, "scheduler.queue": rng.choice((0.1, 20.0)), "mm.decode": 3.0 + shift} for _ in range(8))
        return [_record(f"n{seed}-{i}", {k: v + rng.gauss(0.0, 0.1) for k, v in m.items()}) for i, m in enumerate(ms)]

    g = compare(draw(20, 0.0), draw(21, 2.0))["groups"][IMAGE]
    queue = _by_stage(g)["scheduler.queue"]
    assert queue["verdict"] == NO_CHANGE and abs(queue["delta_p50"]) > 0.005, queue
    assert g["stages"][0]["stage"] == "mm.decode" and g["stages"][0]["verdict"] == SLOWER
    assert [s["stage"] for s in g["stages"]].index("scheduler.queue") > 0


def test_two_draws_of_one_distribution_are_no_change_everywhere() -> None:
    """Seeds 3 and 4 (fixed): with 24 requests a side, no stage and not TTFT clears zero."""
    g = compare(_draw(3), _draw(4))["groups"][IMAGE]
    assert g["ttft"]["verdict"] == NO_CHANGE
    assert {s["stage"]: s["verdict"] for s in g["stages"]} == dict.fromkeys(BASE_MS, NO_CHANGE)
    assert all(s["ci"][0] <= 0.0 <= s["ci"][1] for s in g["stages"])


def test_a_stage_missing_on_one_side_counts_as_zero() -> None:
    """The preprocess cache skips decoding in BASE: BASE's p50 is 0, the delta is the whole stage."""
    base, new = _draw(5, drop=("mm.decode",)), _draw(6)
    decode = _by_stage(compare(base, new)["groups"][IMAGE])["mm.decode"]
    assert decode["base_p50"] == 0.0 and decode["base_p95"] == 0.0
    assert decode["present"] == {"base": 0, "new": 24}
    assert decode["delta_p50"] == pytest.approx(decode["new_p50"]) and decode["new_p50"] == pytest.approx(
        0.003, abs=5e-4
    )
    assert decode["verdict"] == SLOWER and decode["ci"][0] > 0.002


def test_groups_on_one_side_are_listed_not_compared(tmp_path: Path, capsys) -> None:
    base = _draw(7, n=6) + [_record(f"t{i}", {"tokenize": 2.0}, images=False) for i in range(3)]
    new = _draw(8, n=6) + [{**_record("fail", {"tokenize": 2.0}), "status": "error", "ttft_s": None}]
    result = compare(base, new)
    assert list(result["groups"]) == [IMAGE]
    assert result["only_base"] == ["text"] and result["only_new"] == []
    assert result["failed"] == {"base": {}, "new": {IMAGE: 1}}
    a, b = tmp_path / "a.jsonl", tmp_path / "b.jsonl"
    a.write_text("".join(json.dumps(r) + "\n" for r in base))
    b.write_text("".join(json.dumps(r) + "\n" for r in new))
    assert main(["report", "--compare", str(a), str(b)]) == 0
    out = capsys.readouterr().out
    assert f"== {IMAGE}  (n=6 vs 6; failed 0 vs 1)" in out
    assert "only in BASE (no timed request in NEW): text" in out


def test_a_higher_confidence_widens_every_interval_and_is_printed(tmp_path: Path, capsys) -> None:
    """Seeds 30/130, 8 a side, ``mm.decode`` 0.5 ms slower: at 95% the interval clears zero, at 99.9%
    it spans it. Every interval at 99.9% holds the one at 95%, the medians are the same, and the table,
    the JSON and the page name the level they used."""
    base, new = _draw(30, n=8), _draw(130, n=8, shift={"mm.decode": 0.5})
    at95, at999 = compare(base, new), compare(base, new, confidence=0.999)
    assert (at95["confidence"], at999["confidence"]) == (0.95, 0.999)
    g95, g999 = at95["groups"][IMAGE], at999["groups"][IMAGE]
    assert _by_stage(g95)["mm.decode"]["verdict"] == SLOWER and _by_stage(g999)["mm.decode"]["verdict"] == NO_CHANGE
    for name, wide in _by_stage(g999).items():
        narrow = _by_stage(g95)[name]
        assert wide["delta_p50"] == narrow["delta_p50"], name
        assert wide["ci"][0] <= narrow["ci"][0] and narrow["ci"][1] <= wide["ci"][1], name
        assert wide["ci"][1] - wide["ci"][0] > narrow["ci"][1] - narrow["ci"][0], name

    a, b = _write(tmp_path / "a.jsonl", base), _write(tmp_path / "b.jsonl", new)
    assert main(["report", "--compare", str(a), str(b), "--confidence", "0.999", "--json"]) == 0
    assert json.loads(capsys.readouterr().out) == at999
    assert main(["report", "--compare", str(a), str(b), "--confidence", "0.999"]) == 0
    table = capsys.readouterr().out
    assert "with a 99.9% bootstrap interval" in table and "99.9% CI" in table and "95%" not in table
    assert main(["report", "--compare", str(a), str(b)]) == 0
    assert "with a 95% bootstrap interval" in capsys.readouterr().out, "0.95 when not given"
    page = parse_dom(render_compare_html(base, new, "a", "b", confidence=0.999))
    assert "with 99.9% interval" in page.text_content() and "95%" not in page.text_content()


@pytest.mark.parametrize("value", ["95", "0", "1", "nan", "x"])
def test_confidence_outside_0_1_is_a_usage_error(tmp_path: Path, capsys, value: str) -> None:
    a = _write(tmp_path / "a.jsonl", _draw(15, n=4))
    with pytest.raises(SystemExit) as exit_:
        main(["report", "--compare", str(a), str(a), "--confidence", value])
    assert exit_.value.code == 2 and "--confidence" in capsys.readouterr().err


def test_one_request_a_side_has_no_interval() -> None:
    g = compare(_draw(9, n=1), _draw(10, n=1, shift={"tokenize": 5.0}))["groups"][IMAGE]
    assert g["ttft"]["ci"] is None and g["ttft"]["verdict"] == NO_INTERVAL


def _write(path: Path, records: list[dict[str, Any]]) -> Path:
    path.write_text("".join(json.dumps(r) + "\n" for r in records))
    return path


def test_cli_table_json_and_warmups(tmp_path: Path, capsys) -> None:
    warm = _record("warm", {"tokenize": 5000.0}, warmup=True)
    a = _write(tmp_path / "a.jsonl", [warm, *_draw(11)])
    b = _write(tmp_path / "b.jsonl", _draw(12, shift={"model.vision_encoder": 10.0}))
    assert main(["report", "--compare", str(a), str(b), "--json"]) == 0
    out, err = capsys.readouterr()
    result = json.loads(out)  # plain JSON: no NaN anywhere
    g = result["groups"][IMAGE]
    assert g["n"] == {"base": 24, "new": 24}, "the warm-up is left out"
    assert g["stages"][0]["stage"] == "model.vision_encoder" and g["stages"][0]["verdict"] == SLOWER
    assert err.strip() == f"sglang-mmtrace report: {a}: 1 warm-up record(s) left out (--include-warmup keeps them)"
    assert main(["report", "--compare", str(a), str(b), "--json"]) == 0
    assert capsys.readouterr().out == out, "the same files give the same intervals"

    assert main(["report", "--compare", str(a), str(b), "--include-warmup", "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["groups"][IMAGE]["n"] == {"base": 25, "new": 24}

    assert main(["report", "--compare", str(a), str(b)]) == 0
    table = capsys.readouterr().out
    lines = table.splitlines()
    assert lines[0] == f"BASE = {a}" and lines[1] == f"NEW  = {b}"
    head = lines.index(f"== {IMAGE}  (n=24 vs 24)")
    assert "slower" in lines[head + 1] and lines[head + 1].startswith("   TTFT p50 ")
    ranked = [line.split()[0] for line in lines[head + 5 : head + 5 + len(BASE_MS)]]
    assert ranked[0] == "model.vision_encoder", table
    encoder = lines[head + 5].split()
    assert float(encoder[3]) == pytest.approx(10.0, abs=1.0) and encoder[-1] == "slower"


def test_html_has_both_stacks_and_a_delta_row_per_stage(tmp_path: Path) -> None:
    base, new = _draw(13), _draw(14, shift={"mm.resize_normalize": 10.0})
    label = '<script>alert("x")</script><u>.jsonl'  # a file name is text, never markup
    dom = parse_dom(render_compare_html(base, new, label, "b.jsonl"))
    assert not list(dom.iter("script")) and not list(dom.iter("u")) and label in dom.text_content()
    (section,) = dom.iter("section", "group")
    assert section.attrs["data-group"] == IMAGE
    segs = [(r.attrs["data-side"], r.attrs["data-stage"]) for r in section.iter("rect", "seg")]
    assert {side for side, _ in segs} == {"base", "new"}
    rows = [(r.attrs["data-stage"], r.attrs["data-verdict"]) for r in section.iter("g", "delta-row")]
    ranked = compare(base, new)["groups"][IMAGE]["stages"]
    assert rows == [("TTFT", SLOWER), *((s["stage"], s["verdict"]) for s in ranked)], "the table's ranking"
    assert {s for s, v in rows[1:] if v == SLOWER} == {"mm.resize_normalize", "tokenize"}
    assert len(list(section.iter("path", "ci"))) == len(rows), "one whisker per row"
    first = next(section.iter("g", "delta-row"))
    assert float(first.attrs["data-lo"]) > 0.0


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--compare", "{missing}", "{a}"], "{missing}: No such file or directory"),
        (["--compare", "{a}", "{garbage}"], "{garbage}: no valid records; 1 line skipped (line 1: not JSON"),
        (["--compare", "{a}", "{text}"], "no group in common: BASE has image: encoded; NEW has text"),
        (["--compare", "{a}", "{warm}"], "{warm}: only warm-up records; --include-warmup shows them"),
        (["{a}", "--compare", "{a}", "{a}"], "give either a records file or --compare BASE NEW, not both"),
        ([], "a records file, or --compare BASE NEW, is required"),
        (["--compare", "{a}", "{a}", "--chrome-trace", "{out}"], "--chrome-trace takes one records file"),
        (["{a}", "--confidence", "0.99"], "--confidence is the level of --compare's intervals"),
        (["--compare", "{a}", "{a}", "--html", "{a}/x.html"], "cannot create folder {a}: "),
    ],
)
def test_bad_input_is_one_line_and_exit_1(tmp_path: Path, capsys, args: list[str], message: str) -> None:
    paths = {
        "a": _write(tmp_path / "a.jsonl", _draw(15, n=4)),
        "text": _write(tmp_path / "text.jsonl", [_record("t", {"tokenize": 1.0}, images=False)]),
        "warm": _write(tmp_path / "warm.jsonl", [_record("w", {"tokenize": 1.0}, warmup=True)]),
        "garbage": tmp_path / "garbage.jsonl",
        "missing": tmp_path / "missing.jsonl",
        "out": tmp_path / "trace.json",
    }
    paths["garbage"].write_text("not json\n")
    rc = main(["report", *(a.format(**paths) for a in args)])
    out, err = capsys.readouterr()
    lines = err.strip().splitlines()
    assert rc == 1 and len(lines) == 1, err
    assert lines[0].startswith("sglang-mmtrace report: ") and message.format(**paths) in lines[0]
    assert "Traceback" not in err
