"""``sglang-mmtrace demo``: the real SGLang server on the CPU, the plugin on, a printed breakdown.

The reference requests, per round: a new 512x512 PNG; the same image again; a different image
with the same question; the same image with the question first.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import tempfile
import time
from pathlib import Path
from typing import Any

from ..bench.records import RecordsTail
from ..report.analysis import format_table, quantile, summarize

QUESTION = "What is in this image?"
DEMO_SERVER_ARGS = ("--mm-preprocess-cache-size-mb", "64")
KINDS = ("new image", "same image again", "different image, same question", "same image, question first")


def reference_requests(round_no: int) -> list[tuple[str, list[dict[str, Any]]]]:
    from ..harness import data_url, image_message, make_image

    a = data_url(make_image(512, 512, seed=1000 + 2 * round_no))
    b = data_url(make_image(512, 512, seed=1001 + 2 * round_no))
    return [
        (KINDS[0], [image_message(QUESTION, [a], image_first=True)]),
        (KINDS[1], [image_message(QUESTION, [a], image_first=True)]),
        (KINDS[2], [image_message(QUESTION, [b], image_first=True)]),
        (KINDS[3], [image_message(QUESTION, [a], image_first=False)]),
    ]


def run_reference(base_url: str, rounds: int) -> dict[str, str]:
    """Send the reference requests; returns rid -> kind (the response id is SGLang's rid)."""
    from ..harness import stream_chat

    kinds: dict[str, str] = {}
    for r in range(rounds):
        for kind, messages in reference_requests(r):
            chunks, _, _ = stream_chat(base_url, messages, max_tokens=4)
            kinds[chunks[0]["id"]] = kind
    return kinds


def _exit_on_sigterm() -> None:
    """SIGTERM unwinds like Ctrl-C, so the server (in its own session) is stopped, not orphaned."""

    def handler(signum: int, frame: Any) -> None:
        raise SystemExit(128 + signum)

    signal.signal(signal.SIGTERM, handler)


def run(args: argparse.Namespace) -> int:
    from ..harness import CpuServer

    _exit_on_sigterm()
    jsonl = args.jsonl or os.path.join(tempfile.mkdtemp(prefix="mmtrace-demo-"), "records.jsonl")
    Path(jsonl).parent.mkdir(parents=True, exist_ok=True)
    print(f"starting SGLang on the CPU (tiny Qwen3-VL, plugin on); records -> {jsonl}", flush=True)
    with CpuServer(port=args.port, jsonl_path=jsonl, server_args=DEMO_SERVER_ARGS) as server:
        print(f"server healthy at {server.base_url} after {server.startup_seconds:.1f} s", flush=True)
        if args.serve_only:
            print("serving until interrupted (Ctrl-C)", flush=True)
            try:
                while server.process is not None and server.process.poll() is None:
                    time.sleep(1.0)
            except KeyboardInterrupt:
                pass
            return 0
        kinds = run_reference(server.base_url, args.rounds)
        found = RecordsTail(jsonl, from_start=True).wait(kinds)
    ours = list(found.values())
    kind_of = {rec["rid"]: kinds[rid] for rid, rec in found.items()}
    summary = summarize(ours, group=lambda r: kind_of[r["rid"]])
    summary = {k: summary[k] for k in KINDS if k in summary}
    if args.json:
        print(json.dumps(summary, indent=2))
    else:
        print()
        print(format_table(summary))
        covs = sorted(r["coverage"] for r in ours if r["status"] == "ok")
        if covs:
            print(f"coverage over {len(covs)} reference requests: min {covs[0]:.3f}, median {quantile(covs, 0.5):.3f}")
    return 0
