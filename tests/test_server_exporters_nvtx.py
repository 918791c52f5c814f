"""NVTX ranges of the real SGLang server, captured by an NVTX injection library (no GPU, no profiler).

``peers/nvtx_capture.c`` is compiled here with gcc against the NVTX v3 headers of the installed
NVIDIA wheel and named in ``NVTX_INJECTION64_PATH``; SGLang's scheduler and detokenizer inherit
the variable, so every process of the server writes its ranges (pid, tid, monotonic time, domain,
message, colour, category, payload) to its own file. Nsight Systems attaches the same way.

The tests compare those ranges with the JSONL records of the same requests: which processes and
threads pushed them, whether they nest, and whether every stage the plugin brackets with a range
shows up with the request's key (``sinks.nvtx.request_key``) as its payload, or on a mark inside
the range for a batch stage.
"""

from __future__ import annotations

import gzip
import json
import threading
import time
import urllib.request
from collections import Counter, defaultdict
from dataclasses import dataclass, replace
from functools import cached_property
from pathlib import Path
from typing import Any

import pytest
from conftest import records, server_context, start_server, state
from peers import nvtx as cap

from sglang_mmtrace.harness import CpuServer, data_url, image_message, make_image, stream_chat
from sglang_mmtrace.sinks.nvtx import DOMAIN, GROUP_COLORS, request_key
from sglang_mmtrace.stages import MODEL_FORWARD, MODEL_PREFILL, MODEL_VISION_ENCODER, STAGES

pytestmark = pytest.mark.server

RECORD_TIMEOUT_S = 120.0
QUESTION = "NVTX test: what is in this image?"

RANGED_STAGES = frozenset(
    name
    for name in STAGES
    if name in ("tokenize", "transport.prepare", "dispatch", "scheduler.prefix_match", "scheduler.output", "detokenize")
    or name.startswith(("mm.", "model."))
)
"""Stages the plugin brackets with an NVTX range for the request (or the batch) it works on."""
PER_IMAGE = ("mm.load", "mm.decode")


@dataclass
class Capture:
    server: CpuServer
    folder: Path
    events: list[cap.Event]  # our domain, from after the startup snapshot
    rids: list[str]
    records: dict[str, dict[str, Any]]
    pids: dict[str, set[int]]  # api / scheduler / detokenizer -> pids
    registered: list[cap.Event]  # every string registered in our domain, start-up included

    def kind_of(self, pid: int) -> str | None:
        return next((k for k, v in self.pids.items() if pid in v), None)

    @cached_property
    def marks(self) -> dict[tuple[int, int], list[int]]:
        """(pid, line) of each opened range -> the keys of the marks made right after it on its thread."""
        out: dict[tuple[int, int], list[int]] = defaultdict(list)
        last: dict[tuple[int, int], cap.Event] = {}
        for e in sorted(self.events, key=lambda e: (e.pid, e.line_no)):
            if e.kind in "PB":
                last[e.pid, e.tid] = e
            elif e.kind == "M" and (host := last.get((e.pid, e.tid))) is not None and host.message == e.message:
                out[host.pid, host.line_no].append(e.payload)
        return out

    def keys_of(self, event: cap.Event) -> list[int]:
        """The request keys a range names: its payload, or a batch range's marks."""
        if isinstance(event.payload, int):
            return [event.payload]
        return self.marks.get((event.pid, event.line_no), [])

    def describe(self, limit: int = 60) -> str:
        lines = [f"{e.kind} pid={e.pid} tid={e.tid} {e.message} payload={e.payload}" for e in self.events[:limit]]
        return f"\ncapture dir {self.folder}; first {limit} of {len(self.events)} events:\n" + "\n".join(lines)


@pytest.fixture(scope="module")
def capture_lib(tmp_path_factory) -> Path:
    return cap.build(tmp_path_factory.mktemp("nvtx-lib"))


@pytest.fixture(scope="module")
def nvtx_capture(tmp_path_factory, capture_lib) -> Capture:
    folder = tmp_path_factory.mktemp("nvtx-capture")
    out = folder / "ranges"
    out.mkdir()
    env = {cap.INJECTION_ENV: str(capture_lib), cap.DIR_ENV: str(out)}
    with start_server(tmp_path_factory, "nvtx-server", env=env) as srv:
        offsets = cap.file_offsets(out)  # startup and SGLang's warmup request are not ours
        a = data_url(make_image(512, 512, seed=9101))
        b, c = data_url(make_image(256, 256, seed=9102)), data_url(make_image(320, 240, seed=9103))
        plan = [
            [image_message(QUESTION, [a])],
            [image_message(QUESTION, [a])],  # repeated image: preprocess and prefix cache hits
            [image_message(QUESTION, [b, c])],  # two images: per-image stages twice
            [{"role": "user", "content": "NVTX test: say something short."}],
        ]
        rids = [stream_chat(srv.base_url, messages, max_tokens=4)[0][0]["id"] for messages in plan]
        # two at once, so the scheduler may batch them (n=2 rids=a,b ranges)
        box: list[str] = []
        d, e = data_url(make_image(256, 256, seed=9104)), data_url(make_image(256, 256, seed=9105))
        threads = [
            threading.Thread(
                target=lambda img=img: box.append(
                    stream_chat(srv.base_url, [image_message(QUESTION, [img])], max_tokens=4)[0][0]["id"]
                )
            )
            for img in (d, e)
        ]
        for t in threads:
            t.start()
        for t in threads:
            t.join(600)
        assert len(box) == 2, "a concurrent request failed" + server_context(srv)
        rids += box
        recs = records(srv, rids, timeout=RECORD_TIMEOUT_S)
        pids: dict[str, set[int]] = defaultdict(set)
        pids["api"].add(srv.process.pid)
        for key in state(srv).get("peers", {}):
            process, _, pid = key.partition(":")
            pids[process].add(int(pid))
        events = [ev for ev in cap.read_events(out, offsets) if ev.domain == DOMAIN and ev.kind in "PBOEM"]
        registered = [ev for ev in cap.read_events(out) if ev.domain == DOMAIN and ev.kind == "S"]
        yield Capture(srv, out, events, rids, recs, dict(pids), registered)


def test_capture_library_builds_and_loads(nvtx_capture):
    """The library was loaded in the server's processes and saw the plugin's domain created."""
    created = [e for e in cap.read_events(nvtx_capture.folder) if e.kind == "D" and e.domain == DOMAIN]
    assert created, f"no process created the {DOMAIN!r} domain" + nvtx_capture.describe()
    assert nvtx_capture.events, "no ranges in the plugin's domain after the requests" + nvtx_capture.describe()


def test_ranges_in_api_scheduler_and_detokenizer(nvtx_capture):
    pids = nvtx_capture.pids
    assert set(pids) >= {"api", "scheduler", "detokenizer"}, pids
    all_pids = [p for v in pids.values() for p in v]
    assert len(all_pids) == len(set(all_pids)) == 3, f"expected three distinct processes: {pids}"
    ranged = Counter(nvtx_capture.kind_of(e.pid) for e in nvtx_capture.events if e.kind in "PB")
    assert None not in ranged, (
        f"ranges from processes that are not the server's: "
        f"{sorted({e.pid for e in nvtx_capture.events if nvtx_capture.kind_of(e.pid) is None})} {pids}"
    )
    for kind in ("api", "scheduler", "detokenizer"):
        assert ranged[kind] > 0, (
            f"no ranges from the {kind} process {pids[kind]}: {dict(ranged)}" + nvtx_capture.describe()
        )


def test_range_names_are_catalogue_stages_of_their_process(nvtx_capture):
    """Messages are stage names (so the registered strings stay within the catalogue however many
    requests pass); a per-request stage's range carries its request's key, a batch stage's range none
    (its marks do)."""
    problems = []
    marks = nvtx_capture.marks
    for e in nvtx_capture.events:
        if e.kind not in "PBM":
            continue
        stage = STAGES.get(e.message)
        if stage is None:
            problems.append(f"range {e.message!r} (pid {e.pid}): not a catalogue stage")
            continue
        kind = nvtx_capture.kind_of(e.pid)
        if stage.process != kind:
            problems.append(f"range {e.message!r} pushed in the {kind} process, the catalogue says {stage.process}")
        if e.kind == "M":
            if not isinstance(e.payload, int):
                problems.append(f"mark {e.message!r} (pid {e.pid}) carries no request key: {e.payload!r}")
        elif stage.batch:
            if e.payload is not None or not marks.get((e.pid, e.line_no)):
                problems.append(
                    f"batch range {e.message!r}: payload {e.payload!r}, marks {marks.get((e.pid, e.line_no))}"
                )
        elif e.message in RANGED_STAGES and not isinstance(e.payload, int):
            problems.append(f"range {e.message!r} (a per-request stage) carries no request key: {e.payload!r}")
    registered = Counter((e.pid, e.message) for e in nvtx_capture.registered)
    outside = sorted({m for _, m in registered} - set(STAGES))
    if outside or any(n > 1 for n in registered.values()):
        problems.append(f"registered strings outside the catalogue {outside[:5]} or twice in a process")
    assert not problems, "\n".join(problems[:40]) + nvtx_capture.describe()


def test_pushed_ranges_nest_per_thread_and_start_end_ranges_close(nvtx_capture):
    problems = []
    stacks: dict[tuple[int, int], list[cap.Event]] = defaultdict(list)
    open_ranges: dict[tuple[int, int], cap.Event] = {}
    for e in sorted(nvtx_capture.events, key=lambda e: (e.pid, e.line_no)):
        key = (e.pid, e.tid)
        if e.kind == "P":
            stacks[key].append(e)
        elif e.kind == "O":
            if not stacks[key]:
                problems.append(f"pop without a push on pid {e.pid} tid {e.tid} (line {e.line_no})")
            else:
                stacks[key].pop()
        elif e.kind == "B":
            if (e.pid, e.id) in open_ranges:
                problems.append(f"range id {e.id} started twice in pid {e.pid}")
            open_ranges[e.pid, e.id] = e
        elif e.kind == "E" and open_ranges.pop((e.pid, e.id), None) is None:
            problems.append(f"end of range id {e.id} that was never started (pid {e.pid})")
    for (pid, tid), stack in stacks.items():
        if stack:
            problems.append(f"pid {pid} tid {tid}: ranges pushed and never popped: {[x.message for x in stack]}")
    for ev in open_ranges.values():
        problems.append(f"start/end range never ended: {ev.message!r} (pid {ev.pid})")
    assert not problems, "\n".join(problems[:40]) + nvtx_capture.describe()
    # nested pushes really happened (e.g. mm.* inside mm.process, model.* inside model.forward)
    depths = [e.id for e in nvtx_capture.events if e.kind == "P"]
    assert depths and max(depths) >= 2, f"no nested push at all: depths {Counter(depths)}"


def test_every_ranged_stage_of_every_record_has_its_range(nvtx_capture):
    rid_of = {request_key(rid): rid for rid in nvtx_capture.rids}
    by_rid: dict[str, Counter[str]] = defaultdict(Counter)
    unknown = set()
    for e in nvtx_capture.events:
        if e.kind in "PB":
            for key in nvtx_capture.keys_of(e):
                if key in rid_of:
                    by_rid[rid_of[key]][e.message] += 1
                else:
                    unknown.add(key)
    assert not unknown, (
        f"ranges name request keys that are not the records' rids': {sorted(unknown)[:10]}" + nvtx_capture.describe()
    )
    problems = []
    for rid, rec in nvtx_capture.records.items():
        in_record = Counter(s["name"] for s in rec["stages"] if not s["attrs"].get("skipped"))  # markers: no work
        for stage, n in sorted(in_record.items()):
            if stage not in RANGED_STAGES:
                continue
            got = by_rid[rid][stage]
            if got == 0:
                problems.append(f"rid {rid}: record has {stage}, no range names this rid")
            elif stage in PER_IMAGE and got != n:
                problems.append(f"rid {rid}: {n} {stage} stages in the record, {got} ranges")
        for stage in by_rid[rid]:
            if stage in RANGED_STAGES and stage not in in_record and not STAGES[stage].batch:
                problems.append(f"rid {rid}: a {stage} range but no {stage} stage in the record")
    assert not problems, "\n".join(problems) + nvtx_capture.describe(200)
    images = {rid: len(rec["images"]) for rid, rec in nvtx_capture.records.items()}
    assert sorted(images.values()) == [0, 1, 1, 1, 1, 2], images  # the plan above, so the check covers both


def test_batch_stages_carry_the_batch_rids(nvtx_capture):
    """Batch stages (one forward / output pass for several requests) name the batch: one mark per request."""
    opened = [e for e in nvtx_capture.events if e.kind in "PB"]
    batch = {e.message for e in opened if e.payload is None and nvtx_capture.keys_of(e)}
    assert {"scheduler.output", "detokenize", "model.prefill", "model.forward"} <= batch, batch
    assert all(STAGES[s].batch for s in batch), batch
    single = {e.message for e in opened if isinstance(e.payload, int)}
    assert not single & {s for s in STAGES if STAGES[s].batch}, f"batch stages with a single request key: {single}"


def test_per_image_stages_run_off_the_api_main_thread(nvtx_capture):
    api = nvtx_capture.pids["api"]
    per_image = [e for e in nvtx_capture.events if e.kind in "PB" and e.message in PER_IMAGE]
    assert {e.message for e in per_image} == set(PER_IMAGE), Counter(e.message for e in per_image)
    assert all(e.pid in api for e in per_image), {(e.message, e.pid) for e in per_image}
    on_main = [e.message for e in per_image if e.tid == e.pid]
    assert not on_main, f"per-image ranges on the api main thread (tid == pid): {on_main}"


def test_one_colour_and_one_category_per_stage_group(nvtx_capture):
    colours: dict[str, set[str | None]] = defaultdict(set)
    categories: dict[str, set[int]] = defaultdict(set)
    for e in nvtx_capture.events:
        if e.kind in "PB" and e.message in STAGES:
            colours[STAGES[e.message].group].add(e.color)
            categories[STAGES[e.message].group].add(e.category)
    assert all(len(v) == 1 and 0 not in v for v in categories.values()), dict(categories)
    assert set(categories) <= set(GROUP_COLORS)
    assert all(len(v) == 1 and None not in v for v in colours.values()), dict(colours)
    groups = [g for g in ("mm", "transport", "scheduler", "model") if g in colours]
    assert len(groups) == 4, f"ranges seen only for the groups {sorted(colours)}"
    picked = [next(iter(colours[g])) for g in groups]
    assert len(set(picked)) == len(picked), dict(zip(groups, picked, strict=True))


def _post(url: str, body: dict[str, Any] | None = None) -> None:
    data = json.dumps(body).encode() if body is not None else b""
    request = urllib.request.Request(url, data=data, headers={"Content-Type": "application/json"}, method="POST")
    with urllib.request.urlopen(request, timeout=RECORD_TIMEOUT_S) as response:
        assert response.status == 200, response.read()


def test_scheduler_stages_are_torch_profiler_ranges_while_sglang_profiles(nvtx_capture, tmp_path):
    """SGLang's ``/start_profile`` (torch profiler, CPU activity): the stages pushed on the scheduler
    thread are ``record_function`` ranges of the trace ``/stop_profile`` writes, and still NVTX ranges
    meanwhile; after the stop, the NVTX domain has them again and the trace nothing more."""
    srv = nvtx_capture.server
    offsets = cap.file_offsets(nvtx_capture.folder)
    body = {"output_dir": str(tmp_path), "activities": ["CPU"], "with_stack": False, "record_shapes": False}
    _post(f"{srv.base_url}/start_profile", body)
    image = data_url(make_image(384, 256, seed=9106))
    profiled = stream_chat(srv.base_url, [image_message(QUESTION, [image])], max_tokens=4)[0][0]["id"]
    _post(f"{srv.base_url}/stop_profile")
    deadline = time.monotonic() + RECORD_TIMEOUT_S
    while not (traces := sorted(tmp_path.glob("*.trace.json.gz"))) and time.monotonic() < deadline:
        time.sleep(0.2)  # the scheduler writes the trace before it answers; this only bounds a slow disk
    assert len(traces) == 1, f"trace files in {tmp_path}: {traces}" + server_context(srv)
    other = data_url(make_image(384, 256, seed=9107))  # a new image: the encoder runs again
    after = stream_chat(srv.base_url, [image_message(QUESTION, [other])], max_tokens=4)[0][0]["id"]
    records(srv, [profiled, after], timeout=RECORD_TIMEOUT_S)

    with gzip.open(traces[0], "rt") as fh:
        events = json.load(fh)["traceEvents"]
    traced = Counter(e["name"] for e in events if e.get("cat") == "user_annotation" and e["name"] in STAGES)
    capture = replace(
        nvtx_capture, events=[e for e in cap.read_events(nvtx_capture.folder, offsets) if e.domain == DOMAIN]
    )
    scheduler_pids = capture.pids["scheduler"]
    pushed: dict[str, set[str]] = defaultdict(set)  # rid -> the stages pushed for it in the scheduler
    for e in capture.events:
        if e.kind == "P" and e.pid in scheduler_pids:
            for rid in (profiled, after):
                if request_key(rid) in capture.keys_of(e):
                    pushed[rid].add(e.message)
    assert {MODEL_FORWARD, MODEL_PREFILL, MODEL_VISION_ENCODER} <= pushed[profiled], dict(pushed)
    assert set(traced) == pushed[profiled], (
        f"torch trace {dict(traced)}, NVTX ranges of the profiled request {sorted(pushed[profiled])}"
        + capture.describe()
    )
    # the NVTX domain is the sink's again after the stop (the torch adapter passed every range on)
    assert pushed[after] == pushed[profiled], dict(pushed)
