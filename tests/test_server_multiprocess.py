"""Multiprocess: ``--tokenizer-worker-num 2`` on the real CPU server.

With more than one tokenizer worker, SGLang 0.5.23 serves HTTP from Granian worker processes that
import the app themselves; the plugin's collector lives in the launcher process, so the workers'
requests are not joined into records or traces. The plugin says so in one log line at start, and
``doctor`` lists the limit; this test pins both and what actually happens to the requests (served,
no records). With ``--dp-size 2`` the API process stays one and two schedulers report to its
collector: each request's record and spans are joined from the scheduler that served it.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time

import pytest
from conftest import read_records, records, start_server, state
from peers.otlp_receiver import OtlpReceiver
from reliability import chat_body, plugin_lines, post, send_image_requests, sse_usage

from sglang_mmtrace.cli.demo import DEMO_SERVER_ARGS
from sglang_mmtrace.config import Config

pytestmark = pytest.mark.server


def test_doctor_lists_the_limit():
    out = subprocess.run(
        [sys.executable, "-m", "sglang_mmtrace.cli.main", "doctor"], capture_output=True, text=True, timeout=300
    )
    assert "--tokenizer-worker-num > 1: not supported" in out.stdout, out.stdout[-2000:]


@pytest.fixture(scope="module")
def workers2(tmp_path_factory):
    args = (*DEMO_SERVER_ARGS, "--tokenizer-worker-num", "2")
    with start_server(tmp_path_factory, "tokenizer-workers-2", server_args=args) as srv:
        yield srv


def test_two_tokenizer_workers_serve_warn_once_and_say_what_is_recorded(workers2):
    rids = [f"tw2-{k}-{time.time_ns()}" for k in range(6)]
    for rid in rids:
        status, raw = post(workers2.port, chat_body(rid, "Tokenizer workers: say something short."))
        assert status == 200 and sse_usage(raw), raw[:300]
    time.sleep(Config.from_env().grace_s + 3)
    recorded = {r["rid"] for r in read_records(workers2.jsonl_path)} & set(rids)
    print(f"--tokenizer-worker-num 2: {len(recorded)} of {len(rids)} requests recorded")
    warnings = [line for line in plugin_lines(workers2) if "--tokenizer-worker-num 2" in line]
    assert len(warnings) == 1, "\n".join(plugin_lines(workers2))
    assert not recorded, f"records joined after all ({len(recorded)}): the warning and README are wrong"


# -- --dp-size 2: two scheduler processes behind one API process ---------------------------------


@pytest.fixture(scope="module")
def dp2(tmp_path_factory):
    receiver = OtlpReceiver()
    receiver.start_http()
    # The CPU backend wants a core set per rank when ranks outnumber NUMA nodes (one here): one core each.
    cores = max(2, os.cpu_count() or 2)
    bind = f"0-{cores // 2 - 1}|{cores // 2}-{cores - 1}"
    env = {
        "SGLANG_MMTRACE_OTLP_ENDPOINT": f"http://127.0.0.1:{receiver.http_port}",
        "SGLANG_CPU_OMP_THREADS_BIND": bind,
    }
    args = (*DEMO_SERVER_ARGS, "--dp-size", "2")
    try:
        with start_server(tmp_path_factory, "dp-2", env=env, server_args=args) as srv:
            yield srv, receiver
    finally:
        receiver.stop()


def test_two_data_parallel_schedulers_join_per_request(dp2):
    """Each record joins the stages of the scheduler that served it, and its spans carry that pid."""
    srv, receiver = dp2
    rids = send_image_requests(srv.port, "dp2", 8, seed=7700, size=64, question="Data parallel: what is shown?")
    recs = records(srv, rids, timeout=60)
    schedulers = {int(key.partition(":")[2]) for key in state(srv)["peers"] if key.startswith("scheduler:")}
    assert len(schedulers) == 2, f"scheduler peers: {list(state(srv)['peers'])}"
    used: set[int] = set()
    for rid in rids:
        rec = recs[rid]
        names = {s["name"] for s in rec["stages"]}
        assert rec["status"] == "ok" and {"scheduler.queue", "model.forward", "model.vision_encoder"} <= names, rec
        assert rec["coverage"] >= 0.9, rec["coverage"]
        deadline = time.monotonic() + 60
        while len(spans := [s for s in receiver.snapshot() if s.trace_id == rec["trace_id"]]) < len(rec["stages"]):
            assert time.monotonic() < deadline, f"{rid}: {len(spans)} of {len(rec['stages'])} spans"
            time.sleep(0.2)
        pids = {s.resource.get("process.pid") for s in spans if s.resource.get("sglang.process") == "scheduler"}
        assert len(pids) == 1 and pids <= schedulers, f"{rid}: scheduler spans from pids {pids}, peers {schedulers}"
        used |= pids
    print(f"--dp-size 2: {len(recs)} of {len(rids)} records; requests per scheduler pid: {sorted(used)}")
    assert used == schedulers, (
        f"scheduler spans name only pid(s) {used} of {schedulers}: the requests all went to one scheduler, or"
        " the spans carry a pid other than that of the scheduler that served them"
    )
