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
import shutil
import signal
import sys
import tempfile
import time
from pathlib import Path
from typing import Any, TextIO

from ..bench.records import RecordsTail
from ..report.analysis import format_table, parent_stages, quantile, summarize
from ..stages import ROOT, STAGES

QUESTION = "What is in this image?"
DEMO_SERVER_ARGS = ("--mm-preprocess-cache-size-mb", "64")
KINDS = ("new image", "same image again", "different image, same question", "same image, question first")


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--serve-only", action="store_true", help="leave the server running until interrupted (Ctrl-C)")
    p.add_argument("--port", type=int, default=0, help="the server's port (default %(default)s: a free port)")
    p.add_argument(
        "--jsonl",
        default=None,
        metavar="PATH",
        help="where the server writes its records, kept after the run (default: a temporary file, removed)",
    )
    p.add_argument(
        "--log",
        default=None,
        metavar="PATH",
        help="where SGLang's own log goes, kept after the run (default: a temporary file, removed after a run "
        "that ended well, kept when it did not)",
    )
    p.add_argument(
        "--rounds",
        type=_rounds,
        default=5,
        metavar="N",
        help="rounds of the four reference requests (default %(default)s)",
    )
    p.add_argument("--json", action="store_true", help="print the summary as JSON (the progress goes to stderr)")
    p.add_argument("server_args", nargs="*", help="SGLang server flags for the demo's server, after --")


def _rounds(text: str) -> int:
    """``--rounds``' type: a whole number of at least 1 (no rounds would measure nothing and say nothing)."""
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a whole number") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"{value} is less than 1 (each round sends the four reference requests)")
    return value


def server_args(extra: list[str]) -> tuple[str, ...]:
    """The demo server's SGLang flags: its own, then the user's (given after ``--``; later flags win).

    The server starts under the launcher (``sglang-mmtrace run``), so flags that add processes SGLang
    loads no plugin in (``--tokenizer-worker-num 2``) are traced too."""
    return (*DEMO_SERVER_ARGS, *(a for a in extra if a != "--"))


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


LEGEND = """\
How to read the tables: "share" is the stage's median fraction of a request's TTFT; an indented stage
is part of the stage above it, so its share is inside its parent's (the shares do not add up to 100%).
"n" counts the requests in which the stage appeared: a joined wait (*.inbox_wait) is there only when
the next process had not already started (a gap between the two ends it joins), so it can show n=2 of
5. "cache hits": lookups that hit per cache ("-": no lookup of that kind); prefix_tokens is the part of
the prompt tokens SGLang served from its radix (prefix) cache. "coverage": the part of TTFT the stages
explain."""
TOP_STAGES = 2  # named per request kind in the findings
SKIPPED_MIN_S = 0.5e-3  # a stage a cache skipped is named when it took at least this on a new image
FEW_REQUESTS = 3
"""Findings from fewer requests of a kind than this say they may be noise: the median of one or two
requests is set by any one of them (one slow request, a first-use compile or a GC pause, moves it);
from three on, one outlier cannot set it."""


def legend(stages: list[str]) -> str:
    """``LEGEND`` and, one line each, what the stages the findings name measure, in the stage catalogue's
    words (the findings name stages, the table lists them all; their meaning is not otherwise shown)."""
    width = max((len(s) for s in stages), default=0)
    meaning = [f"  {s:<{width}}  {STAGES[s].covers}" for s in stages]
    return "\n".join([LEGEND, "", "What the stages named below measure:", *meaning] if stages else [LEGEND])


def _leaves(stages: dict[str, dict[str, Any]]) -> dict[str, dict[str, Any]]:
    """The stages of a summary with no child stage in it: their shares do not overlap."""
    parents = parent_stages(stages)
    return {s: v for s, v in stages.items() if s != ROOT and s not in parents}


def findings(summary: dict[str, dict[str, Any]]) -> tuple[list[str], list[str]]:
    """One line per request kind: where its TTFT went, and for the kinds after the first, what the
    caches saved against a new image (the TTFT difference and the stages that did not run); then, from
    fewer than ``FEW_REQUESTS`` requests of a kind, that the figures may be noise. Also the stages the
    lines name, in the order they first appear (the legend says what each measures)."""
    lines: list[str] = []
    named: list[str] = []
    base = summary.get(KINDS[0])
    for kind, g in summary.items():
        if not g.get("n"):
            continue
        top = sorted(_leaves(g["stages"]).items(), key=lambda kv: -kv[1]["share"])[:TOP_STAGES]
        named += [s for s, _ in top]
        where = ", ".join(f"{s} {v['share'] * 100:.0f}%" for s, v in top)
        line = f"{kind}: TTFT {g['ttft_p50'] * 1e3:.1f} ms; most of it in {where}"
        if base is not None and kind != KINDS[0] and base.get("n"):
            delta = g["ttft_p50"] - base["ttft_p50"]
            skipped = [
                (s, v["p50"]) for s, v in _leaves(base["stages"]).items()
                if s not in g["stages"] and v["p50"] >= SKIPPED_MIN_S
            ]  # fmt: skip
            named += [s for s, _ in skipped]
            line += f"; {delta * 1e3:+.1f} ms against a new image"
            if skipped:
                line += " (skipped: " + ", ".join(f"{s} {t * 1e3:.1f} ms" for s, t in skipped) + ")"
            else:
                line += " (nothing skipped)"
        lines.append(line)
    fewest = min((g["n"] for g in summary.values() if g.get("n")), default=FEW_REQUESTS)
    if fewest < FEW_REQUESTS:
        lines.append(
            f"these figures come from {fewest} request{'s' if fewest > 1 else ''} per kind: one slow request moves "
            f"such a median, so they may be noise (--rounds {FEW_REQUESTS} or more)"
        )
    return lines, list(dict.fromkeys(named))


def run_reference(base_url: str, rounds: int) -> dict[str, str]:
    """Send the reference requests; returns rid -> kind (the response id is SGLang's rid)."""
    from ..harness import stream_chat

    kinds: dict[str, str] = {}
    for r in range(rounds):
        for kind, messages in reference_requests(r):
            chunks, _, _ = stream_chat(base_url, messages, max_tokens=4)
            kinds[chunks[0]["id"]] = kind
    return kinds


class StartupProgress:
    """The demo's ``CpuServer(progress=...)``: one line per call saying which start-up phase SGLang is in.

    It prints a phase's words (``harness.StartupPhase``), never a log line: on a CPU the start-up log
    is mostly import warnings that read as errors ("No CUDA runtime is found", "Cannot detect CUDA
    architecture", the ``sglang serve`` example of a deprecation warning), and the full log is one
    path away (the demo prints it when it starts)."""

    def __init__(self, out: TextIO) -> None:
        from ..harness.server import StartupPhase

        self.out = out
        self.phase = StartupPhase()

    def __call__(self, seconds: float, log_tail: str) -> None:
        print(f"  ... SGLang starting ({seconds:.0f} s): {self.phase.update(log_tail)}", file=self.out, flush=True)


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
    _exit_on_sigterm()
    scratch = None if args.jsonl else tempfile.mkdtemp(prefix="mmtrace-demo-")
    jsonl = args.jsonl or os.path.join(scratch, "records.jsonl")
    try:  # the server appends to it: a folder there or no permission shows now, not as missing records
        Path(jsonl).parent.mkdir(parents=True, exist_ok=True)
        open(jsonl, "a").close()
    except OSError as exc:
        what = "write" if str(exc.filename) == jsonl else "create folder"
        print(f"sglang-mmtrace demo: cannot {what} {exc.filename}: {exc.strerror or exc}", file=sys.stderr)
        return 1
    info = sys.stderr if args.json else sys.stdout  # with --json, stdout carries only the JSON
    if args.log:
        log = args.log
    else:  # the start-up's details, for as long as they may be wanted: kept when the run fails
        fd, log = tempfile.mkstemp(prefix="mmtrace-demo-sglang-", suffix=".log")
        os.close(fd)
    print(f"starting SGLang on the CPU (tiny Qwen3-VL, plugin on); records -> {jsonl}", file=info)
    print(f"SGLang's own log (every line; below, only its start-up phase): {log}", file=info, flush=True)
    rc = 1
    try:
        rc = _run(args, jsonl, log, info)
        return rc
    finally:
        if scratch is not None:
            shutil.rmtree(scratch, ignore_errors=True)
            print("(the records were in a temporary folder, now removed: --jsonl PATH keeps them)", file=info)
        else:
            print(f"records: {jsonl}  (sglang-mmtrace report {jsonl})", file=info)
        if args.log or rc != 0:
            print(f"SGLang's log: {log}", file=info)
        else:
            os.unlink(log)
            print("(SGLang's log was a temporary file, now removed: --log PATH keeps it)", file=info)


def _run(args: argparse.Namespace, jsonl: str, log: str, info: TextIO) -> int:
    from ..harness import CpuServer

    flags = server_args(args.server_args)
    progress = StartupProgress(info)
    with CpuServer(
        port=args.port, jsonl_path=jsonl, server_args=flags, log_path=log, launcher=True, progress=progress
    ) as server:
        print(f"server healthy at {server.base_url} after {server.startup_seconds:.1f} s", file=info, flush=True)
        plugin_lines = PluginLines(log)
        plugin_lines.relay()
        try:
            if args.serve_only:
                print("serving until interrupted (Ctrl-C)", file=info, flush=True)
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
        lines, named = findings(summary)
        print()
        print(legend(named))
        print()
        print("What this run found (medians):")
        for line in lines:
            print("- " + line)
    return 0
