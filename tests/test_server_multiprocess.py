"""Multiprocess: ``--tokenizer-worker-num 2`` on the real CPU server.

With more than one tokenizer worker, SGLang 0.5.23 serves HTTP from Granian worker processes that
import the app themselves; the plugin's collector lives in the launcher process, so the workers'
requests are not joined into records or traces. The plugin says so in one log line at start, and
``doctor`` lists the limit; this test pins both and what actually happens to the requests (served,
no records). ``--dp 2`` is not tried: the CPU build runs one data-parallel rank.
"""

from __future__ import annotations

import subprocess
import sys
import time

import pytest
from conftest import read_records, start_server
from reliability import chat_body, plugin_lines, post, sse_usage

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
