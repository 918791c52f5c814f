"""The demo: its closing lines (where each request kind's TTFT went and what the caches saved) and the
SGLang flags it passes to its server."""

from __future__ import annotations

import io
import os
import tempfile
from typing import Any

import pytest

from sglang_mmtrace.cli import demo, main
from sglang_mmtrace.cli.demo import DEMO_SERVER_ARGS, KINDS, findings
from sglang_mmtrace.stages import STAGES


def _group(ttft_ms: float, stages_ms: dict[str, float]) -> dict[str, Any]:
    return {
        "n": 5,
        "ttft_p50": ttft_ms / 1e3,
        "stages": {s: {"p50": v / 1e3, "share": v / ttft_ms, "n": 5} for s, v in stages_ms.items()},
    }


def test_findings_name_the_leading_leaf_stages_and_what_a_cache_skipped():
    new = _group(
        100.0,
        {"tokenize": 30.0, "mm.process": 29.0, "mm.decode": 10.0, "mm.resize_normalize": 15.0,
         "model.forward": 50.0, "model.vision_encoder": 35.0, "model.prefill": 12.0},
    )  # fmt: skip
    same = _group(45.0, {"tokenize": 2.0, "mm.process": 1.5, "model.forward": 13.0, "model.prefill": 12.0})
    different = _group(101.0, dict((s, v["p50"] * 1e3) for s, v in new["stages"].items()))
    lines, named = findings({KINDS[0]: new, KINDS[1]: same, KINDS[2]: different, KINDS[3]: {"n": 0, "stages": {}}})
    assert len(lines) == 3  # a kind without requests says nothing; five requests each: no caveat
    # leaves only: mm.process and model.forward hold the named stages, so they are not named themselves
    assert lines[0] == "new image: TTFT 100.0 ms; most of it in model.vision_encoder 35%, mm.resize_normalize 15%"
    assert lines[1].startswith("same image again: TTFT 45.0 ms; most of it in model.prefill 27%, mm.process 3%")
    assert lines[1].endswith(
        "-55.0 ms against a new image (skipped: mm.decode 10.0 ms, mm.resize_normalize 15.0 ms, "
        "model.vision_encoder 35.0 ms)"
    )
    assert lines[2].endswith("+1.0 ms against a new image (nothing skipped)")
    # every stage the lines name, once, in the order they first appear (the legend explains these)
    assert named == ["model.vision_encoder", "mm.resize_normalize", "model.prefill", "mm.process", "mm.decode"]


def test_findings_from_few_requests_say_they_may_be_noise():
    def kinds(n: int) -> dict[str, dict[str, Any]]:
        return {k: {**_group(50.0, {"tokenize": 20.0, "model.prefill": 10.0}), "n": n} for k in KINDS}

    for n, caveat in ((1, "1 request per kind"), (2, "2 requests per kind")):
        lines, _ = findings(kinds(n))
        assert len(lines) == len(KINDS) + 1
        assert lines[-1] == (
            f"these figures come from {caveat}: one slow request moves such a median, so they may be noise "
            "(--rounds 3 or more)"
        )
    one_short = {**kinds(5), KINDS[2]: {**kinds(2)[KINDS[2]]}}  # a kind that lost records: its count counts
    assert findings(one_short)[0][-1].startswith("these figures come from 2 requests per kind")
    assert len(findings(kinds(3))[0]) == len(KINDS)  # from three on, no caveat


def test_legend_says_what_each_named_stage_measures_in_the_catalogues_words():
    text = demo.legend(["scheduler.overlap_wait", "model.vision_encoder"])
    assert text.startswith(demo.LEGEND + "\n\nWhat the stages named below measure:\n")
    assert text.splitlines()[-2:] == [
        f"  scheduler.overlap_wait  {STAGES['scheduler.overlap_wait'].covers}",
        f"  model.vision_encoder    {STAGES['model.vision_encoder'].covers}",
    ]
    assert "overlap scheduler" in text  # the catalogue's words, not a copy that could drift
    assert demo.legend([]) == demo.LEGEND


def test_flags_after_the_double_dash_go_to_the_server(monkeypatch):
    seen = []
    monkeypatch.setattr(demo, "run", lambda args: seen.append(args) or 0)
    assert main.main(["demo", "--serve-only", "--", "--tokenizer-worker-num", "2"]) == 0
    assert seen[0].serve_only and demo.server_args(seen[0].server_args) == (
        *DEMO_SERVER_ARGS,
        "--tokenizer-worker-num",
        "2",
    )
    assert main.main(["demo"]) == 0 and demo.server_args(seen[1].server_args) == DEMO_SERVER_ARGS


def test_rounds_below_one_is_a_usage_error(monkeypatch, capsys):
    """No rounds would measure nothing and print an empty "What this run found": argparse refuses it."""
    monkeypatch.setattr(demo, "run", lambda args: pytest.fail("the demo ran"))
    for bad, why in (("0", "0 is less than 1"), ("-3", "-3 is less than 1"), ("two", "'two' is not a whole number")):
        with pytest.raises(SystemExit) as exc:
            main.main(["demo", "--rounds", bad])
        assert exc.value.code == 2
        assert (
            capsys.readouterr()
            .err.strip()
            .splitlines()[-1]
            .startswith(f"sglang-mmtrace demo: error: argument --rounds: {why}")
        )
    assert main.build_parser().parse_args(["demo", "--rounds", "1"]).rounds == 1


# SGLang 0.5.23's own start-up lines on the CPU (a demo server's log, cut to fit), in the order they came
IMPORTING = """\
/venv/lib/python3.11/site-packages/torch/cuda/__init__.py:228: UserWarning: CUDA initialization: Unexpected error from cudaGetDeviceCount().
  return torch._C._cuda_getDeviceCount() > 0
/venv/lib/python3.11/site-packages/sglang/launch_server.py:71: UserWarning: 'python -m sglang.launch_server' is still supported, but 'sglang serve' is the recommended entrypoint.
  Example: sglang serve --model-path <model> [options]
  warnings.warn(
"""
LAUNCHED = """\
[2026-12-06 23:00:39] Cuda graph is disabled because of using torch native attention backend
[2026-12-06 23:00:39] server_args={'model_path': '/tmp/tiny-qwen3vl-seed0', 'device': 'cpu'}
[2026-12-06 23:00:41] Cannot detect CUDA architecture.
"""
LOADING = """\
[2026-12-06 23:01:36] Init parallel begin.
[2026-12-06 23:01:36] Init parallel ends. elapsed=0.42 s
[2026-12-06 23:01:41] Load weight begin. avail mem=15.67 GB
[2026-12-06 23:01:41] Using sdpa as multimodal attention backend.
"""
SERVING = """\
[2026-12-06 23:01:42] Load weight end. elapsed=1.20 s, type=Qwen3VLForConditionalGeneration, avail mem=15.23 GB, mem usage=0.44 GB.
[2026-12-06 23:01:51] Memory pool end. avail mem=12.87 GB
[2026-12-06 23:01:51] max_total_num_tokens=65536, chunked_prefill_size=4096, max_prefill_tokens=16384
[2026-12-06 23:01:52] INFO:     Application startup complete.
[2026-12-06 23:01:52] INFO:     Uvicorn running on http://127.0.0.1:52145 (Press CTRL+C to quit)
[2026-12-06 23:01:52] INFO:     127.0.0.1:60380 - "GET /health HTTP/1.1" 503 Service Unavailable
"""
PROBED = """\
[2026-12-06 23:01:57] INFO:     127.0.0.1:41896 - "GET /health HTTP/1.1" 503 Service Unavailable
[rank0]:W1206 23:01:57.395000 5924 torch/utils/cpp_extension.py:183] [0/0] No CUDA runtime is found, using CUDA_HOME='/usr/local'
[2026-12-06 23:01:57] INFO:     127.0.0.1:41912 - "GET /health HTTP/1.1" 503 Service Unavailable
"""


def test_startup_progress_names_the_phase_never_a_log_line():
    out = io.StringIO()
    progress = demo.StartupProgress(out)
    for seconds, tail in enumerate((IMPORTING, IMPORTING + LAUNCHED, LAUNCHED + LOADING, LOADING + SERVING, PROBED)):
        progress(10.0 * (seconds + 1), tail)
    assert out.getvalue().splitlines() == [
        "  ... SGLang starting (10 s): importing SGLang",
        "  ... SGLang starting (20 s): starting its scheduler and detokenizer processes",
        "  ... SGLang starting (30 s): loading the model weights",
        "  ... SGLang starting (40 s): warming up (SGLang's own first request runs through the model)",
        # the tail is all probes and a CUDA warning now: the phase stays where the log last said it was
        "  ... SGLang starting (50 s): warming up (SGLang's own first request runs through the model)",
    ]


def test_jsonl_that_cannot_be_written_is_one_line_before_any_server(tmp_path, monkeypatch, capsys):
    monkeypatch.setattr(demo, "_exit_on_sigterm", lambda: None)  # leave this process's SIGTERM alone
    monkeypatch.setattr(demo, "_run", lambda *a: pytest.fail("a server was started"))
    blocker = tmp_path / "a-file"
    blocker.write_text("")
    for jsonl, message in (
        (blocker / "records.jsonl", f"cannot create folder {blocker}: File exists"),
        (tmp_path, f"cannot write {tmp_path}: Is a directory"),
    ):
        assert main.main(["demo", "--jsonl", str(jsonl)]) == 1
        out, err = capsys.readouterr()
        assert out == "" and err == f"sglang-mmtrace demo: {message}\n"


def test_sglang_log_is_removed_after_a_good_run_and_kept_otherwise(tmp_path, monkeypatch, capsys):
    """The demo leaves no trace in the temporary folder after a run that ended well; a failed run
    keeps SGLang's log (where the reason is), and --log PATH always keeps it."""
    monkeypatch.setattr(demo, "_exit_on_sigterm", lambda: None)  # leave this process's SIGTERM alone
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    logs: list[str] = []

    def fake_run(rc):
        return lambda args, jsonl, log, info: logs.append(log) or rc

    monkeypatch.setattr(demo, "_run", fake_run(0))
    assert main.main(["demo"]) == 0
    assert not os.path.exists(logs[-1]) and list(tmp_path.iterdir()) == []
    assert "now removed: --log PATH keeps it" in capsys.readouterr().out
    monkeypatch.setattr(demo, "_run", fake_run(1))
    assert main.main(["demo"]) == 1
    assert os.path.exists(logs[-1]) and f"SGLang's log: {logs[-1]}" in capsys.readouterr().out
    kept = tmp_path / "kept" / "sglang.log"
    kept.parent.mkdir()
    kept.write_text("")
    monkeypatch.setattr(demo, "_run", fake_run(0))
    assert main.main(["demo", "--log", str(kept)]) == 0 and logs[-1] == str(kept) and kept.exists()
