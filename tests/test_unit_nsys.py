"""The Nsight Systems reader on real profiles: two H200 runs of ``benchmarks/gpu/gpu_check.sh OUT nsys``
(SGLang 0.5.17, the sqlite export trimmed by ``benchmarks/gpu/trim_nsys_sqlite.py``) and the
plugin's records of the same requests. CI has no GPU; the profiles and records are committed.

One profile has today's payload format (message = stage, request key as the payload, a batch's keys
on marks inside its range); the other predates the request key (its messages name the rids,
``<stage> rid=<rid>``) and pins the reading of old captures. Edge cases of the payload format are
checked on small exports built here."""

from __future__ import annotations

import json
import sqlite3
from collections import Counter
from pathlib import Path

import pytest

from sglang_mmtrace.profiling import nsys
from sglang_mmtrace.profiling.nsys import GPU_COMPARED, compare, read_ranges, records_by_key, summary
from sglang_mmtrace.report.analysis import read_jsonl
from sglang_mmtrace.sinks.nvtx import request_key

RESULTS = Path(__file__).resolve().parents[1] / "benchmarks" / "results"
RUN = RESULTS / "gpu-check-h200-20261130"  # rids in the messages
PAYLOAD_RUN = RESULTS / "nsys-payload-h200-20261207"  # request keys in the payloads


@pytest.fixture(scope="module", params=[PAYLOAD_RUN, RUN], ids=["payload", "rid-in-message"])
def profile(request):
    run = request.param
    return read_ranges(str(run / "nsys_trimmed.sqlite")), read_jsonl(str(run / "records_nsys.jsonl"))


def test_ranges_name_the_records_rids_and_catalogue_stages(profile):
    ranges, records = profile
    keys = {request_key(r["rid"]) for r in records}
    named = [r for r in ranges if r.keys]
    assert named and all(set(r.keys) <= keys for r in named), "a range names a request without a record"
    assert summary(ranges, records)["unknown_stages"] == []
    # the 20 profiled requests: every one has its scheduler and API ranges
    per_stage = Counter(r.stage for r in ranges)
    for stage in ("mm.process", "mm.decode", "model.forward", "model.prefill", "model.sample", "detokenize"):
        assert per_stage[stage] == 20, per_stage


def test_model_ranges_carry_gpu_work_and_api_ranges_do_not(profile):
    ranges, _ = profile
    for r in ranges:
        if r.stage in ("model.forward", "model.prefill", "model.vision_encoder"):
            assert r.gpu, f"{r.stage} {r.rids}: no GPU operation launched inside its range"
            assert all(r.start <= t <= r.end for t, _, _ in r.gpu)
            assert all(s <= e for _, s, e in r.gpu)
        if r.stage in ("mm.decode", "mm.load", "tokenize"):
            assert not r.gpu, f"{r.stage}: CPU-only stage with GPU work {r.gpu[:3]}"


def test_cuda_event_durations_agree_with_the_kernels_in_their_nvtx_range(profile):
    """The acceptance check: CUDA-event stage durations within max(10%, 50 us) of the GPU span."""
    ranges, records = profile
    rows = compare(ranges, records)
    by_stage = Counter(a.stage for a in rows)
    # 5 rounds x (new image, different image) run the encoder; every request runs a prefill
    assert by_stage == {"model.vision_encoder": 10, "model.prefill": 20}, by_stage
    bad = [a for a in rows if not a.ok]
    assert not bad, "\n".join(
        f"{a.stage} {a.rid}: events {a.event_s * 1e3:.3f} ms, kernels {a.kernel_s * 1e3:.3f} ms" for a in bad
    )
    assert set(GPU_COMPARED) == set(by_stage)


def test_prefill_excludes_the_encoder_and_injection_nested_in_the_forward(profile):
    """model.prefill counts only GPU work launched after the nested encoder/embedding ranges: for an
    encoded image that is clearly less than the forward's whole span."""
    ranges, records = profile
    rows = {(a.rid, a.stage): a for a in compare(ranges, records)}
    forwards = {k: r for r in ranges if r.stage == "model.forward" for k in r.keys}
    checked = 0
    for (rid, stage), a in rows.items():
        if stage == "model.prefill" and (rid, "model.vision_encoder") in rows:
            whole = forwards[request_key(rid)].gpu_span_s()
            assert whole is not None and a.kernel_s < whole - rows[(rid, "model.vision_encoder")].kernel_s * 0.5
            checked += 1
    assert checked == 10


@pytest.mark.parametrize("name", ["records_nsys.jsonl", "records_cpu.jsonl"])
def test_h200_records_have_each_stage_once_and_the_slow_first_request_is_complete(name):
    """Issue 16 on the GPU: every 0.5.17 record has one interval per stage (per image where the
    catalogue says so), and the first request after start-up, which waits for Triton's JIT, still
    has all of its stages (it lost its scheduler stages before the outbox/collector fixes)."""
    from record_checks import repeated_stage_problems

    records = read_jsonl(str(RUN / name))
    assert len(records) >= 20
    assert {r["rid"]: p for r in records if (p := repeated_stage_problems(r))} == {}
    slowest = max(records, key=lambda r: r["ttft_s"])
    typical = sorted(r["ttft_s"] for r in records)[len(records) // 2]
    assert slowest["ttft_s"] > 20 * typical  # the JIT-bound first request is in the file
    fullest = max(({s["name"] for s in r["stages"]} for r in records), key=len)  # a new image's stages
    assert {s["name"] for s in slowest["stages"]} == fullest
    assert min(r["coverage"] for r in records) >= 0.99


def test_inputs_that_cannot_be_read_are_one_line_and_exit_1(tmp_path, capsys):
    """A missing or non-sqlite profile, one without the NVTX table or without the plugin's ranges, and a
    records file that cannot be read: one line on stderr each, never a traceback."""
    from sglang_mmtrace.cli.main import main

    text, no_nvtx, no_ranges = tmp_path / "notes.txt", tmp_path / "no_nvtx.sqlite", tmp_path / "no_ranges.sqlite"
    text.write_text("not a database\n" * 100)
    for db_path, table in ((no_nvtx, "TARGET_INFO_GPU (id INTEGER)"),
                           (no_ranges, "NVTX_EVENTS (domainId INTEGER, eventType INTEGER, text TEXT)")):  # fmt: skip
        db = sqlite3.connect(db_path)
        db.execute(f"CREATE TABLE {table}")
        db.close()
    profile = str(RUN / "nsys_trimmed.sqlite")
    cases = [
        (
            [str(tmp_path / "missing.sqlite")],
            f"{tmp_path / 'missing.sqlite'}: not a readable sqlite export (not a file)",
        ),
        ([str(tmp_path)], f"{tmp_path}: not a readable sqlite export (not a file)"),
        ([str(text)], f"{text}: not a readable sqlite export (file is not a database)"),
        ([str(no_nvtx)], f"{no_nvtx}: no NVTX_EVENTS table (was the profile taken with -t nvtx?)"),
        ([profile, "--records", str(tmp_path / "typo.jsonl")], f"{tmp_path / 'typo.jsonl'}: No such file or directory"),
    ]
    for args, message in cases:
        assert main(["nsys", *args]) == 1
        out, err = capsys.readouterr()
        assert out == "" and err == f"sglang-mmtrace nsys: {message}\n"
    # no ranges of the plugin's domain: the (empty) summary, then the reason
    assert main(["nsys", str(no_ranges)]) == 1
    out, err = capsys.readouterr()
    assert out and err == (
        f"sglang-mmtrace nsys: no ranges of the sglang_mmtrace NVTX domain in {no_ranges} (profile with -t cuda,nvtx)\n"
    )


def _export(path: Path, events: list[tuple], kernels: list[tuple[int, int, int, int]]) -> None:
    """A minimal ``nsys export --type sqlite`` of the payload format: the columns the reader uses.

    ``events``: (start, end, eventType, message, thread, domainId, int64 payload); messages go through
    ``StringIds`` as Nsight Systems stores registered strings. ``kernels``: (thread, launch time, GPU
    start, GPU end), one CUDA call and the kernel it launched each.
    """
    db = sqlite3.connect(path)
    db.execute("CREATE TABLE StringIds (id INTEGER PRIMARY KEY, value TEXT)")
    db.execute(
        "CREATE TABLE NVTX_EVENTS (start INT, end INT, eventType INT, text TEXT, globalTid INT, textId INT, "
        "domainId INT, int64Value INT)"
    )
    db.execute("CREATE TABLE CUPTI_ACTIVITY_KIND_RUNTIME (globalTid INT, start INT, correlationId INT)")
    db.execute("CREATE TABLE CUPTI_ACTIVITY_KIND_KERNEL (correlationId INT, globalPid INT, start INT, end INT)")
    strings: dict[str, int] = {}
    for start, end, kind, message, tid, domain, payload in events:
        text_id = strings.setdefault(message, len(strings) + 1)
        db.execute("INSERT OR IGNORE INTO StringIds VALUES (?, ?)", (text_id, message))
        db.execute(
            "INSERT INTO NVTX_EVENTS VALUES (?, ?, ?, NULL, ?, ?, ?, ?)",
            (start, end, kind, tid, text_id, domain, payload),
        )
    for corr, (tid, launch, gpu_start, gpu_end) in enumerate(kernels, 1):
        db.execute("INSERT INTO CUPTI_ACTIVITY_KIND_RUNTIME VALUES (?, ?, ?)", (tid, launch, corr))
        db.execute(
            "INSERT INTO CUPTI_ACTIVITY_KIND_KERNEL VALUES (?, ?, ?, ?)", (corr, tid >> 24 << 24, gpu_start, gpu_end)
        )
    db.commit()
    db.close()


def _record(rid: str, prefill_s: float) -> dict:
    stage = {"name": "model.prefill", "clock": "cuda", "dur_s": prefill_s, "attrs": {}}
    return {"rid": rid, "stages": [stage]}


SCHED, API = (7 << 24) | 70, (5 << 24) | 50  # globalTid: pid in the high bits, as Nsight Systems packs it
MARK, PUSH_POP, START_END, CREATE = nsys.MARK, nsys.PUSH_POP, nsys.START_END, nsys.DOMAIN_CREATE


@pytest.fixture
def payload_profile(tmp_path) -> Path:
    """Two requests batched into one forward (a batch range and its marks), a third one's API range, and
    another domain's range with the same name that the reader must ignore."""
    a, b, c = request_key("rid-a"), request_key("rid-b"), request_key("rid-c")
    path = tmp_path / "payload.sqlite"
    events = [
        (0, None, CREATE, "sglang_mmtrace", SCHED, 1, None),
        (0, None, CREATE, "other", SCHED, 2, None),
        (1000, 9000, PUSH_POP, "model.forward", SCHED, 1, None),
        (1001, None, MARK, "model.forward", SCHED, 1, a),
        (1002, None, MARK, "model.forward", SCHED, 1, b),
        (1100, 8000, PUSH_POP, "model.prefill", SCHED, 1, None),
        (1101, None, MARK, "model.prefill", SCHED, 1, a),
        (1102, None, MARK, "model.prefill", SCHED, 1, b),
        (1150, 1160, PUSH_POP, "model.prefill", SCHED, 2, None),
        (1151, None, MARK, "model.prefill", SCHED, 2, c),
        (500, 700, START_END, "mm.decode", API, 1, c),
    ]
    _export(path, events, [(SCHED, 1200, 2000, 2600), (SCHED, 1300, 2700, 3000)])
    return path


def test_the_payload_format_joins_ranges_to_records_by_request_key(payload_profile):
    ranges = read_ranges(str(payload_profile))
    keys = {r.stage: r.keys for r in ranges}
    assert len(ranges) == 3 and not any(r.rids for r in ranges)  # the other domain's range is not read
    assert keys == {
        "model.forward": (request_key("rid-a"), request_key("rid-b")),
        "model.prefill": (request_key("rid-a"), request_key("rid-b")),
        "mm.decode": (request_key("rid-c"),),
    }
    prefill = next(r for r in ranges if r.stage == "model.prefill")
    assert prefill.gpu_span_s() == pytest.approx(1e-6)  # first kernel start to last kernel end
    rows = compare(ranges, [_record("rid-a", 1.0e-6), _record("rid-c", 0.5)])
    assert [(a.stage, a.rid, a.ok) for a in rows] == [("model.prefill", "rid-a", True)]
    s = summary(ranges, [_record("rid-c", 0.5)])
    assert s["stages"]["mm.decode"]["nvtx_ranges"] == 1 and "model.prefill" not in s["cuda_event_vs_kernels"]


def test_the_cli_reads_a_payload_format_profile(payload_profile, tmp_path, capsys):
    from sglang_mmtrace.cli.main import main

    rec = next(r for r in read_jsonl(str(RUN / "records_nsys.jsonl")) if len(r["stages"]) > 1)  # a whole record
    prefill = next(s for s in rec["stages"] if s["name"] == "model.prefill" and s["clock"] == "cuda")
    prefill["dur_s"] = 1.0e-6
    records = tmp_path / "records.jsonl"
    records.write_text(json.dumps({**rec, "rid": "rid-b"}) + "\n")
    assert main(["nsys", str(payload_profile), "--records", str(records), "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["cuda_event_vs_kernels"]["model.prefill"]["n"] == 1


def test_rids_that_share_a_request_key_are_left_out_of_the_join(monkeypatch):
    monkeypatch.setattr(nsys, "request_key", {"a": 7, "b": 7, "c": 9}.__getitem__)
    recs = [{"rid": r} for r in "abc"]
    assert records_by_key(recs) == {9: {"rid": "c"}}
    assert records_by_key([{"rid": "a"}, {"rid": "a"}]) == {7: {"rid": "a"}}  # the same rid twice is no clash
