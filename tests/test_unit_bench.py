"""Pure parts of ``sglang-mmtrace bench`` that need no server: launch strings, the statistics, and
reading a records file that is being appended to (a real file with a half-written last line)."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np

from sglang_mmtrace.bench.records import RecordsTail
from sglang_mmtrace.bench.stats import bootstrap_quantile_ci, paired_ratio_ci, quantile
from sglang_mmtrace.bench.targets import parse_launch
from sglang_mmtrace.cli.bench import parse_size


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
