"""Records at the edges, on a real CPU server: a request whose forward is very slow keeps every stage.

On a GPU the first request after start-up can wait minutes for Triton's JIT compilation. Its first
scheduler events ride an outbox heartbeat to the collector long before its last ones; they must
still join its record. Here the server runs with ``SGLANG_MMTRACE_TEST_STALL`` naming the vision
encoder hook, so every image request's forward stalls for ``STALL_S`` seconds (SGLang's own
start-up warm-up and health checks are text requests; the harness's warm-up image stalls too). The collector's
orphan rule itself is pinned over ten simulated minutes in ``test_unit_collector_process``.
"""

from __future__ import annotations

import time

import pytest
from conftest import records, server_context, start_server, state
from record_checks import stage_set_problems, usage_problems

from sglang_mmtrace.harness import data_url, image_message, make_image, stream_chat

pytestmark = pytest.mark.server

STALL_S = 6.0  # twelve outbox heartbeats, three times the collector's grace period


@pytest.fixture(scope="module")
def slow_server(tmp_path_factory):
    env = {"SGLANG_MMTRACE_TEST_STALL": f"mm_embedding.vision_encoder:{STALL_S}"}
    with start_server(tmp_path_factory, "slow-first", env=env) as srv:
        yield srv


def test_a_request_with_a_stalled_forward_keeps_every_stage(slow_server):
    url = data_url(make_image(512, 512, seed=9301))
    t0 = time.monotonic()
    chunks, usage, _ = stream_chat(slow_server.base_url, [image_message("Edge check: what is this?", [url])])
    elapsed = time.monotonic() - t0
    assert elapsed >= STALL_S, f"the stall did not happen ({elapsed:.1f} s)" + server_context(slow_server)
    rid = chunks[0]["id"]
    rec = records(slow_server, [rid])[rid]
    assert rec["status"] == "ok" and rec["ttft_s"] >= STALL_S, rec["ttft_s"]
    assert stage_set_problems(rec, absent=()) == [], server_context(slow_server)
    assert rec["coverage"] >= 0.95, rec["coverage"]
    assert usage_problems(rec, usage) == []
    dropped = state(slow_server)["api"]["dropped"]
    assert "orphan_events" not in dropped, dropped
