"""Chunked prefills in mixed batches, on a real CPU server: each stage still comes once per request.

With ``--enable-mixed-chunk`` a prefill batch also carries the running requests' decode steps, and
with the overlap scheduler a request's first decode step can be launched before its last chunk's
result (its first token) is processed. Here the chunks are 128 tokens and twelve image requests of
different prompt lengths run at once, so chunks and decode steps share batches.
"""

from __future__ import annotations

import math
import threading

import pytest
from conftest import records, server_context, start_server
from record_checks import bounds_problems, one, order_problems, usage_problems

from sglang_mmtrace.cli.demo import DEMO_SERVER_ARGS
from sglang_mmtrace.harness import data_url, image_message, make_image, stream_chat

pytestmark = pytest.mark.server

CHUNK = 128
REQUESTS = 12


@pytest.fixture(scope="module")
def mixed_server(tmp_path_factory):
    args = [*DEMO_SERVER_ARGS, "--chunked-prefill-size", str(CHUNK), "--enable-mixed-chunk"]
    with start_server(tmp_path_factory, "mixed-chunk", server_args=args) as srv:
        yield srv


def test_chunked_prefills_in_mixed_batches_keep_one_interval_per_stage(mixed_server):
    """Before, a request's first decode step in a mixed batch was taken for one more chunk of its
    prefill: its ``scheduler.overlap_wait`` ran past the request's TTFT (23 of 24 records in the
    probe that found it). ``records`` also fails on a stage repeated in a record."""
    out: dict[str, dict] = {}

    def send(k: int) -> None:
        question = f"Mixed chunk {k}: " + "word " * (40 * (k % 4))
        messages = [image_message(question, [data_url(make_image(256, 256, seed=9400 + k))])]
        chunks, usage, _ = stream_chat(mixed_server.base_url, messages, max_tokens=16)
        out[chunks[0]["id"]] = usage

    threads = [threading.Thread(target=send, args=(k,)) for k in range(REQUESTS)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(out) == REQUESTS, server_context(mixed_server)
    found = records(mixed_server, out)
    chunked = 0
    for rid, usage in out.items():
        rec = found[rid]
        problems = bounds_problems(rec) + order_problems(rec) + usage_problems(rec, usage)
        assert not problems, f"{rid}: {problems}"
        uncached = rec["prompt_tokens"] - rec["cached_tokens"]
        forward = one(rec, "model.forward")
        # a mixed batch's prefill budget is what its decode rows leave: at least this many chunks
        assert forward["attrs"].get("chunks", 1) >= math.ceil(uncached / CHUNK), f"{rid}: {forward}"
        chunked += uncached > CHUNK
    assert chunked >= REQUESTS // 2  # every prompt holds a 64-token image: most need two chunks or more
