"""The NVTX sink while a real torch profiler records (CPU activity, in this process, no NVTX tool):
``follow_profiler`` puts a ``TorchRanges`` in place of the domain, and the ranges the hooks push on
the profiling thread are ``record_function`` ranges of the profiler's Chrome trace.

The profiler records the calls of the thread that started it only; SGLang starts it on the
scheduler thread, between batches or inside ``run_batch`` (step counts), which these tests mirror.
"""

from __future__ import annotations

import gzip
import json
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import torch

from sglang_mmtrace import switch
from sglang_mmtrace.hooks.base import push_batch_range, push_nvtx
from sglang_mmtrace.sinks import nvtx as sink
from sglang_mmtrace.stages import MODEL_FORWARD, MODEL_PREFILL, SCHEDULER_OUTPUT, TOKENIZE

RID = "torch-ranges-rid"


@pytest.fixture(autouse=True)
def no_tool() -> Iterator[None]:
    """This process has no NVTX tool attached: the sink starts with no domain and is put back so."""
    sink.teardown()
    assert sink.domain is None
    yield
    sink.teardown()


def profiler() -> torch.profiler.profile:
    return torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU])


def annotations(prof: torch.profiler.profile, folder: Path) -> list[dict[str, Any]]:
    """The ``user_annotation`` events of the profiler's Chrome trace (what ``/stop_profile`` writes)."""
    path = folder / "trace.json"
    prof.export_chrome_trace(str(path))
    events = json.loads(path.read_text())["traceEvents"]
    return [e for e in events if e.get("cat") == "user_annotation"]


def push(stage: str) -> None:
    assert push_nvtx("test", (stage, lambda *_: RID), None, (), {}) is True


def test_pushed_ranges_are_record_function_ranges_while_the_profiler_records(tmp_path):
    with profiler() as prof:
        sink.follow_profiler()
        assert isinstance(sink.domain, sink.TorchRanges)
        push(MODEL_FORWARD)
        assert push_batch_range("test", MODEL_PREFILL, (RID, "another-rid"))
        sink.pop()
        sink.pop()
        # a coroutine's start/end range opens nothing here (no NVTX tool), so there is nothing to end
        assert push_nvtx("test", (TOKENIZE, lambda *_: RID), None, (), {}, nested=False) is None
        # another thread's ranges are not the profiled thread's
        other = threading.Thread(target=lambda: (push(SCHEDULER_OUTPUT), sink.pop()))
        other.start()
        other.join()
        assert sink.domain._open == []
    sink.follow_profiler()
    assert sink.domain is None

    events = annotations(prof, tmp_path)
    by_name = {e["name"]: e for e in events}
    assert sorted(by_name) == [MODEL_FORWARD, MODEL_PREFILL], events
    outer, inner = by_name[MODEL_FORWARD], by_name[MODEL_PREFILL]
    assert outer["tid"] == inner["tid"]
    assert outer["ts"] <= inner["ts"] and inner["ts"] + inner["dur"] <= outer["ts"] + outer["dur"], events


def test_no_profiler_no_adapter_and_ranges_after_stop_go_nowhere(tmp_path):
    sink.follow_profiler()  # SGLang's start without a torch activity (CUDA_PROFILER, MEM), or one that failed
    assert sink.domain is None
    with profiler() as prof:
        sink.follow_profiler()
        push(MODEL_FORWARD)  # pushed under the profiler ...
        sink.pop()
    sink.follow_profiler()
    assert sink.domain is None
    assert push_nvtx("test", (MODEL_PREFILL, lambda *_: RID), None, (), {}) is None  # ... none after it
    assert [e["name"] for e in annotations(prof, tmp_path)] == [MODEL_FORWARD]


def test_a_range_open_when_the_profiler_stops_closes_without_error(tmp_path):
    # SGLang stops a step-counted profile inside run_batch, whose model.forward range is open then
    with profiler() as prof:
        sink.follow_profiler()
        push(MODEL_FORWARD)
    sink.follow_profiler()
    sink.pop()  # no domain and no adapter left: nothing to pop, and nothing raised
    with profiler():
        sink.follow_profiler()
        sink.pop()  # a range pushed before the profiler started has no handle in the new adapter
        assert sink.domain._open == []
    sink.follow_profiler()
    assert [e["name"] for e in annotations(prof, tmp_path)] == [MODEL_FORWARD]


def test_the_switch_nvtx_part_hides_the_adapter_and_brings_it_back():
    with profiler():
        sink.follow_profiler()
        adapter, generation = sink.domain, switch.generation
        try:
            switch.apply(switch.Setting(True, tuple(p for p in switch.PARTS if p != "nvtx")), generation + 1)
            assert sink.domain is None
        finally:
            switch.apply(switch.Setting(True, switch.PARTS), generation)
        assert sink.domain is adapter
    sink.follow_profiler()
    assert sink.domain is None


def test_the_chrome_trace_sglang_writes_is_gzipped_json_with_the_same_events(tmp_path):
    # /stop_profile writes <profile id>-TP-<rank>.trace.json.gz: the server test reads it the same way
    with profiler() as prof:
        sink.follow_profiler()
        push(MODEL_FORWARD)
        sink.pop()
    sink.follow_profiler()
    path = tmp_path / "p-TP-0.trace.json.gz"
    prof.export_chrome_trace(str(path))
    with gzip.open(path, "rt") as fh:
        names = [e["name"] for e in json.load(fh)["traceEvents"] if e.get("cat") == "user_annotation"]
    assert names == [MODEL_FORWARD]
