"""The offline ``sglang.Engine`` on the CPU: image prompts through ``generate`` and ``async_generate``.

The Engine runs in a child process (``harness.engine``) with the CPU harness's flags and environment,
the plugin loaded by the Engine itself. Each request gets one record whose root stage starts at the
call (no ``http.*`` stages, no ``response.first_chunk``: the root ends at the first output's arrival),
with the scheduler's and detokenizer's stages joined, and SGLang's own token counts.
"""

from __future__ import annotations

import json
import subprocess
import sys
from collections import Counter

import pytest
from conftest import read_records

from sglang_mmtrace.cli.demo import DEMO_SERVER_ARGS
from sglang_mmtrace.harness import CpuServer

pytestmark = pytest.mark.server


@pytest.fixture(scope="module")
def engine_run(tmp_path_factory):
    folder = tmp_path_factory.mktemp("engine")
    srv = CpuServer(jsonl_path=folder / "records.jsonl", server_args=DEMO_SERVER_ARGS, log_path=folder / "engine.log")
    env = srv.prepare()
    out = folder / "calls.json"
    with (folder / "engine.log").open("wb") as log:
        proc = subprocess.run(
            [sys.executable, "-m", "sglang_mmtrace.harness.engine", str(out), "--", *srv.server_flags()],
            env=env, stdout=log, stderr=subprocess.STDOUT, timeout=900,
        )  # fmt: skip
    srv.release_tmp()
    assert not srv.plugin_leftovers, f"the plugin left {srv.plugin_leftovers} in the engine's temp folder"
    assert proc.returncode == 0 and out.exists(), f"engine driver failed; log {srv.log_path}:\n{srv.log_tail()}"
    return json.loads(out.read_text())["calls"], read_records(srv.jsonl_path), srv


def _stage(rec: dict, name: str) -> dict:
    return next(s for s in rec["stages"] if s["name"] == name)


def _queued_behind(rec: dict, head: dict) -> float:
    """The share of TTFT a batch item spent waiting for the batch's first item (0 for the first, or
    outside a batch): SGLang tokenizes a batch's items one after the other, each after the previous one
    was dispatched, and no stage covers that wait. Checked to be exactly that wait."""
    if rec is head or rec["arrival_unix_s"] != head["arrival_unix_s"]:
        return 0.0
    dispatched = _stage(head, "dispatch")
    waited = _stage(rec, "tokenize")["start_s"]
    assert waited == pytest.approx(dispatched["start_s"] + dispatched["dur_s"], abs=2e-3), (waited, dispatched)
    return waited / rec["ttft_s"]


def test_every_engine_request_has_one_record_rooted_at_the_call(engine_run):
    calls, recs, srv = engine_run
    by_rid = {r["rid"]: r for r in recs}
    counts = Counter(r["rid"] for r in recs)
    assert [c["kind"] for c in calls] == [
        "new image",
        "same image again",
        "async_generate, new image",
        "batch",
        "batch",
    ]
    batch_head = by_rid[calls[3]["rid"]]
    for call in calls:
        rid = call["rid"]
        assert counts[rid] == 1, f"{rid}: {counts[rid]} records; log {srv.log_path}"
        rec = by_rid[rid]
        names = [s["name"] for s in rec["stages"]]
        assert rec["status"] == "ok" and rec["coverage"] >= 0.95 - _queued_behind(rec, batch_head), rec
        assert not [n for n in names if n.startswith("http.") or n == "response.first_chunk"], names
        assert {"request", "tokenize", "mm.process", "dispatch", "scheduler.recv", "scheduler.queue",
                "model.forward", "detokenize"} <= set(names), names  # fmt: skip
        root = next(s for s in rec["stages"] if s["name"] == "request")
        assert root["start_s"] == 0 and root["dur_s"] == pytest.approx(rec["ttft_s"], abs=1e-6), root
        # the root starts at the generate call and the first output arrives before the call returns
        assert call["t_before"] - 0.05 <= rec["arrival_unix_s"] <= call["t_after"], (call, rec["arrival_unix_s"])
        assert rec["arrival_unix_s"] + rec["ttft_s"] <= call["t_after"] + 0.05
        assert (rec["prompt_tokens"], rec["cached_tokens"], rec["output_tokens"]) == (
            call["prompt_tokens"], call["cached_tokens"], call["completion_tokens"]
        ), (call, rec)  # fmt: skip
        assert [(i["width"], i["height"]) for i in rec["images"]] == [(256, 256)], rec["images"]
    print("engine records:", [(c["kind"], by_rid[c["rid"]]["ttft_s"], by_rid[c["rid"]]["coverage"]) for c in calls])


def test_caches_seen_on_the_repeated_image(engine_run):
    """The same image again: SGLang reports cached prompt tokens, and the record says what the caches did."""
    calls, recs, _ = engine_run
    by_rid = {r["rid"]: r for r in recs}
    first, again = (by_rid[c["rid"]] for c in calls[:2])
    assert first["cache"]["preprocess"] == "miss" and again["cache"]["preprocess"] == "hit", (first, again)
    assert first["cached_tokens"] < again["cached_tokens"] == calls[1]["cached_tokens"], (first, again)
    assert any(s["name"] == "model.vision_encoder" for s in first["stages"])
    assert again["cache"]["image_prefix_hit"] is True, again["cache"]
