"""The NVTX sink under a real NVTX tool: the capture library of ``peers/nvtx_capture.c`` loaded by the
nvtx package's loader, in a fresh Python process (the loader reads ``NVTX_INJECTION64_PATH`` at a
process's first NVTX call, and ``nvtx.get_domain`` caches its answer for the process's life).

The child drives the sink through the hooks' entry points (``push_nvtx``, ``push_batch_range``) for
many requests and every catalogue stage; the test then reads what the tool saw: the strings
registered, the categories named, and every range's message, category and payload.
"""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
from collections import Counter, defaultdict
from pathlib import Path

import pytest
from peers import nvtx as cap

from sglang_mmtrace.sinks.nvtx import DOMAIN, GROUP_COLORS, request_key
from sglang_mmtrace.stages import STAGES

REQUESTS = 1000
ROOT = Path(__file__).resolve().parents[1]

CHILD = """
import hashlib, json, sys
import nvtx
from sglang_mmtrace.hooks.base import push_batch_range, push_nvtx
from sglang_mmtrace.sinks import nvtx as sink
from sglang_mmtrace.stages import STAGES

assert sink.setup(), "no NVTX tool attached in the child"
for i in range(int(sys.argv[1])):
    rid, other = (hashlib.md5(f"{i}{side}".encode()).hexdigest() for side in "ab")
    for name, stage in STAGES.items():
        if stage.batch:  # a batch of two requests
            push_batch_range("test", name, (rid, other))
            sink.pop()
        elif stage.process == "api" and stage.per_image:  # a coroutine's start/end range
            sink.end(push_nvtx("test", (name, lambda *_: rid), None, (), {}, nested=False))
        else:
            push_nvtx("test", (name, lambda *_: rid), None, (), {})
            sink.pop()
print(json.dumps({"registered": nvtx.Domain.get_registered_string.cache_info().currsize}))
"""


def rids(i: int) -> tuple[str, str]:
    a, b = (hashlib.md5(f"{i}{side}".encode()).hexdigest() for side in "ab")
    return a, b


@pytest.fixture(scope="module")
def captured(tmp_path_factory) -> tuple[dict, list[cap.Event]]:
    try:
        lib = cap.build(tmp_path_factory.mktemp("nvtx-lib"))
    except RuntimeError as exc:  # no compiler or no NVTX headers on this machine
        pytest.skip(str(exc))
    out = tmp_path_factory.mktemp("nvtx-capture")
    env = {
        **os.environ,
        cap.INJECTION_ENV: str(lib),
        cap.DIR_ENV: str(out),
        "SGLANG_MMTRACE_NVTX": "1",
        "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")]),
    }
    proc = subprocess.run(
        [sys.executable, "-c", CHILD, str(REQUESTS)], env=env, cwd=ROOT, capture_output=True, text=True, timeout=300
    )
    assert proc.returncode == 0, proc.stderr[-4000:]
    events = [e for e in cap.read_events(out) if e.domain == DOMAIN]
    return json.loads(proc.stdout.strip().splitlines()[-1]), events


def test_registered_strings_stay_within_the_catalogue(captured):
    """After 1,000 requests the domain holds one registered string per stage at most, in the nvtx
    package's cache and as the tool saw them (``"<stage> rid=<rid>"`` messages registered one per range)."""
    child, events = captured
    registered = [e.message for e in events if e.kind == "S"]
    assert len(registered) <= len(STAGES), f"{len(registered)} registered strings, e.g. {registered[-3:]}"
    assert set(registered) <= set(STAGES)
    assert child["registered"] <= len(STAGES), child


def test_ranges_are_named_by_stage_and_carry_the_request_key(captured):
    _, events = captured
    opened = [e for e in events if e.kind in "PB"]
    assert len(opened) == REQUESTS * len(STAGES)
    assert Counter(e.message for e in opened) == {name: REQUESTS for name in STAGES}
    keys = {request_key(rids(i)[0]) for i in range(REQUESTS)}
    single = [e for e in opened if not STAGES[e.message].batch]
    assert {e.payload for e in single} == keys
    assert {e.kind for e in opened if STAGES[e.message].per_image and STAGES[e.message].process == "api"} == {"B"}


def test_a_batch_range_holds_one_mark_per_request_of_the_batch(captured):
    """A batch range has no payload; the marks after its push (same thread, before its pop) name the batch."""
    _, events = captured
    batches: list[tuple[cap.Event, list[cap.Event]]] = []
    for e in events:  # one thread in the child: file order is call order
        if e.kind == "P" and STAGES[e.message].batch:
            batches.append((e, []))
        elif e.kind == "M":
            batches[-1][1].append(e)
    per_request = sum(s.batch for s in STAGES.values())
    assert len(batches) == REQUESTS * per_request
    for n, (rng, marks) in enumerate(batches):
        i = n // per_request
        assert rng.payload is None
        assert [m.message for m in marks] == [rng.message] * 2
        assert [m.payload for m in marks] == [request_key(r) for r in rids(i)]
        assert {m.category for m in marks} == {rng.category} and {m.color for m in marks} == {rng.color}


def test_each_stage_group_is_a_named_category(captured):
    _, events = captured
    named = {e.message: e.id for e in events if e.kind == "C"}
    assert set(named) == set(GROUP_COLORS) and len(set(named.values())) == len(named)
    seen: dict[str, set[int]] = defaultdict(set)
    for e in events:
        if e.kind in "PBM":
            seen[STAGES[e.message].group].add(e.category)
    assert {group: ids for group, ids in seen.items()} == {group: {named[group]} for group in seen}


def test_request_key_is_a_signed_64_bit_digest_of_the_rid():
    """The same key in every process (no per-process salt, unlike ``hash``), inside int64 for the payload."""
    key = request_key("0123456789abcdef0123456789abcdef")
    digest = hashlib.blake2b(b"0123456789abcdef0123456789abcdef", digest_size=8).digest()
    assert key == int.from_bytes(digest, "big", signed=True)
    assert all(-(2**63) <= request_key(f"r{i}") < 2**63 for i in range(1000))
    assert len({request_key(f"r{i}") for i in range(1000)}) == 1000
