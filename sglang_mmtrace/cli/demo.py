"""``sglang-mmtrace demo``: the real SGLang server on the CPU, the plugin on, a printed breakdown.

The reference requests, per round: a new 512x512 PNG; the same image again; a different image
with the same question; the same image with the question first. The plugin's own warnings (e.g.
"OTLP export disabled: ...") go to the server log; the demo repeats them on stderr, so a sink that
is off is seen, not inferred from its missing data.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import sys
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


PLUGIN_MARK = "sglang-mmtrace:"
"""How every line the plugin logs starts (``telemetry.warn``), after the logger's own prefix."""


class PluginLines:
    """The plugin's lines in a growing log file, each message once.

    Reads on from where the last call stopped, whole lines only, so a long ``--serve-only`` run
    does not reread its log; a message repeated later (another process, a new timestamp) is skipped.
    """

    def __init__(self, path: Path | str) -> None:
        self.path = Path(path)
        self.offset = 0
        self.seen: set[str] = set()

    def new(self) -> list[str]:
        try:
            with self.path.open("rb") as f:
                f.seek(self.offset)
                chunk = f.read()
        except FileNotFoundError:
            return []
        complete = chunk[: chunk.rfind(b"\n") + 1]
        self.offset += len(complete)
        out = []
        for line in complete.decode(errors="replace").splitlines():
            at = line.find(PLUGIN_MARK)
            if at >= 0 and line[at:] not in self.seen:
                self.seen.add(line[at:])
                out.append(line.strip())
        return out

    def relay(self) -> None:
        for line in self.new():
            print(f"server log: {line}", file=sys.stderr, flush=True)


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
        assert server.log_path is not None  # chosen by start()
        plugin_lines = PluginLines(server.log_path)
        plugin_lines.relay()
        try:
            if args.serve_only:
                print("serving until interrupted (Ctrl-C)", flush=True)
                try:
                    while server.process is not None and server.process.poll() is None:
                        time.sleep(1.0)
                        plugin_lines.relay()
                except KeyboardInterrupt:
                    pass
                return 0
            kinds = run_reference(server.base_url, args.rounds)
            found = RecordsTail(jsonl, from_start=True).wait(kinds)
        finally:
            plugin_lines.relay()
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
