"""Version drift: one stage's target is gone (a manifest naming a function that does not exist).

``SGLANG_MMTRACE_MANIFEST`` points the plugin (and ``doctor``) at a copy of the 0.5.23 manifest
whose ``mm_processor.resize_normalize`` target names a missing method, as a renamed function in a
newer SGLang would. The real server must start and serve; ``mm.resize_normalize`` is absent from the
records while the other stages of an image request are still measured; one plugin log line and
``sglang-mmtrace doctor`` name the hook, its target and the stage.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from importlib import resources

import pytest
from conftest import records, server_context, start_server
from reliability import plugin_lines, send_image_requests, settled_state

pytestmark = pytest.mark.server

HOOK = "mm_processor.resize_normalize"
STAGE = "mm.resize_normalize"
GOOD_TARGET = "sglang.srt.multimodal.processors.qwen_vl.QwenVLImageProcessor.prepare_artifact_batch"
BAD_TARGET = "sglang.srt.multimodal.processors.qwen_vl.QwenVLImageProcessor.prepare_artifact_batch_renamed"
STILL_MEASURED = (
    "request",
    "http.parse",
    "tokenize",
    "mm.process",
    "mm.load",
    "mm.decode",
    "mm.expand",
    "dispatch",
    "scheduler.recv",
    "model.vision_encoder",
    "model.prefill",
    "scheduler.output",
    "detokenize",
)


@pytest.fixture(scope="module")
def manifest(tmp_path_factory):
    text = resources.files("sglang_mmtrace.patches").joinpath("sglang-0.5.23.toml").read_text()
    assert text.count(f'target = "{GOOD_TARGET}"') == 1
    path = tmp_path_factory.mktemp("drift") / "sglang-drifted.toml"
    path.write_text(text.replace(f'target = "{GOOD_TARGET}"', f'target = "{BAD_TARGET}"'))
    return str(path)


@pytest.fixture(scope="module")
def drifted(tmp_path_factory, manifest):
    with start_server(tmp_path_factory, "drift", env={"SGLANG_MMTRACE_MANIFEST": manifest}) as srv:
        yield srv


def test_server_serves_and_the_stage_is_absent(drifted):
    rids = send_image_requests(drifted.port, "drift", 3, seed=7500, size=256, question="Drift test: what is shown?")
    for rid, rec in records(drifted, rids, timeout=60).items():
        names = {s["name"] for s in rec["stages"]}
        assert rec["status"] == "ok", rec
        assert STAGE not in names, f"{rid}: {sorted(names)}"
        missing = [s for s in STILL_MEASURED if s not in names]
        assert not missing, f"{rid}: other stages missing {missing}; has {sorted(names)}" + server_context(drifted)
    st = settled_state(drifted)
    assert st["api"]["errors"] == {}, st  # a hook that was never applied is not a runtime error


def test_one_log_line_names_it(drifted):
    lines = [line for line in plugin_lines(drifted) if HOOK in line]
    assert len(lines) == 1, "\n".join(plugin_lines(drifted))
    assert BAD_TARGET in lines[0] and STAGE in lines[0], lines[0]
    assert any("SGLANG_MMTRACE_MANIFEST" in line for line in plugin_lines(drifted))


def test_doctor_names_the_missing_target(manifest):
    env = {**os.environ, "SGLANG_MMTRACE_MANIFEST": manifest}
    out = subprocess.run(
        [sys.executable, "-m", "sglang_mmtrace.cli.main", "doctor"],
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    lines = out.stdout.splitlines()
    at = lines.index(STAGE)
    block = lines[at + 1 : at + 1 + next(i for i, line in enumerate(lines[at + 1 :]) if not line.startswith(" "))]
    # the stage's targets, one line each (the base processor's generic one resolves)
    assert any(BAD_TARGET in line and "MISSING" in line for line in block), "\n".join(lines[at : at + 4])
    assert f"manifest: {manifest}" in out.stdout
    assert out.returncode == 1, json.dumps({"rc": out.returncode, "stdout": out.stdout[-2000:]})
    resolved = [line for line in lines if line.strip().startswith("-> ") and "MISSING" in line]
    assert len(resolved) == 1, resolved  # every other target still resolves
