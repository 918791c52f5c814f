"""Pure parts of ``sglang-mmtrace bench`` that need no server: launch strings, the statistics, reading a
records file that is being appended to (a real file with a half-written last line), the plans of the
overhead experiments (strict on/off alternation, the ablation's levels), their analyses on synthetic
samples with known effects, the throughput segments, the client's TTFT event, /proc lookups, and the
CLI's bad input (a dead ``--url``: nothing listens on the port, so no server is started; a bad URL; an
``--out`` that cannot be written): one line on stderr and a non-zero exit, never a traceback."""

from __future__ import annotations

import base64
import contextlib
import itertools
import json
import os
import socket
import uuid
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from sglang_mmtrace.bench import ablation, overhead, procs, throughput
from sglang_mmtrace.bench import experiments as ex
from sglang_mmtrace.bench.client import _dechunk, _first_choices_seen, _sse_events, carries_choices
from sglang_mmtrace.bench.experiments import Options, image_shape
from sglang_mmtrace.bench.records import RecordsTail
from sglang_mmtrace.bench.stats import (
    bootstrap_quantile_ci,
    bootstrap_slope_ci,
    geomean_ratio_ci,
    paired_ratio_ci,
    ratio_of_means_ci,
)
from sglang_mmtrace.bench.switchctl import (
    BETWEEN_MARGIN_S,
    PARTS,
    SwitchError,
    body_for,
    closed_windows,
    echoes,
    levels,
    set_windows,
)
from sglang_mmtrace.bench.targets import parse_launch, server_on_gpu
from sglang_mmtrace.cli import bench as bench_cli
from sglang_mmtrace.cli.bench import parse_size
from sglang_mmtrace.harness import chat_request
from sglang_mmtrace.report.analysis import quantile
from sglang_mmtrace.windows import Schedule


def test_parse_launch_env_words_then_args() -> None:
    cfg = parse_launch("SGLANG_VLM_CACHE_SIZE_MB=0 A=b --mm-preprocess-cache-size-mb 64 --disable-radix-cache")
    assert cfg.env == {"SGLANG_VLM_CACHE_SIZE_MB": "0", "A": "b"}
    assert cfg.args == ("--mm-preprocess-cache-size-mb", "64", "--disable-radix-cache")
    assert cfg.label.startswith("SGLANG_VLM_CACHE_SIZE_MB=0")
    # a KEY=VALUE after the first flag is an argument value, not environment
    assert parse_launch("--x K=V").env == {} and parse_launch("--x K=V").args == ("--x", "K=V")
    assert parse_launch("").label == "default"


def test_parse_size() -> None:
    assert parse_size("512") == (512, 512) and parse_size("640x480") == (640, 480)


def test_bootstrap_interval_brackets_the_estimate_and_narrows_with_n() -> None:
    rng = np.random.default_rng(1)
    small, big = rng.lognormal(size=20), rng.lognormal(size=2000)
    for q in (0.5, 0.95):
        lo, hi = bootstrap_quantile_ci(small, q)
        assert lo <= quantile(small, q) <= hi
    w_small = np.subtract(*bootstrap_quantile_ci(small, 0.5)[::-1])
    w_big = np.subtract(*bootstrap_quantile_ci(big, 0.5)[::-1])
    assert 0 < w_big < w_small
    assert all(np.isnan(bootstrap_quantile_ci([], 0.5)))


def test_paired_ratio() -> None:
    off = np.linspace(10, 20, 31)
    ratio, lo, hi = paired_ratio_ci(off, off * 1.1)
    assert abs(ratio - 1.1) < 1e-9 and lo <= 1.1 <= hi
    assert all(np.isnan(paired_ratio_ci([1.0], [1.0, 2.0])))


def test_records_tail_starts_at_the_end_and_skips_a_partial_line(tmp_path: Path) -> None:
    path = tmp_path / "records.jsonl"
    path.write_text(json.dumps({"rid": "old"}) + "\n")
    tail = RecordsTail(path)
    with path.open("a") as fh:
        fh.write(json.dumps({"rid": "a", "ttft_s": 1.0}) + "\n" + '{"rid": "b", "tt')
    assert tail.wait(["a", "old"], timeout=0) == {"a": {"rid": "a", "ttft_s": 1.0}}
    with path.open("a") as fh:
        fh.write('ft_s": 2.0}\n')
    assert tail.wait(["b"], timeout=0)["b"]["ttft_s"] == 2.0
    # a response id with the OpenAI prefix finds the bare rid
    assert tail.find("chatcmpl-a") is not None
    # a second record for a rid is counted (the tests fail on it: one record per request)
    with path.open("a") as fh:
        fh.write(json.dumps({"rid": "a", "ttft_s": 3.0}) + "\n")
    tail.poll()
    assert (tail.seen["a"], tail.seen["b"]) == (2, 1)


def test_chat_request_is_greedy_and_streams_usage() -> None:
    msgs = [{"role": "user", "content": "hi"}]
    body = chat_request(msgs, 4, rid="r1", ignore_eos=True)
    assert body == {
        "model": "default",
        "messages": msgs,
        "max_tokens": 4,
        "temperature": 0,
        "stream": True,
        "stream_options": {"include_usage": True},
        "rid": "r1",
        "ignore_eos": True,
    }
    assert "stream_options" not in chat_request(msgs, stream=False) and "rid" not in chat_request(msgs)


# -- the switch experiments: plans, statistics, throughput segments ---------------------------------

SPEC_PARTS = (
    "http", "tokenizer", "mm", "scheduler", "detokenizer", "cuda_events", "ship", "records",
    "jsonl", "prometheus", "otlp", "nvtx",
)  # fmt: skip


def _text(messages: Any) -> str:
    """A planned request's messages as JSON (made now when they were planned as a maker)."""
    return json.dumps(messages() if callable(messages) else messages)


def test_parts_and_levels_follow_the_stack_order() -> None:
    assert PARTS == SPEC_PARTS
    lv = levels()
    assert len(lv) == 13 and lv[0] is None and lv[-1] == PARTS
    for i in range(1, 13):
        assert lv[i] == PARTS[:i]
    assert body_for(None) == {"on": False}
    assert body_for(("http", "tokenizer")) == {"on": True, "parts": ["http", "tokenizer"]}


def test_a_grouped_level_out_of_stack_order_is_echoed() -> None:
    """``--ablation-groups "http+ship,mm"``: the server answers the parts in stack order (http, mm,
    ship); that is the level asked for (an H200 run stopped on the order before this check)."""
    level = levels(("http+ship", "mm"))[2]
    assert level == ("http", "ship", "mm")
    assert echoes({"on": True, "parts": ["http", "mm", "ship"]}, level)
    assert not echoes({"on": True, "parts": ["http", "mm"]}, level)
    assert not echoes({"on": True, "parts": ["http", "mm", "ship", "ship"]}, level)
    assert not echoes({"on": False, "parts": ["http", "mm", "ship"]}, level)
    assert echoes({"on": False}, None) and not echoes({"on": True, "parts": list(PARTS)}, None)


def test_options_defaults_per_experiment() -> None:
    o = Options()
    assert (o.n_for("overhead"), o.n_for("ablation"), o.n_for("new-vs-repeat")) == (400, 60, 20)
    assert o.n_for("overhead", gpu=False) == 100 and o.n_for("ablation", gpu=False) == 60
    assert o.control is True  # the overhead experiment's A/A runs unless asked not to
    assert o.size_for("overhead") == (640, 480) and o.size_for("order") == (512, 512)
    assert o.max_tokens_for("throughput") == 256 and o.max_tokens_for("overhead") == 8
    assert o.throughput_clients() == 64
    o = Options(n=4, size=(64, 64), max_tokens=16, concurrency=(1, 8))
    assert o.n_for("overhead") == 4 and o.size_for("overhead") == (64, 64) and o.max_tokens_for("throughput") == 16
    assert o.throughput_clients() == 8 and o.concurrency_levels() == (1, 8)


def test_paired_plan_alternates_the_leading_arm_strictly() -> None:
    wl = overhead.Workload(seed=3, nonce="n", size=(32, 24))
    plan = overhead.paired_plan("overhead", rounds=4, warmup_rounds=2, workload=wl)
    assert len(plan) == 6 * 6
    warm = [p for p in plan if p.warmup]
    assert len(warm) == 12 and all(p.round < 0 for p in warm)
    timed = [p for p in plan if not p.warmup]
    for r in range(4):
        rnd = [p for p in timed if p.round == r]
        assert [p.extra["kind"] for p in rnd] == [k for k in overhead.KINDS for _ in range(2)]
        lead = "on" if r % 2 == 0 else "off"
        assert [p.extra["arm"] for p in rnd[::2]] == [lead] * 3  # every kind starts with the round's leading arm
        assert Counter(p.extra["arm"] for p in rnd) == {"on": 3, "off": 3}
        assert all(p.extra["expect_record"] == (p.extra["arm"] == "on") for p in rnd)
        assert [p.extra["order"] for p in rnd] == [0, 1] * 3
    new = [_text(p.messages) for p in plan if p.extra["kind"] == "new_image"]
    text = [_text(p.messages) for p in plan if p.extra["kind"] == "text"]
    same = {_text(p.messages) for p in plan if p.extra["kind"] == "same_image"}
    assert len(set(new)) == len(new) and len(set(text)) == len(text) and len(same) == 1
    assert "data:image/jpeg;base64," in new[0]
    # the extra dict can override what a request expects (A/A control: no record anywhere)
    aa = overhead.paired_plan("overhead-crossover", 1, 0, wl, {"expect_record": False, "launch": 3})
    assert all(p.extra["expect_record"] is False and p.extra["launch"] == 3 for p in aa)


def test_control_arm_rotates_so_each_pair_leads_equally_often() -> None:
    wl = overhead.Workload(seed=3, nonce="n", size=(32, 24))
    plan = overhead.paired_plan("overhead", rounds=6, warmup_rounds=0, workload=wl, control=True)
    assert len(plan) == 6 * 3 * 3
    order = {}
    for r in range(6):
        rnd = [p for p in plan if p.round == r and p.extra["kind"] == "text"]
        arms = [p.extra["arm"] for p in rnd]
        assert sorted(arms) == ["ctl", "off", "on"] and [p.extra["order"] for p in rnd] == [0, 1, 2]
        assert all(p.extra["expect_record"] == (p.extra["arm"] == "on") for p in rnd)
        order[r] = arms
    for a, b in (("off", "on"), ("off", "ctl")):
        assert sum(order[r].index(a) < order[r].index(b) for r in range(6)) == 3, (a, b)
    for arm in ("on", "off", "ctl"):  # every arm at every position twice
        assert Counter(order[r].index(arm) for r in range(6)) == {0: 2, 1: 2, 2: 2}
    texts = [_text(p.messages) for p in plan if p.extra["kind"] == "text"]
    assert len(set(texts)) == len(texts)  # the control's prompts are new to the server too


def _same_instance_lines(
    rounds: int,
    cost_us: dict[str, float],
    arms: tuple[str, ...],
    peer_cost_us: dict[str, float] | None = None,
    between_cost_us: dict[str, float] | None = None,
) -> list[dict[str, Any]]:
    """Synthetic same-instance rounds: per round one base TTFT (drift shared by the round's arms,
    which pairing cancels), 'on' that plus the kind's cost, 'sglang' (the peer arm) plus the kind's
    ``peer_cost_us``, 'between' (between tracing windows) plus ``between_cost_us``, 'ctl' the base
    again (a true A/A of 0); every arm adds the same small independent noise."""
    extra = {"on": cost_us, overhead.PEER: peer_cost_us or {}, overhead.BETWEEN: between_cost_us or {}}
    rng = np.random.default_rng(1)
    lines = []
    for r in range(rounds):
        for kind in overhead.KINDS:
            base = {"new_image": 0.030, "same_image": 0.025, "text": 0.015}[kind] * rng.lognormal(0, 0.1)
            for arm in arms:
                t = base + extra.get(arm, {}).get(kind, 0.0) * 1e-6 + rng.normal(0, 5e-6)
                ln = _line(kind, arm, r, t)
                order = overhead.arm_order(r, "ctl" in arms, overhead.PEER in arms, overhead.BETWEEN in arms)
                ln["bench"]["order"] = order.index(arm)
                lines.append(ln)
    return lines


def test_summary_gives_the_delta_and_the_aa_of_the_same_rounds_in_us() -> None:
    cost = {"new_image": 250.0, "same_image": 100.0, "text": 60.0}  # new_image over its 200 us target
    lines = _same_instance_lines(400, cost, ("off", "on", "ctl"))
    res = overhead.summary(lines)
    assert res["aa"] is True
    assert res["records"] == {"on_ok": 1200, "on_with_record": 1200, "off_ok": 2400, "off_with_record": 0}
    for kind, want in cost.items():
        s = res["kinds"][kind]
        assert s["n_rounds"] == 400
        assert abs(s["delta_us"] - want) < 1.5 and s["delta_ci_us"][0] <= want <= s["delta_ci_us"][1]
        assert s["delta_ci_us"][1] - s["delta_ci_us"][0] < 5  # pairing took the 10% drift out
        assert abs(s["aa_us"]) < 1.5 and s["aa_ci_us"][0] <= 0 <= s["aa_ci_us"][1] and s["aa_ci_contains_zero"]
        off = s["off_median_us"]
        assert abs(s["on_median_us"] - off - want) < 0.1 * off  # the unpaired medians: drift and all
        assert abs(s["delta_share_of_off"] - s["delta_us"] / off) < 1e-5
        assert abs(s["aa_share_of_off"] - s["aa_us"] / off) < 1e-5
        assert s["delta_share_ci"][0] <= s["delta_share_of_off"] <= s["delta_share_ci"][1]
        assert s["target"]["delta_max_us"] == overhead.TARGET_DELTA_US[kind] and s["target"]["min_rounds"] == 400
    verdicts = {k: (v["target"]["met"], v["target"]["not_judged"]) for k, v in res["kinds"].items()}
    assert verdicts == {"new_image": (False, None), "same_image": (True, None), "text": (True, None)}
    # the JSON output carries the same numbers under these keys
    assert set(json.loads(json.dumps(res))["kinds"]["text"]) == {
        "n_rounds", "off_median_us", "on_median_us", "delta_us", "delta_ci_us", "delta_share_of_off",
        "delta_share_ci", "aa_us", "aa_ci_us", "aa_share_of_off", "aa_share_ci", "aa_ci_contains_zero", "target",
    }  # fmt: skip


def _zero_aa(lines: list[dict]) -> None:
    """Give every ``ctl`` request its round's ``off`` TTFT: an A/A of exactly 0."""
    off = {
        (ln["bench"]["kind"], ln["bench"]["round"]): ln["bench"]["client_ttft_s"]
        for ln in lines
        if ln["bench"]["arm"] == "off"
    }
    for ln in lines:
        if ln["bench"]["arm"] == "ctl":
            ln["bench"]["client_ttft_s"] = off[(ln["bench"]["kind"], ln["bench"]["round"])]


def test_summary_judges_the_target_only_with_a_zero_aa_and_enough_rounds() -> None:
    cost = {"new_image": 50.0, "same_image": 50.0, "text": 50.0}
    lines = _same_instance_lines(60, cost, ("off", "on", "ctl"))
    _zero_aa(lines)  # so that only the run's length stands in the way
    few = overhead.summary(lines)["kinds"]["text"]
    assert few["aa_us"] == 0 and few["aa_ci_us"] == [0, 0] and few["aa_ci_contains_zero"]
    assert few["target"] == {"delta_max_us": 80.0, "min_rounds": 400, "met": None, "not_judged": "60 rounds < 400"}
    no_aa = overhead.summary(_same_instance_lines(60, cost, ("off", "on")))
    assert no_aa["aa"] is False and "aa_us" not in no_aa["kinds"]["text"]
    assert no_aa["kinds"]["text"]["target"]["not_judged"] == "no A/A"
    shifted = _same_instance_lines(400, cost, ("off", "on", "ctl"))
    for ln in shifted:  # an A/A arm that runs slower: the method is not under control
        if ln["bench"]["arm"] == "ctl":
            ln["bench"]["client_ttft_s"] += 30e-6
    s = overhead.summary(shifted)["kinds"]["text"]
    assert not s["aa_ci_contains_zero"] and s["target"]["met"] is None
    assert s["target"]["not_judged"] == "the A/A's interval excludes 0"
    # the delta and the A/A come from the same rounds: a round without its A/A arm drops out of both
    lines = _same_instance_lines(10, cost, ("off", "on", "ctl"))
    lines = [ln for ln in lines if not (ln["bench"]["arm"] == "ctl" and ln["bench"]["round"] == 3)]
    assert overhead.summary(lines)["kinds"]["text"]["n_rounds"] == 9


def test_overhead_notes_are_a_table_with_a_verdict_per_kind() -> None:
    cost = {"new_image": 250.0, "same_image": 100.0, "text": 60.0}
    res = overhead.summary(_same_instance_lines(400, cost, ("off", "on", "ctl")))
    text = overhead.notes(res, "overhead on 't'")
    assert text[0].startswith("== overhead on 't': TTFT paired delta, median over rounds in us")
    assert "delta on - off" in text[1] and "A/A off again - off" in text[1]
    rows = {ln.split()[0]: ln.split() for ln in text[2:5]}
    assert set(rows) == set(overhead.KINDS)
    for kind, want in cost.items():
        s = res["kinds"][kind]
        row = rows[kind]
        assert row[1] == "400" and row[2] == f"{s['off_median_us'] / 1000:.2f}" and row[-1] == "yes"
        assert row[4] == f"{s['delta_us']:+.0f}" and abs(int(row[4]) - want) <= 2
    assert text[5] == (
        "   target: delta <= 200/150/80 us (new_image/same_image/text), >= 400 rounds, the A/A's interval holding 0"
    )
    d = {k: f"{res['kinds'][k]['delta_us']:+.0f}" for k in overhead.KINDS}
    assert text[6:9] == [
        f"   verdict new_image   {d['new_image']} us > 200 us: not met",
        f"   verdict same_image  {d['same_image']} us <= 150 us: met",
        f"   verdict text        {d['text']} us <= 80 us: met",
    ]
    assert text[9] == "   records: 1200/1200 'on' requests, 0/2400 'off' requests"
    no_aa = overhead.notes(overhead.summary(_same_instance_lines(20, cost, ("off", "on"))), "t")
    assert "A/A" not in no_aa[1] and "no A/A in these rounds: the delta's own noise is unknown" in no_aa[5]
    assert no_aa[7] == "   verdict new_image   not judged (no A/A)"


def test_four_arms_rotate_so_each_holds_each_position_and_each_pair_leads_equally() -> None:
    wl = overhead.Workload(seed=3, nonce="n", size=(32, 24))
    plan = overhead.paired_plan("overhead", rounds=8, warmup_rounds=0, workload=wl, control=True, peer=True)
    assert len(plan) == 8 * 3 * 4
    order = {}
    for r in range(8):
        rnd = [p for p in plan if p.round == r and p.extra["kind"] == "same_image"]
        order[r] = [p.extra["arm"] for p in rnd]
        assert sorted(order[r]) == sorted(["on", "off", "ctl", "sglang"])
        assert all(p.extra["expect_record"] == (p.extra["arm"] == "on") for p in rnd)
    for arm in order[0]:
        assert Counter(order[r].index(arm) for r in range(8)) == {0: 2, 1: 2, 2: 2, 3: 2}, arm
    for a, b in itertools.combinations(order[0], 2):
        assert sum(order[r].index(a) < order[r].index(b) for r in range(8)) == 4, (a, b)
    # the peer without the A/A: three arms, rotating like on/off/ctl
    assert [overhead.arm_order(r, peer=True) for r in range(2)] == [("on", "off", "sglang"), ("off", "on", "sglang")]


@pytest.mark.parametrize(
    ("control", "peer", "arms"),
    [(True, False, ("on", "off", "ctl", "between")), (True, True, ("on", "off", "ctl", "sglang", "between"))],
)
def test_the_between_windows_arm_rotates_with_the_others(control: bool, peer: bool, arms: tuple[str, ...]) -> None:
    """n arms, with the between-windows arm last: over 2n rounds each arm holds each position twice and
    each pair's arms lead equally often (n times each)."""
    n = len(arms)
    wl = overhead.Workload(seed=3, nonce="n", size=(32, 24))
    plan = overhead.paired_plan("overhead", 2 * n, 0, wl, control=control, peer=peer, between=True)
    assert len(plan) == 2 * n * 3 * n
    order = {}
    for r in range(2 * n):
        rnd = [p for p in plan if p.round == r and p.extra["kind"] == "text"]
        order[r] = [p.extra["arm"] for p in rnd]
        assert sorted(order[r]) == sorted(arms) and [p.extra["order"] for p in rnd] == list(range(n))
        assert all(p.extra["expect_record"] == (p.extra["arm"] == "on") for p in rnd)
    assert tuple(order[0]) == arms and tuple(order[n]) == arms[::-1]  # forward, then reversed blocks
    assert tuple(order[1]) == (*arms[1:], arms[0])
    for arm in arms:
        assert Counter(order[r].index(arm) for r in range(2 * n)) == dict.fromkeys(range(n), 2), arm
    for a, b in itertools.combinations(arms, 2):
        assert sum(order[r].index(a) < order[r].index(b) for r in range(2 * n)) == n, (a, b)
    between = [p for p in plan if p.extra["arm"] == "between"]
    assert {p.variant for p in between} == {f"{k}: plugin between tracing windows" for k in overhead.KINDS}
    assert {p.variant_index for p in between} == {overhead.ALL_ARMS.index("between")} == {4}
    # without the A/A: three arms, rotating like on/off/ctl
    assert [overhead.arm_order(r, between=True) for r in range(3)] == [
        ("on", "off", "between"),
        ("off", "on", "between"),
        ("off", "between", "on"),
    ]


def _between_as_aa(lines: list[dict]) -> list[dict]:
    """Give every 'between' request of a kind the between-windows arm costs nothing for (``text``,
    ``new_image`` here) its round's ``ctl`` TTFT: between - off then equals the A/A exactly, so it lies
    in the A/A's interval whatever the noise drew (a free arm's estimate falls outside now and then)."""
    ctl = {
        (ln["bench"]["kind"], ln["bench"]["round"]): ln["bench"]["client_ttft_s"]
        for ln in lines
        if ln["bench"]["arm"] == "ctl"
    }
    for ln in lines:
        if ln["bench"]["arm"] == "between" and ln["bench"]["kind"] != "same_image":
            ln["bench"]["client_ttft_s"] = ctl[(ln["bench"]["kind"], ln["bench"]["round"])]
    return lines


def test_between_windows_arm_gives_its_cost_and_whether_it_lies_within_the_aa() -> None:
    cost = {"new_image": 300.0, "same_image": 200.0, "text": 60.0}
    between = {"new_image": 0.0, "same_image": 40.0, "text": 0.0}  # same_image: a cost the A/A can tell
    res = overhead.summary(
        _between_as_aa(_same_instance_lines(400, cost, ("off", "on", "ctl", "between"), None, between))
    )
    assert res["aa"] is True and res["between"] is True and res["peer"] is False
    # the between-windows requests count as 'off' in the record check: none may have a record
    assert res["records"] == {"on_ok": 1200, "on_with_record": 1200, "off_ok": 3600, "off_with_record": 0}
    for kind, want in between.items():
        s = res["kinds"][kind]
        assert s["n_rounds"] == 400 and abs(s["delta_us"] - cost[kind]) < 1.5
        assert abs(s["between_us"] - want) < 1.5 and s["between_ci_us"][0] <= want <= s["between_ci_us"][1]
        assert abs(s["between_share_of_off"] - s["between_us"] / s["off_median_us"]) < 1e-5
        assert s["between_share_ci"][0] <= s["between_share_of_off"] <= s["between_share_ci"][1]
        assert s["aa_ci_contains_zero"]
    verdicts = {k: v["between_within_aa"] for k, v in res["kinds"].items()}
    assert verdicts == {"new_image": True, "same_image": False, "text": True}
    assert set(json.loads(json.dumps(res))["kinds"]["text"]) >= {
        "between_us", "between_ci_us", "between_share_of_off", "between_share_ci", "between_within_aa",
    }  # fmt: skip
    # the definition, on hand-made figures: the point estimate inside the A/A's interval, which holds 0
    s = {"aa_us": 1.0, "aa_ci_us": [-5.0, 7.0], "aa_ci_contains_zero": True, "between_us": 7.0}
    assert overhead.between_verdict(s) is True
    assert overhead.between_verdict({**s, "between_us": 7.1}) is False
    assert overhead.between_verdict({**s, "between_us": -5.1}) is False
    off_zero = {**s, "aa_ci_us": [2.0, 9.0], "aa_ci_contains_zero": False, "between_us": 5.0}
    assert overhead.between_verdict(off_zero) is False  # inside, but the A/A itself is off 0
    assert overhead.between_verdict({"between_us": 0.0}) is None  # no A/A
    no_aa = overhead.summary(_same_instance_lines(50, cost, ("off", "on", "between"), None, between))
    assert no_aa["kinds"]["text"]["between_within_aa"] is None and "aa_us" not in no_aa["kinds"]["text"]


def test_overhead_notes_with_the_between_windows_arm_add_its_column_and_verdicts() -> None:
    cost = {"new_image": 300.0, "same_image": 200.0, "text": 60.0}
    between = {"new_image": 0.0, "same_image": 40.0, "text": 0.0}
    res = overhead.summary(
        _between_as_aa(_same_instance_lines(400, cost, ("off", "on", "ctl", "between"), None, between))
    )
    text = overhead.notes(res, "t")
    assert "A/A off again - off" in text[1] and text[1].endswith("between windows - off")
    for row in text[2:5]:
        s = res["kinds"][row.split()[0]]
        lo, hi = s["between_ci_us"]
        share = 100 * s["between_share_of_off"]
        assert row.endswith(f"{s['between_us']:+.0f} [{lo:+.0f}, {hi:+.0f}] ({share:+.2f}%)")
    i = text.index(
        "   between windows within the A/A's interval: its point estimate inside the A/A's 95% CI, "
        "the A/A's interval holding 0"
    )
    assert text[i + 1 : i + 5] == [
        "   verdict new_image   between windows within the A/A's interval: yes",
        "   verdict same_image  between windows within the A/A's interval: no",
        "   verdict text        between windows within the A/A's interval: yes",
        "   records: 1200/1200 'on' requests, 0/3600 'off' requests",
    ]
    shifted = _same_instance_lines(400, cost, ("off", "on", "ctl", "between"), None, between)
    for ln in shifted:  # an A/A arm that runs slower: no verdict of 'within' it can hold
        if ln["bench"]["arm"] == "ctl":
            ln["bench"]["client_ttft_s"] += 30e-6
    text = overhead.notes(overhead.summary(shifted), "t")
    assert (
        "   verdict text        between windows within the A/A's interval: no (the A/A's interval excludes 0)" in text
    )
    no_aa = overhead.notes(overhead.summary(_same_instance_lines(20, cost, ("off", "on", "between"))), "t")
    assert "   verdict text        between windows within the A/A's interval: not judged (no A/A)" in no_aa


def test_closed_windows_keep_the_clock_between_windows() -> None:
    """The windows chosen for a between-windows request leave the given instant, and the minute after
    it, outside every window; near a window edge of each period the choice waits (the clock and the
    sleep are injected)."""
    hour = 1_800_000_000.0  # a multiple of 3600 s: a 1 h window opens here
    slept: list[float] = []

    def at(t: float) -> str:
        now = [t]

        def sleep(s: float) -> None:
            slept.append(s)
            now[0] += s

        spec = closed_windows(lambda: now[0], sleep)
        sched = Schedule.parse(spec)
        assert not sched.is_open(now[0]) and sched.next_open(now[0]) - now[0] > BETWEEN_MARGIN_S, (t, spec)
        return spec

    assert at(hour + 1800) == "0.5s/1h"
    assert at(hour + 0.6) == "0.5s/1h"  # just after the window closed
    assert at(hour + 0.2) == "0.5s/59m"  # in the hour's window (hour % 3540 = 2040 s)
    assert at(hour - 30) == "0.5s/59m"  # the hour's window opens within the margin
    assert at(hour + 3540 * 1 - 2040 - 10) == "0.5s/1h"  # near a 59 min edge, far from the hour's
    assert slept == []
    # 30 s before a window edge of all three periods at once: wait until the hour's window has closed
    assert at(1_804_762_770.0) == "0.5s/1h" and slept == [1.0] * 31


def test_peer_arm_gives_sglang_tracing_cost_and_the_plugins_share_of_it() -> None:
    cost = {"new_image": 300.0, "same_image": 200.0, "text": 60.0}
    peer = {"new_image": 1000.0, "same_image": 300.0, "text": 240.0}  # ratios 0.3, 0.67, 0.25
    res = overhead.summary(_same_instance_lines(400, cost, ("off", "on", "ctl", "sglang"), peer))
    assert res["aa"] is True and res["peer"] is True
    assert res["records"] == {"on_ok": 1200, "on_with_record": 1200, "off_ok": 3600, "off_with_record": 0}
    for kind in overhead.KINDS:
        s = res["kinds"][kind]
        want = cost[kind] / peer[kind]
        assert abs(s["delta_us"] - cost[kind]) < 1.5 and abs(s["peer_us"] - peer[kind]) < 1.5
        assert s["peer_ci_us"][0] <= peer[kind] <= s["peer_ci_us"][1]
        assert abs(s["peer_share_of_off"] - s["peer_us"] / s["off_median_us"]) < 1e-5
        assert abs(s["plugin_over_peer"] - want) < 0.01
        lo, hi = s["plugin_over_peer_ci"]
        assert lo <= s["plugin_over_peer"] <= hi and hi - lo < 0.05
        assert s["peer_target"]["ratio_max"] == overhead.TARGET_PEER_RATIO == 0.5
    verdicts = {k: (v["peer_target"]["met"], v["peer_target"]["not_judged"]) for k, v in res["kinds"].items()}
    assert verdicts == {"new_image": (True, None), "same_image": (False, None), "text": (True, None)}
    assert set(json.loads(json.dumps(res))["kinds"]["text"]) == {
        "n_rounds", "off_median_us", "on_median_us", "delta_us", "delta_ci_us", "delta_share_of_off",
        "delta_share_ci", "aa_us", "aa_ci_us", "aa_share_of_off", "aa_share_ci", "aa_ci_contains_zero", "target",
        "peer_us", "peer_ci_us", "peer_share_of_off", "peer_share_ci", "plugin_over_peer", "plugin_over_peer_ci",
        "peer_target",
    }  # fmt: skip
    # SGLang's tracing costing nothing measurable: no ratio is judged; nor without the A/A, or in a short run
    free = overhead.summary(_same_instance_lines(400, cost, ("off", "on", "ctl", "sglang"), {}))["kinds"]["text"]
    assert free["peer_ci_us"][0] <= 0 <= free["peer_ci_us"][1] and free["peer_target"]["met"] is None
    assert free["peer_target"]["not_judged"] == "SGLang's tracing cost is not resolved (its interval reaches 0)"
    no_aa = overhead.summary(_same_instance_lines(400, cost, ("off", "on", "sglang"), peer))["kinds"]["text"]
    assert "aa_us" not in no_aa and no_aa["peer_target"]["not_judged"] == "no A/A"
    assert abs(no_aa["plugin_over_peer"] - 0.25) < 0.01
    lines = _same_instance_lines(50, cost, ("off", "on", "ctl", "sglang"), peer)
    _zero_aa(lines)  # so that only the run's length stands in the way
    assert overhead.summary(lines)["kinds"]["text"]["peer_target"]["not_judged"] == "50 rounds < 400"
    # a round without its peer arm drops out of every figure
    lines = _same_instance_lines(10, cost, ("off", "on", "ctl", "sglang"), peer)
    lines = [ln for ln in lines if not (ln["bench"]["arm"] == "sglang" and ln["bench"]["round"] == 3)]
    assert overhead.summary(lines)["kinds"]["text"]["n_rounds"] == 9


def test_overhead_notes_with_the_peer_arm_add_its_columns_and_verdicts() -> None:
    cost = {"new_image": 300.0, "same_image": 200.0, "text": 60.0}
    peer = {"new_image": 1000.0, "same_image": 300.0, "text": 240.0}
    res = overhead.summary(_same_instance_lines(400, cost, ("off", "on", "ctl", "sglang"), peer))
    text = overhead.notes(res, "t")
    assert "SGLang tracing L3 - off" in text[1] and text[1].rstrip().endswith("plugin / SGLang")
    for row in text[2:5]:
        kind = row.split()[0]
        s = res["kinds"][kind]
        lo, hi = s["plugin_over_peer_ci"]
        assert row.endswith(f"{s['plugin_over_peer']:.2f} [{lo:.2f}, {hi:.2f}]")
        assert f"{s['peer_us']:+.0f} [{s['peer_ci_us'][0]:+.0f}, {s['peer_ci_us'][1]:+.0f}]" in row
    i = text.index("   target: plugin delta / SGLang tracing's (level 3) <= 0.50, same rounds, SGLang's cost resolved")
    r = {k: f"{res['kinds'][k]['plugin_over_peer']:.2f}" for k in overhead.KINDS}
    assert text[i + 1 : i + 4] == [
        f"   verdict new_image   plugin / SGLang {r['new_image']} <= 0.50: met",
        f"   verdict same_image  plugin / SGLang {r['same_image']} > 0.50: not met",
        f"   verdict text        plugin / SGLang {r['text']} <= 0.50: met",
    ]
    assert text[-1] == "   records: 1200/1200 'on' requests, 0/3600 'off' requests"


def test_ablation_plan_covers_every_level_once_per_round_in_a_seeded_order() -> None:
    wl = overhead.Workload(seed=1, nonce="n", size=(16, 16))
    plan = ablation.ablation_plan(rounds=3, warmup_rounds=1, workload=wl, seed=5)
    assert len(plan) == 4 * 3 * 13
    orders = []
    for r in range(3):
        rnd = [p for p in plan if p.round == r]
        assert Counter((p.extra["kind"], p.extra["level"]) for p in rnd) == {
            (k, i): 1 for k in overhead.KINDS for i in range(13)
        }
        orders.append([(p.extra["kind"], p.extra["level"]) for p in rnd])
        for p in rnd:
            lv = levels()[p.extra["level"]]
            assert p.extra["parts"] == (list(lv) if lv else None)
            assert p.extra["arm"] == ("off" if p.extra["level"] == 0 else "on")
            assert p.extra["expect_record"] == (p.extra["level"] >= PARTS.index("jsonl") + 1)
    assert orders[0] != orders[1]  # shuffled per round
    again = ablation.ablation_plan(rounds=3, warmup_rounds=1, workload=wl, seed=5)
    assert [(p.extra["kind"], p.extra["level"], p.round) for p in again] == [
        (p.extra["kind"], p.extra["level"], p.round) for p in plan
    ]


def _line(kind: str, arm: str, rnd: int, ttft: float, **extra: Any) -> dict[str, Any]:
    return {
        "rid": None,
        "bench": {"kind": kind, "arm": arm, "round": rnd, "ok": True, "client_ttft_s": ttft, "client_e2e_s": ttft * 2,
                  "order": 0 if arm == "on" else 1, "record": arm == "on", "usage": None, **extra},
    }  # fmt: skip


def test_ratio_summary_ratio_and_delta() -> None:
    rng = np.random.default_rng(0)
    lines = []
    for r in range(200):
        base = 0.04 * rng.lognormal(0, 0.1)  # shared drift per round: pairing cancels it
        lines += [_line("text", "off", r, base), _line("text", "on", r, base * 1.002)]
    s = overhead.ratio_summary(lines, "text")
    assert s["n_pairs"] == 200
    assert abs(s["ttft_ratio_on_off"] - 1.002) < 1e-3
    lo, hi = s["ttft_ratio_ci95"]
    assert lo <= s["ttft_ratio_on_off"] <= hi
    assert s["ttft_paired_delta_median_ms"] > 0
    dlo, dhi = s["ttft_paired_delta_ci95_ms"]
    assert dlo <= s["ttft_paired_delta_median_ms"] <= dhi
    # a round missing one arm is not a pair; a failed request is not a sample
    broken = [_line("text", "off", 0, 0.04), _line("text", "on", 1, 0.04)]
    broken[0]["bench"]["ok"] = False
    assert overhead.ratio_summary(broken, "text") == {"n_pairs": 0}
    assert overhead.record_check(lines) == {"on_ok": 200, "on_with_record": 200, "off_ok": 200, "off_with_record": 0}


def test_crossover_geomean_cancels_a_server_position_effect() -> None:
    """A server started first is 10% slower; the plugin costs 2%. Each orientation is biased, their
    geometric mean is not."""
    lines = []
    for launch, orientation in enumerate(("on-first", "off-first", "on-first", "off-first")):
        for r in range(30):
            base = 0.04 * (1 + 0.01 * np.sin(r))
            on = base * 1.02 * (1.1 if orientation == "on-first" else 1.0)
            off = base * (1.1 if orientation == "off-first" else 1.0)
            extra = {"run": "ab", "launch": launch, "orientation": orientation}
            lines += [_line("new_image", "off", r, off, **extra), _line("new_image", "on", r, on, **extra)]
    res = overhead.crossover_summary(lines)["ab"]
    assert abs(res["orientations"]["on-first"]["new_image"]["ttft_ratio_on_off"] - 1.122) < 1e-3
    assert abs(res["orientations"]["off-first"]["new_image"]["ttft_ratio_on_off"] - 1.02 / 1.1) < 1e-3
    g = res["geomean"]["new_image"]
    assert abs(g["ttft_ratio_on_off"] - 1.02) < 1e-3 and g["orientations"] == 2
    assert g["ttft_ratio_ci95"][0] <= 1.02 <= g["ttft_ratio_ci95"][1]
    assert set(res["launches"]) == {"0", "1", "2", "3"}
    assert res["orientations"]["on-first"]["new_image"]["n_pairs"] == 60  # pooled over the two launches


def test_geomean_and_ratio_of_means_intervals() -> None:
    a = np.linspace(1, 2, 50)
    g, lo, hi = geomean_ratio_ci([(a, a * 1.2), (a, a * 0.8)])
    assert abs(g - np.sqrt(1.2 * 0.8)) < 1e-9 and lo <= g <= hi
    assert all(np.isnan(geomean_ratio_ci([])))
    r, lo, hi = ratio_of_means_ci([100, 110, 90], [99, 108, 89])
    assert abs(r - 296 / 300) < 1e-12 and lo < r < hi
    assert np.isnan(ratio_of_means_ci([1.0], [2.0])[1])


def test_ablation_summary_recovers_each_parts_cost() -> None:
    cost_us = {p: (i + 1) * 10.0 for i, p in enumerate(PARTS)}  # part i costs 10*(i+1) µs
    rng = np.random.default_rng(2)
    lines = []
    for r in range(40):
        base = 0.03 + rng.normal(0, 1e-4)
        for i in range(13):
            t = base + sum(cost_us[p] for p in PARTS[:i]) * 1e-6
            for kind in overhead.KINDS:
                lines.append({"bench": {"kind": kind, "level": i, "round": r, "ok": True, "client_ttft_s": t}})
    s = ablation.ablation_summary(lines)
    assert s["rounds"] == 40 and [row["part"] for row in s["rows"]] == list(PARTS)
    for row in s["rows"]:
        for kind in overhead.KINDS:
            assert row[kind]["n"] == 40 and abs(row[kind]["median_us"] - cost_us[row["part"]]) < 0.2
    assert abs(s["whole"]["text"]["median_us"] - sum(cost_us.values())) < 0.2
    md = ablation.ablation_markdown(s)
    assert "| part | new image us [CI] | same image us [CI] | text us [CI] |" in md
    assert md.count("\n| L") == 12 and "whole stack" in md


def test_throughput_segments_and_ratio() -> None:
    assert throughput.segment_arms(3) == ["on", "off", "off", "on", "on", "off"]
    done = [throughput.Done(0.0, t, "text", True, 256) for t in (1.0, 2.5, 3.0, 9.0)]
    done.append(throughput.Done(0.0, 2.6, "text", False, 0, "boom"))
    w = throughput.window_stats(done, 2.0, 4.0)  # first-token times unknown: every token at the end
    assert (w["requests"], w["errors"], w["output_tokens"], w["tokens_per_s"]) == (2, 1, 512, 256.0)
    # tokens streamed in the window, not whole completed requests: 64 clients that start together finish
    # together, and a window catching one or two of their waves read twice the rate or half of it
    wave = [throughput.Done(0.0, 10.0, "text", True, 101, t_first=0.5 + i / 64) for i in range(64)]
    w = throughput.window_stats(wave, 2.0, 4.0)
    assert w["requests"] == 0 and w["request_share"] == pytest.approx(64 * 0.2)
    assert w["output_tokens"] == pytest.approx(sum(100 * 2.0 / (10.0 - d.t_first) for d in wave), abs=0.1)
    assert throughput.streamed_in(throughput.Done(0.0, 3.0, "text", True, 1, t_first=3.0), 2.0, 4.0) == 1.0
    assert throughput.streamed_in(throughput.Done(0.0, 3.0, "text", False, 5, "x", 1.0), 0.0, 9.0) == 0.0
    first_in = throughput.Done(0.0, 9.0, "text", True, 11, t_first=1.0)  # 1 + 10 tokens over (1, 9]
    assert throughput.streamed_in(first_in, 0.0, 5.0) == pytest.approx(1 + 10 * 4 / 8)
    assert throughput.streamed_in(first_in, 5.0, 9.5) == pytest.approx(10 * 4 / 8)
    segs = []
    for i, arm in enumerate(throughput.segment_arms(3)):
        tps = 1000.0 if arm == "off" else 990.0
        segs.append({"index": i, "pair": i // 2, "arm": arm, "requests": 10, "request_share": 10.0, "tokens_per_s": tps,
                     "cpu_s": {"api": 1.0 if arm == "on" else 0.9, "scheduler": 2.0, "detokenizer": 0.1}})  # fmt: skip
    s = throughput.summarize_segments(segs)
    assert s["pairs"] == 3 and abs(s["tokens_per_s_ratio_on_off"] - 0.99) < 1e-9
    assert (
        s["arms"]["on"]["cpu_ms_per_request"]["api"] == 100.0 and s["arms"]["off"]["cpu_ms_per_request"]["api"] == 90.0
    )
    assert abs(s["cpu_per_request_ratio_on_off"]["api"] - 100 / 90) < 1e-3
    assert s["carryover"] is None  # 5 segments follow one: too few for three coefficients
    segs[0]["flip_error"] = "504"  # a segment whose flip failed is left out, and its pair with it
    assert throughput.summarize_segments(segs)["pairs"] == 2


def test_throughput_carryover_separates_a_late_cost() -> None:
    """A cost that arrives one segment late hides from the pair ratio; the fit finds it."""
    arms = throughput.segment_arms(8)
    segs = [
        {"index": i, "pair": i // 2, "arm": arm, "requests": 10, "request_share": 10.0,
         "tokens_per_s": 7000.0 - 100 * (arm == "on") - 400 * (i > 0 and arms[i - 1] == "on") + (13 * i) % 7,
         "cpu_s": {}}
        for i, arm in enumerate(arms)
    ]  # fmt: skip
    s = throughput.summarize_segments(segs)
    co = s["carryover"]
    assert co["segments"] == 15
    assert co["own"] == pytest.approx(-100, abs=5) and co["previous"] == pytest.approx(-400, abs=5)
    assert co["steady_ratio"] == pytest.approx(6500 / 7000, abs=2e-3)
    assert s["tokens_per_s_ratio_on_off"] > 0.98  # the pair ratio sees little of it
    segs[5]["flip_error"] = "504"  # neither segment 5 nor the one after it (6) is fitted
    assert throughput.summarize_segments(segs)["carryover"]["segments"] == 13


def test_client_ttft_is_the_first_sse_chunk_with_choices() -> None:
    usage_only = b'data: {"id": "x", "choices": [], "usage": {"completion_tokens": 1}}\n\n'
    first = b'data: {"id": "x", "choices": [{"delta": {"role": "assistant", "content": ""}}]}\n\n'
    assert not carries_choices(b"[DONE]") and not carries_choices(b'{"error": {"message": "x"}}')
    assert not carries_choices(usage_only[6:-2]) and carries_choices(first[6:-2])
    assert _sse_events(first + b"data: {partial") == [first[6:-2]]
    head = b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n"

    def chunked(*parts: bytes) -> bytes:
        return b"".join(b"%x\r\n%s\r\n" % (len(p), p) for p in parts)

    assert _dechunk(chunked(first, usage_only)) == first + usage_only
    buf = bytearray(head + chunked(usage_only) + chunked(first)[:20])  # the choices chunk is still arriving
    assert not _first_choices_seen(buf, buf.find(b"\r\n\r\n"))
    buf = bytearray(head + chunked(usage_only, first))
    assert _first_choices_seen(buf, buf.find(b"\r\n\r\n"))


def test_procs_find_this_process_by_its_listening_port() -> None:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen()
        assert procs.pid_listening_on(s.getsockname()[1]) == os.getpid()
    found = procs.server_processes(os.getpid())
    assert found["api"] == [os.getpid()] and set(found) == set(procs.ROLES)
    assert (procs.cpu_seconds(os.getpid()) or 0) > 0 and procs.cpu_seconds(2**22 + 7) is None


# -- the switch experiments end to end against a stand-in server --------------------------------------


class FakeSwitchServer:
    """A stand-in with the switch's HTTP contract and a streaming chat endpoint: it builds a record
    (counted in ``/mmtrace/state`` api.records) for a request that arrives while on with ``records``,
    and writes it (rid = the response id) to ``records`` with ``jsonl`` too. It also takes SGLang's
    ``GET /set_trace_level?level=N`` and notes, per answered rid, the plugin's switch and SGLang's
    trace level it ran under (``seen``). ``{"windows": spec}`` turns the switch off and answers with the
    windows' state, the window closed unless ``window_open`` (the real route is measured on the real
    server; here only the bench's side of it)."""

    def __init__(self, records: Path) -> None:
        import http.server
        import threading

        self.records = records
        self.switch: dict[str, Any] = {"on": True, "parts": list(PARTS), "generation": 0}
        self.posts: list[dict[str, Any]] = []
        self.info: dict[str, dict[str, Any]] = {}  # GET path -> body, e.g. the server info's device
        self.n = 0
        self.written = 0
        self.trace_level = 3  # SGLang's default with --enable-trace
        self.trace_level_calls: list[int] = []
        self.window_open = False
        self.seen: dict[str, tuple[bool, int]] = {}  # rid -> (plugin switch on, SGLang trace level)
        self.lock = threading.Lock()
        fake = self

        class Handler(http.server.BaseHTTPRequestHandler):
            def _json(self, status: int, body: Any) -> None:
                data = json.dumps(body).encode()
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def do_GET(self) -> None:  # noqa: N802
                if self.path.startswith("/set_trace_level?level="):
                    with fake.lock:
                        fake.trace_level = int(self.path.rpartition("=")[2])
                        fake.trace_level_calls.append(fake.trace_level)
                    self._json(200, "success")
                    return
                if self.path in fake.info:
                    self._json(200, fake.info[self.path])
                    return
                self._json(200, {"api": {"switch": dict(fake.switch), "records": fake.written}, "peers": {}})

            def do_POST(self) -> None:  # noqa: N802
                body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
                if self.path == "/mmtrace/enabled" and "windows" in body:
                    with fake.lock:
                        fake.posts.append(body)
                        sw = fake.switch
                        sw.update(on=fake.window_open, generation=sw["generation"] + 1)
                        spec = Schedule.parse(body["windows"]).spec
                        state = {"schedule": spec, "running": True, "open": fake.window_open}
                    self._json(200, {**sw, "windows": state})
                    return
                if self.path == "/mmtrace/enabled":
                    if not isinstance(body.get("on"), bool):
                        self._json(400, {"error": "bad body"})
                        return
                    with fake.lock:
                        fake.posts.append(body)
                        sw = fake.switch
                        sw.update(
                            on=body["on"], parts=list(body.get("parts") or PARTS), generation=sw["generation"] + 1
                        )
                        ans = {
                            **sw,
                            "processes": {"api:1": dict(sw), "scheduler:2": dict(sw), "detokenizer:3": dict(sw)},
                        }
                    self._json(200, ans)
                    return
                with fake.lock:
                    fake.n += 1
                    rid = f"{fake.n}-{uuid.uuid4().hex}"  # unique across servers, like SGLang's
                    built = fake.switch["on"] and "records" in fake.switch["parts"]
                    traced = built and "jsonl" in fake.switch["parts"]
                    fake.seen[rid] = (fake.switch["on"], fake.trace_level)
                self.send_response(200)
                self.send_header("Content-Type", "text/event-stream")
                self.end_headers()
                for chunk in (
                    {"id": rid, "choices": [{"index": 0, "delta": {"role": "assistant", "content": ""}}]},
                    {"id": rid, "choices": [{"index": 0, "delta": {"content": "x"}}]},
                    {"id": rid, "choices": [], "usage": {"prompt_tokens": 5, "completion_tokens": body["max_tokens"]}},
                ):
                    self.wfile.write(b"data: " + json.dumps(chunk).encode() + b"\n\n")
                self.wfile.write(b"data: [DONE]\n\n")
                self.wfile.flush()
                if built:
                    with fake.lock, fake.records.open("a") as fh:
                        if traced:
                            fh.write(json.dumps({"rid": rid, "ttft_s": 0.001, "status": "ok"}) + "\n")
                        fake.written += 1  # api.records counts built records, written or not

            def log_message(self, format: str, *args: Any) -> None:
                pass

        class Server(http.server.ThreadingHTTPServer):
            request_queue_size = 128  # the default 5 drops connections on a loaded machine
            daemon_threads = True

        self.httpd = Server(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.httpd.server_address[1]}"
        threading.Thread(target=self.httpd.serve_forever, daemon=True).start()

    def close(self) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()


def test_server_on_gpu_reads_the_device_of_the_server_info(tmp_path: Path) -> None:
    """Decides the overhead experiment's default rounds for a --url server."""
    fake = FakeSwitchServer(tmp_path / "records.jsonl")
    try:
        assert server_on_gpu(fake.url) is None  # no device anywhere: unknown
        fake.info["/get_server_info"] = {"device": "cuda"}  # releases before /server_info
        assert server_on_gpu(fake.url) is True
        fake.info["/server_info"] = {"device": "cpu"}
        assert server_on_gpu(fake.url) is False
    finally:
        fake.close()
    assert server_on_gpu(_dead_url()) is None


def test_switch_experiments_against_a_stand_in_server(tmp_path: Path) -> None:
    from sglang_mmtrace.bench import driver
    from sglang_mmtrace.bench.targets import Target

    records = tmp_path / "records.jsonl"
    records.touch()
    fake = FakeSwitchServer(records)
    fake.switch.update(on=True, parts=["http", "tokenizer"])  # found partly on: put back like that
    try:
        opts = Options(n=3, warmup=1, size=(32, 24), seed=9, concurrency=(3,), max_tokens=4,
                       segment_s=0.6, segments=2, settle_s=0.2, timeout=10, keep_records=True)  # fmt: skip
        st = driver.Settings(experiments=[], opts=opts, records_timeout=5.0)
        out = driver.Outcome()
        target = Target("fake", fake.url, records, pid=os.getpid())
        for name in ("overhead", "ablation", "throughput"):
            driver.run_switched(target, name, st, out)
            assert fake.switch["on"] is True and fake.switch["parts"] == ["http", "tokenizer"], name
        opts.control, no_aa = False, driver.Outcome()
        driver.run_switched(target, "overhead", st, no_aa)
    finally:
        fake.close()
    ov = out.results["overhead"]  # the A/A arm by default
    assert ov["aa"] is True and {k: v["n_rounds"] for k, v in ov["kinds"].items()} == {k: 3 for k in overhead.KINDS}
    assert all("aa_us" in v for v in ov["kinds"].values())
    assert ov["records"] == {"on_ok": 9, "on_with_record": 9, "off_ok": 18, "off_with_record": 0}
    lines = [ln for ln in out.lines if ln["bench"]["experiment"] == "overhead"]
    assert len(lines) == 27 and all(ln["bench"]["record"] == (ln["bench"]["arm"] == "on") for ln in lines)
    assert len({ln["bench"]["generation"] for ln in lines}) == 27  # one flip before every request
    assert ov["requests_sent"] == 27 and ov["switch"]
    bare = no_aa.results["overhead"]
    assert bare["aa"] is False and {k: v["n_rounds"] for k, v in bare["kinds"].items()} == {
        k: 3 for k in overhead.KINDS
    }
    assert bare["records"] == {"on_ok": 9, "on_with_record": 9, "off_ok": 9, "off_with_record": 0}
    assert bare["requests_sent"] == 18
    ab = out.results["ablation"]
    assert ab["rounds"] == 3 and ab["requests_sent"] == 3 * 3 * 13
    assert ab["records"]["expected"] == ab["records"]["expected_found"] == 3 * 3 * 4  # L9..L12 write records
    assert ab["records"]["unexpected_found"] == 0
    assert all(row[k]["n"] == 3 for row in ab["rows"] for k in overhead.KINDS)
    tp = out.results["throughput"]
    assert tp["config"]["clients"] == 3 and tp["config"]["max_tokens"] == 4
    assert [s["arm"] for s in tp["segments"]] == ["on", "off", "off", "on"]
    # (how many requests land in each window depends on the machine's load: not asserted)
    # the tokens streamed in the windows, no more than the requests that overlapped them generated
    assert 0 < sum(s["output_tokens"] for s in tp["segments"]) <= 4 * tp["requests_total"]
    for seg in tp["segments"]:  # (both rounded: the rate to 0.01/s, the window to 1 ms)
        assert abs(seg["tokens_per_s"] * seg["window_s"] - seg["output_tokens"]) <= 0.01 * seg["output_tokens"] + 0.1
    assert tp["requests_total"] > 0 and tp["errors_total"] == 0 and tp["summary"]["pairs"] <= 2
    assert tp["processes"]["api"] == [os.getpid()]
    # every body the bench sent was valid for the contract: on + parts, or off
    assert all(set(b) in ({"on"}, {"on", "parts"}) for b in fake.posts)


def _overhead_on(fake: Any, records: Path, **options: Any) -> Any:
    """The overhead experiment, 4 rounds after 1 warm-up round, against the stand-in switch server."""
    from sglang_mmtrace.bench import driver
    from sglang_mmtrace.bench.targets import Target

    opts = Options(n=4, warmup=1, size=(32, 24), seed=9, max_tokens=2, timeout=10, gap_s=0.0, **options)
    out = driver.Outcome()
    st = driver.Settings(experiments=[], opts=opts, records_timeout=5.0)
    driver.run_switched(Target("fake", fake.url, records, pid=os.getpid()), "overhead", st, out)
    return out


def test_sglang_trace_peer_arm_runs_with_the_plugin_off_and_sglang_tracing_on(tmp_path: Path) -> None:
    """With ``peer`` the overhead experiment's fourth arm reaches the server with the plugin's switch
    off and SGLang's trace level at 3, every other arm with level 0 (the level sent only when it
    changes), and SGLang's level is left at 3 (its default) at the end. SGLang's tracing cannot run
    here, so the stand-in server takes its route; the result's keys are the real analysis's."""
    records = tmp_path / "records.jsonl"
    records.touch()
    fake = FakeSwitchServer(records)
    try:
        out = _overhead_on(fake, records, peer=True)
    finally:
        fake.close()
    lines = out.lines
    assert len(lines) == 4 * 3 * 4 and all(ln["bench"]["ok"] for ln in lines)
    for ln in lines:
        arm = ln["bench"]["arm"]
        assert fake.seen[ln["rid"]] == (arm == "on", 3 if arm == overhead.PEER else 0), arm
        assert ln["bench"]["trace_level"] == (3 if arm == overhead.PEER else 0)
        if arm == overhead.PEER:
            assert ln["bench"]["variant"] == f"{ln['bench']['kind']}: plugin off, SGLang tracing at level 3"
    sent, restore = fake.trace_level_calls[:-1], fake.trace_level_calls[-1]
    assert all(a != b for a, b in zip(sent, sent[1:], strict=False))  # sent only when the level changes
    assert sent[0] == 0 and restore == 3 == fake.trace_level  # the end: SGLang's default again
    ov = out.results["overhead"]
    assert ov["aa"] is True and ov["peer"] is True
    assert ov["records"] == {"on_ok": 12, "on_with_record": 12, "off_ok": 36, "off_with_record": 0}
    for s in ov["kinds"].values():
        assert s["n_rounds"] == 4 and s["peer_ci_us"][0] <= s["peer_us"] <= s["peer_ci_us"][1]
        # 4 rounds judge nothing (the stand-in's timing may also put the A/A's interval off 0 first)
        assert s["peer_target"]["met"] is None and s["peer_target"]["not_judged"] in (
            "4 rounds < 400",
            "the A/A's interval excludes 0",
        )


def test_between_windows_arm_reaches_the_server_between_windows(tmp_path: Path) -> None:
    """With ``between`` the overhead experiment's fourth arm hands the switch to tracing windows that
    are closed (the answer checked, the spec kept on the line) and its requests run with the plugin
    off and leave no record; the next arm's ``{"on": ...}`` takes the switch back. A server whose
    answer shows the window open is refused."""
    records = tmp_path / "records.jsonl"
    records.touch()
    fake = FakeSwitchServer(records)
    try:
        out = _overhead_on(fake, records, between=True)
        fake.window_open = True
        with pytest.raises(SwitchError, match="not between windows"):
            set_windows(fake.url, "0.5s/1h")
    finally:
        fake.close()
    lines = out.lines
    assert len(lines) == 4 * 3 * 4 and all(ln["bench"]["ok"] for ln in lines)
    specs = {Schedule.parse(f"0.5s/{p}").spec for p in ("1h", "59m", "58m")}
    for ln in lines:
        arm = ln["bench"]["arm"]
        assert fake.seen[ln["rid"]] == (arm == "on", 3), arm
        assert (ln["bench"].get("windows") in specs) == (arm == overhead.BETWEEN), arm
    # one windows POST per between-windows request (warm-up included), each followed by an {"on": ...}
    windows_posts = [i for i, b in enumerate(fake.posts) if "windows" in b]
    assert len(windows_posts) == (1 + 4) * 3 + 1  # the last one: set_windows against the open window
    assert all("on" in fake.posts[i + 1] for i in windows_posts[:-1])
    ov = out.results["overhead"]
    assert ov["aa"] is True and ov["between"] is True and ov["peer"] is False
    assert ov["records"] == {"on_ok": 12, "on_with_record": 12, "off_ok": 36, "off_with_record": 0}
    for s in ov["kinds"].values():
        assert s["n_rounds"] == 4 and s["between_ci_us"][0] <= s["between_us"] <= s["between_ci_us"][1]
        assert isinstance(s["between_within_aa"], bool)


def test_crossover_launches_pairs_one_after_the_other(tmp_path: Path, monkeypatch: Any) -> None:
    """The crossover's launch loop with stand-in servers: each pair is started one server after the
    other, the first one alternating by orientation; the A/A run follows; records only from the
    plugin-on server of the A/B launches."""
    from sglang_mmtrace.bench import driver
    from sglang_mmtrace.bench.targets import LaunchConfig

    events: list[tuple[str, str]] = []

    class PairServer:
        def __init__(self, name: str, plugin_enabled: bool, jsonl: Path | None) -> None:
            self.name, self.plugin_enabled, self.jsonl_path = name, plugin_enabled, jsonl
            self.process, self.startup_seconds, self.fake = None, 0.0, None

        def start(self) -> Any:
            self.fake = FakeSwitchServer(self.jsonl_path or tmp_path / f"{self.name}.none.jsonl")
            self.fake.switch["on"] = self.plugin_enabled
            events.append(("start", self.name))
            return self

        @property
        def base_url(self) -> str:
            assert self.fake is not None
            return self.fake.url

        def stop(self) -> None:
            if self.fake is not None:
                self.fake.close()
                self.fake = None
                events.append(("stop", self.name))

    def make_server(cfg: Any, folder: Path, gpu: bool, plugin_enabled: bool, health: float, name: str) -> PairServer:
        jsonl = folder / f"{name}.records.jsonl" if plugin_enabled else None
        if jsonl is not None:
            jsonl.touch()
        return PairServer(name, plugin_enabled, jsonl)

    monkeypatch.setattr(driver, "make_server", make_server)
    opts = Options(n=2, warmup=0, size=(16, 16), seed=1, launches=1, timeout=10)
    st = driver.Settings(
        experiments=[], opts=opts, launch=[LaunchConfig("cfg")], work_dir=tmp_path, records_timeout=5.0
    )
    out = driver.Outcome()
    saved: list[int] = []
    driver.run_crossover(st, out, after_launch=lambda o: saved.append(len(o.results["overhead-crossover"]["launches"])))
    starts = [n for e, n in events if e == "start"]
    assert starts == [
        "crossover-ab0-on", "crossover-ab0-off", "crossover-ab1-off", "crossover-ab1-on",
        "crossover-aa0-on", "crossover-aa0-off", "crossover-aa1-off", "crossover-aa1-on",
    ]  # fmt: skip
    assert saved == [1, 2, 3, 4]
    res = out.results["overhead-crossover"]
    for run in ("ab", "aa"):
        assert set(res[run]["orientations"]) == {"on-first", "off-first"}
        assert all(
            res[run]["orientations"][o][k]["n_pairs"] == 2 for o in ("on-first", "off-first") for k in overhead.KINDS
        )
        assert res[run]["geomean"]["text"]["orientations"] == 2
    assert res["ab"]["records"] == {"on_ok": 12, "on_with_record": 12, "off_ok": 12, "off_with_record": 0}
    assert res["aa"]["records"]["on_with_record"] == 0
    assert len(out.lines) == 4 * 2 * 3 * 2
    # the A/A control alone (a device call too short for both runs)
    events.clear()
    opts.ab = False
    out = driver.Outcome()
    driver.run_crossover(st, out)
    assert [n for e, n in events if e == "start"] == [
        "crossover-aa0-on", "crossover-aa0-off", "crossover-aa1-off", "crossover-aa1-on",
    ]  # fmt: skip
    assert set(out.results["overhead-crossover"]) >= {"aa"} and "ab" not in out.results["overhead-crossover"]


def _dead_url() -> str:
    """A local port with nothing listening (bound, then released)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return f"http://127.0.0.1:{s.getsockname()[1]}"


def _bench(capsys: Any, *args: str) -> tuple[int, str, str]:
    from sglang_mmtrace.cli.main import main

    rc = main(["bench", *args])
    out, err = capsys.readouterr()
    return rc, out, err


@contextlib.contextmanager
def _answering(health: int, chat: int = 500) -> Iterator[str]:
    """A local HTTP server that answers GET /health with ``health`` and every POST with ``chat`` (an
    error body); yields its URL."""
    import http.server
    import threading

    class Handler(http.server.BaseHTTPRequestHandler):
        def _send(self, status: int) -> None:
            body = b'{"error": "stand-in"}'
            self.send_response(status)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def do_GET(self) -> None:  # noqa: N802
            self._send(health if self.path == "/health" else 404)

        def do_POST(self) -> None:  # noqa: N802
            self.rfile.read(int(self.headers.get("Content-Length") or 0))
            self._send(chat)

        def log_message(self, format: str, *args: Any) -> None:
            pass

    httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=httpd.serve_forever, daemon=True).start()
    try:
        yield f"http://127.0.0.1:{httpd.server_address[1]}"
    finally:
        httpd.shutdown()
        httpd.server_close()


@pytest.mark.parametrize("experiment", ["new-vs-repeat", "overhead"])
def test_bench_against_a_dead_server_sends_nothing_and_says_so(tmp_path: Path, capsys: Any, experiment: str) -> None:
    """GET /health first: a dead --url is one line before any request, not a table of refusals."""
    url, out_file = _dead_url(), tmp_path / "bench.jsonl"
    rc, out, err = _bench(capsys, "--url", url, "--experiment", experiment, "--n", "1", "--out", str(out_file))
    assert rc == 1 and not out and not out_file.exists()
    assert err.strip() == (
        f"sglang-mmtrace bench: nothing answers GET {url}/health (ConnectionRefusedError: [Errno 111] "
        "Connection refused); is a server running there? Nothing sent"
    )


def test_bench_against_a_server_still_starting_sends_nothing(capsys: Any) -> None:
    with _answering(health=503) as url:
        rc, out, err = _bench(capsys, "--url", url, "--experiment", "order", "--n", "1", "--questions", "1")
    assert rc == 1 and not out
    assert err.strip() == (
        f"sglang-mmtrace bench: GET {url}/health answered HTTP 503, not 200 (starting, or unhealthy); nothing sent"
    )


def test_bench_where_every_request_fails_shows_them_and_exits_1(tmp_path: Path, capsys: Any) -> None:
    """A healthy server that rejects every request: the table and --out still show the errors."""
    out_file = tmp_path / "new" / "bench.jsonl"
    with _answering(health=200, chat=500) as url:
        rc, out, err = _bench(capsys, "--url", url, "--experiment", "new-vs-repeat", "--n", "1", "--warmup", "0",
                              "--out", str(out_file))  # fmt: skip
    assert rc == 1
    assert out.splitlines()[0].endswith(f"; target: {url} (not launched here)")  # nothing was launched
    assert [json.loads(line)["bench"]["ok"] for line in out_file.read_text().splitlines()] == [False, False]
    last = err.strip().splitlines()[-1]
    assert last.startswith("sglang-mmtrace bench: all 2 requests failed (2 with ") and "500" in last
    assert last.endswith(f"; {url} answered GET /health; its log may say why")


def test_bench_records_that_cannot_be_read_is_one_line(tmp_path: Path, capsys: Any) -> None:
    for records, why in ((tmp_path / "typo.jsonl", "No such file or directory"), (tmp_path, "Is a directory")):
        rc, out, err = _bench(capsys, "--url", _dead_url(), "--records", str(records), "--experiment", "order")
        assert rc == 1 and not out
        assert err.strip() == (
            f"sglang-mmtrace bench: --records {records}: {why} (it is that server's SGLANG_MMTRACE_JSONL, "
            "which the plugin creates when the server starts)"
        )


def test_bench_url_without_scheme_is_a_usage_error(capsys: Any) -> None:
    rc, out, err = _bench(capsys, "--url", "127.0.0.1:30000", "--experiment", "order")
    assert rc == 2 and not out
    assert err.strip() == "sglang-mmtrace bench: --url: expected an http:// base URL, got '127.0.0.1:30000'"


def test_bench_out_where_a_file_blocks_the_folder(tmp_path: Path, capsys: Any) -> None:
    blocker = tmp_path / "a-file"
    blocker.write_text("")
    with _answering(health=200) as url:
        rc, _, err = _bench(capsys, "--url", url, "--experiment", "order", "--n", "1", "--questions", "1",
                            "--warmup", "0", "--out", str(blocker / "bench.jsonl"))  # fmt: skip
    assert rc == 1
    assert err.strip().splitlines()[-1] == f"sglang-mmtrace bench: cannot create folder {blocker}: File exists"


def test_all_failed_only_when_every_measured_request_failed() -> None:
    def line(ok: bool, error: str | None = None) -> dict[str, Any]:
        return {"rid": None, "bench": {"ok": ok, "error": error}}

    assert bench_cli.all_failed([]) is None  # nothing measured (e.g. transport skipped on a CPU): not a failure
    assert bench_cli.all_failed([line(True), line(False, "E: x")]) is None
    assert bench_cli.all_failed([line(False, "A: a"), line(False, "B: b"), line(False, "A: a")]) == (
        "all 3 requests failed (2 with A: a)"
    )


# -- resolution: the plan and the slope interval --------------------------------------------------------


def test_image_shape_puts_the_long_edge_on_the_longer_side() -> None:
    assert image_shape(2048, "16:9") == (2048, 1152) and image_shape(2048, "9:16") == (1152, 2048)
    assert image_shape(256, "1:1") == (256, 256) and image_shape(256, "4:3") == (256, 192)
    for bad in ((256, "0:1"), (0, "1:1"), (256, "x:1")):
        try:
            image_shape(*bad)
        except ValueError:
            continue
        raise AssertionError(f"accepted {bad}")


def test_resolution_plan_interleaves_every_shape_and_kind_each_round() -> None:
    opts = Options(n=3, warmup=1, seed=5, sizes=(64, 96), aspects=("1:1", "16:9"))
    shapes = opts.resolution_shapes()
    assert [(w, h) for w, h, _ in shapes] == [(64, 36), (64, 64), (96, 54), (96, 96)]  # by pixels
    plan = ex.resolution(opts)
    warm, measured = [p for p in plan if p.warmup], [p for p in plan if not p.warmup]
    assert [p.extra["kind"] for p in warm] == ["repeated"] * 4 + ["new"]
    repeated_url = {(p.extra["width"], p.extra["height"]): p.messages for p in warm if p.extra["kind"] == "repeated"}
    rounds = [[p for p in measured if p.round == r] for r in range(3)]
    cells = {(w, h, k) for w, h, _ in shapes for k in ("new", "repeated")}
    for r in rounds:
        assert {(p.extra["width"], p.extra["height"], p.extra["kind"]) for p in r} == cells and len(r) == 8
    assert len({tuple(p.variant for p in r) for r in rounds}) > 1  # shuffled per round
    new_urls = [p.messages[0]["content"][0]["image_url"]["url"] for p in measured if p.extra["kind"] == "new"]
    assert len(set(new_urls)) == len(new_urls) == 12
    for p in measured:
        url = p.messages[0]["content"][0]["image_url"]["url"]
        assert p.extra["image_bytes"] == len(base64.b64decode(url.split(",", 1)[1]))
        assert p.group == f"{p.extra['width']}x{p.extra['height']}" and p.variant == f"{p.group} {p.extra['kind']}"
        if p.extra["kind"] == "repeated":
            assert p.messages == repeated_url[(p.extra["width"], p.extra["height"])]
    index = {p.variant: p.variant_index for p in measured}  # the tables list shapes by pixels, new first
    assert sorted(index, key=index.get) == [f"{w}x{h} {k}" for w, h, _ in shapes for k in ("new", "repeated")]


def test_bootstrap_slope_interval() -> None:
    rng = np.random.default_rng(3)
    x = np.repeat([0.1, 0.5, 1.0, 2.0, 4.0], 6)
    lo, hi = bootstrap_slope_ci(x, 0.01 + 0.02 * x + rng.normal(0, 0.005, x.size))
    assert 0 < lo < 0.02 < hi
    lo, hi = bootstrap_slope_ci(x, 0.05 + rng.normal(0, 0.005, x.size))
    assert lo < 0 < hi
    assert all(v != v for v in bootstrap_slope_ci([1.0] * 5, [1.0, 2.0, 3.0, 4.0, 5.0]))  # one x: no slope


def _progress_stderr(tty: bool) -> str:
    """Run three ticks of the bench's progress bar in a child whose stderr is a terminal (a pty) or a pipe."""
    import fcntl
    import os
    import pty
    import struct
    import subprocess
    import sys
    import termios

    code = (
        "import time\n"
        "from sglang_mmtrace.bench.runner import progress_bar\n"
        "with progress_bar(3, 'resolution') as tick:\n"
        "    for _ in range(3):\n"
        "        time.sleep(0.15)\n"  # past tqdm's 0.1 s redraw interval: each tick is drawn
        "        tick()\n"
    )
    if not tty:
        return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stderr
    primary, secondary = pty.openpty()
    # a terminal has a size (a fresh pty is 0x0, and tqdm draws nothing on zero columns)
    fcntl.ioctl(secondary, termios.TIOCSWINSZ, struct.pack("HHHH", 24, 100, 0, 0))
    try:
        proc = subprocess.Popen([sys.executable, "-c", code], stderr=secondary, stdout=subprocess.DEVNULL)
        os.close(secondary)
        chunks = []
        while True:
            try:
                data = os.read(primary, 4096)
            except OSError:  # EIO: the child's end is closed and everything was read
                break
            if not data:
                break
            chunks.append(data)
        assert proc.wait(timeout=60) == 0
        return b"".join(chunks).decode(errors="replace")
    finally:
        os.close(primary)


def test_progress_bar_on_a_terminal_only():
    shown = _progress_stderr(tty=True)
    assert "resolution" in shown and "3/3" in shown, shown
    assert _progress_stderr(tty=False) == ""  # logs and CI output stay clean


def test_lead_in_puts_an_untimed_request_of_the_same_arm_and_kind_before_each_timed_one() -> None:
    wl = overhead.Workload(seed=3, nonce="n", size=(32, 24))
    plan = overhead.paired_plan(
        "overhead", rounds=8, warmup_rounds=1, workload=wl, control=True, peer=True, lead_in=True
    )
    assert len(plan) == 9 * 3 * 4 * 2
    assert all(p.warmup for p in plan if p.round < 0)
    for r in range(8):
        rnd = [p for p in plan if p.round == r]
        order = overhead.arm_order(r, control=True, peer=True)
        # per kind, the arms in the round's order, each a lead-in (untimed) and then its timed request
        assert [(p.extra["arm"], p.extra["kind"], p.warmup) for p in rnd] == [
            (arm, kind, lead) for kind in overhead.KINDS for arm in order for lead in (True, False)
        ]
        assert all(p.extra["order"] == order.index(p.extra["arm"]) for p in rnd)
        assert all(p.extra["expect_record"] == (p.extra["arm"] == "on") for p in rnd)
    # every timed request follows one of its own arm and kind (a flip only ever precedes a lead-in)
    for prev, p in itertools.pairwise(plan):
        if not p.warmup:
            assert (prev.extra["arm"], prev.extra["kind"], prev.warmup) == (p.extra["arm"], p.extra["kind"], True)
    new = [_text(p.messages) for p in plan if p.extra["kind"] == "new_image"]
    text = [_text(p.messages) for p in plan if p.extra["kind"] == "text"]
    assert len(set(new)) == len(new) and len(set(text)) == len(text)  # lead-ins' images and prompts are new too
    # without lead-ins the arms alternate request by request
    bare = overhead.paired_plan("overhead", rounds=2, warmup_rounds=0, workload=wl, control=True, peer=True)
    assert len(bare) == 2 * 3 * 4 and not any(p.warmup for p in bare)


def test_overhead_plan_makes_each_image_when_its_request_is_sent(monkeypatch: Any) -> None:
    """A plan of many rounds encodes no new image up front: a run a deadline ends early pays only for
    the requests it sent."""
    made: list[int] = []
    real = overhead.make_image
    monkeypatch.setattr(overhead, "make_image", lambda *a, **k: made.append(1) or real(*a, **k))
    wl = overhead.Workload(seed=3, nonce="n", size=(32, 24))
    assert len(made) == 1  # the same-image request's one JPEG
    plan = overhead.paired_plan("overhead", rounds=50, warmup_rounds=1, workload=wl, control=True, lead_in=True)
    assert len(made) == 1
    new = [p for p in plan if p.extra["kind"] == "new_image"]
    first, second = new[0].chat(), new[1].chat()
    assert len(made) == 3 and first != second and first == new[0].chat()
    assert first == wl.messages("new_image", new[0].round, f"{new[0].extra['arm']} lead-in")  # new[0]: a lead-in


def test_switch_route_idles_the_gap_before_timed_requests_only(monkeypatch: Any) -> None:
    """Every timed request starts ``gap_s`` after the previous response ended; an untimed one (a
    warm-up or a lead-in) at once: its own idle time would measure nothing."""

    class Flipper:  # the switch's client: only what the route calls
        base_url = "http://x"

        def set(self, parts: Any) -> dict[str, Any]:
            return {"generation": 1}

    slept: list[float] = []
    monkeypatch.setattr(overhead.time, "sleep", slept.append)
    route = overhead.switch_route(Flipper(), gap_s=0.04)  # type: ignore[arg-type]
    wl = overhead.Workload(seed=3, nonce="n", size=(32, 24))
    plan = overhead.paired_plan("overhead", rounds=1, warmup_rounds=0, workload=wl, lead_in=True)
    for p in plan[:4]:
        assert route(p) == "http://x"
    lead, timed = slept[0::2], slept[1::2]
    assert [p.warmup for p in plan[:4]] == [True, False, True, False]
    assert all(s == 0.0 for s in lead) and all(0.03 < s <= 0.04 for s in timed)
