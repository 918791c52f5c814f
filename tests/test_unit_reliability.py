"""The plugin's own failure paths without a server: full disk, unopenable files, logged once, manifest override."""

from __future__ import annotations

import json
import logging
import os

import pytest

from sglang_mmtrace import telemetry
from sglang_mmtrace.manifest import load
from sglang_mmtrace.plugin import multi_tokenizer_warning, tokenizer_workers
from sglang_mmtrace.sinks.jsonl import JsonlSink


@pytest.fixture(autouse=True)
def fresh_counters():
    saved = (telemetry.dropped.copy(), set(telemetry._logged))
    telemetry.dropped.clear()
    telemetry._logged.clear()
    yield
    telemetry.dropped.clear()
    telemetry.dropped.update(saved[0])
    telemetry._logged.clear()
    telemetry._logged.update(saved[1])


def test_jsonl_on_a_full_device_drops_counts_and_logs_once(caplog):
    if not os.path.exists("/dev/full"):
        pytest.skip("no /dev/full on this system")
    sink = JsonlSink("/dev/full")
    with caplog.at_level(logging.WARNING, logger="sglang_mmtrace"):
        for i in range(5):
            sink.emit({"rid": str(i)})
    sink.close()
    assert telemetry.dropped["jsonl"] == 5
    assert len([r for r in caplog.records if "jsonl dropped" in r.getMessage()]) == 1


def test_jsonl_short_write_leaves_no_half_line(tmp_path, monkeypatch):
    path = tmp_path / "r.jsonl"
    sink = JsonlSink(str(path))
    sink.emit({"rid": "a"})
    real_write = os.write
    monkeypatch.setattr(os, "write", lambda fd, data: real_write(fd, data[:7]))  # the disk fills mid-record
    sink.emit({"rid": "b", "pad": "x" * 100})
    monkeypatch.setattr(os, "write", real_write)
    sink.emit({"rid": "c"})
    sink.close()
    assert [json.loads(line)["rid"] for line in path.read_text().splitlines()] == ["a", "c"]
    assert telemetry.dropped["jsonl"] == 1


def test_jsonl_unopenable_path_raises_oserror_for_the_plugin_to_contain():
    with pytest.raises(OSError):
        JsonlSink("/proc/sglang-mmtrace-test/records.jsonl")


def test_manifest_override(tmp_path, monkeypatch):
    path = tmp_path / "m.toml"
    path.write_text('[hooks."x.y"]\ntarget = "a.b.c"\nkind = "sync"\nprocess = "api"\nstages = ["tokenize"]\n')
    monkeypatch.setenv("SGLANG_MMTRACE_MANIFEST", str(path))
    m = load("0.5.23")
    assert m.override == str(path) and [h.hook_id for h in m.hooks] == ["x.y"]
    monkeypatch.delenv("SGLANG_MMTRACE_MANIFEST")
    assert load("0.5.23").override is None


def test_tokenizer_workers_from_argv():
    assert tokenizer_workers(["launch", "--tokenizer-worker-num", "2"]) == 2
    assert tokenizer_workers(["launch", "--tokenizer-worker-num=4"]) == 4
    assert tokenizer_workers(["launch", "--port", "30000"]) == 1


def test_multi_tokenizer_warning_only_outside_the_launcher():
    argv = ["launch", "--tokenizer-worker-num", "2"]
    assert "sglang-mmtrace run" in multi_tokenizer_warning(argv, {})
    assert multi_tokenizer_warning(argv, {"SGLANG_MMTRACE_LAUNCHER": "1"}) is None
    assert multi_tokenizer_warning(["launch"], {}) is None
