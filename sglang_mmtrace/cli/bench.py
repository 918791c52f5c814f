"""``sglang-mmtrace bench``: run experiments, print a table, write the JSONL that ``report`` reads.

Each output line is the plugin's record of one measured request plus a ``bench`` key
(experiment, variant, client TTFT/e2e, ok, error, usage tokens, ...); requests without a record
(failed, plugin off, no ``--records``) still get a line.

A ``--url`` is asked GET /health before any request: one that does not answer 200 (nothing
listening, a server still starting) ends the run there, in one line on stderr with exit status 1, as
does a ``--records`` file that cannot be read. A run whose every measured request failed (a server
that rejects every request) measured nothing: the table and ``--out`` are still written, to show the
errors, and the exit status is 1 with a one-line reason on stderr. A server without the plugin's
switch and an ``--out`` that cannot be written also end in one line and exit 1, not a traceback.
"""

from __future__ import annotations

import argparse
import datetime as _dt
import http.client
import json
import secrets
import shlex
import sys
from collections import Counter
from pathlib import Path
from typing import Any

from ..bench import ALL
from ..bench.client import host_port
from ..bench.experiments import (
    CONCURRENCY_DEFAULT,
    OVERHEAD_ROUNDS_CPU,
    OVERHEAD_ROUNDS_GPU,
    PER_TARGET,
    RESOLUTION_ASPECTS,
    RESOLUTION_SIZES,
    THROUGHPUT_CLIENTS,
    Options,
)
from ..bench.switchctl import SwitchError
from ..harness.server import HEALTH_PROBE_TIMEOUT_S, http_status


def add_arguments(p: argparse.ArgumentParser) -> None:
    t = p.add_argument_group("target (one of)")
    t.add_argument("--url", help="a running server, e.g. http://127.0.0.1:30000")
    t.add_argument("--records", help="that server's SGLANG_MMTRACE_JSONL (on this machine)")
    t.add_argument(
        "--launch",
        action="append",
        default=[],
        metavar="ARGS",
        help="launch a server with these sglang serve args (repeatable; one server at a time; leading KEY=VALUE "
        "words are its environment). No GPU: the real CPU server with the tiny Qwen3-VL plus ARGS. GPU: "
        "python -m sglang.launch_server ARGS (name the model). Default without --url: the CPU demo config",
    )
    t.add_argument(
        "--launcher",
        choices=("auto", "cpu", "gpu"),
        default="auto",
        help="which server --launch starts (default %(default)s: gpu when CUDA is available)",
    )
    p.add_argument("--experiment", action="append", required=True, choices=ALL, help="repeatable")
    p.add_argument(
        "--n",
        type=int,
        default=None,
        help=f"measured requests (rounds) per variant; default 20, resolution 10 rounds, overhead {OVERHEAD_ROUNDS_GPU} "
        f"rounds per kind on a GPU server and {OVERHEAD_ROUNDS_CPU} on a CPU one (its server info's device), "
        "ablation 60 rounds, overhead-crossover 50 rounds per launch",
    )
    p.add_argument("--questions", type=int, default=100, help="order: number of questions (default %(default)s)")
    p.add_argument("--size", default=None, help="image size: N or WxH (default 512; the overhead experiments: 640x480)")
    p.add_argument(
        "--concurrency",
        default=None,
        help=f"concurrency: comma-separated client counts (default {','.join(map(str, CONCURRENCY_DEFAULT))}); "
        f"throughput: the clients (the largest value given; default {THROUGHPUT_CLIENTS})",
    )
    p.add_argument(
        "--sizes",
        default=None,
        metavar="PX,PX,...",
        help=f"resolution: the images' long edges (default {','.join(map(str, RESOLUTION_SIZES))})",
    )
    p.add_argument(
        "--aspects",
        default=None,
        metavar="W:H,...",
        help=f"resolution: aspect ratios, each at every size (default {','.join(RESOLUTION_ASPECTS)})",
    )
    p.add_argument(
        "--warmup",
        type=int,
        default=2,
        help="warm-up requests (rounds for the overhead experiments), excluded (default %(default)s)",
    )
    p.add_argument("--max-tokens", type=int, default=None, help="default 8; throughput 256 (with ignore_eos)")
    s = p.add_argument_group("switch and two-server experiments")
    s.add_argument(
        "--segment-s", type=float, default=25.0, help="throughput: seconds per segment (default %(default)s)"
    )
    s.add_argument("--segments", type=int, default=3, help="throughput: segments per arm (default %(default)s)")
    s.add_argument(
        "--settle-s", type=float, default=2.0, help="throughput: seconds excluded after a flip (default %(default)s)"
    )
    s.add_argument(
        "--gap-ms",
        type=float,
        default=100.0,
        help="overhead/ablation: idle gap between a response's end and the next request, both arms (default %(default)s)",
    )
    s.add_argument(
        "--ablation-groups",
        default=None,
        metavar="G1,G2,...",
        help='ablation: one level per group instead of per part; a group joins parts with "+" (e.g. '
        '"http+tokenizer,mm,scheduler,detokenizer,cuda_events,ship+records+jsonl+prometheus+otlp+nvtx")',
    )
    s.add_argument(
        "--keep-records",
        action="store_true",
        help="overhead/ablation: after a request with records on, wait until its record is built before the next "
        "flip (its record-building then overlaps no other request)",
    )
    s.add_argument("--server-pid", type=int, default=None, help="throughput with --url: the server's API process")
    s.add_argument(
        "--launches",
        type=int,
        default=2,
        help="overhead-crossover: launches per orientation, A/B and A/A (default %(default)s)",
    )
    s.add_argument(
        "--no-aa",
        action="store_true",
        help="overhead: no A/A control arm (by default a second plugin-off request per round and kind, reported as "
        "off again - off: the method's own noise); overhead-crossover: skip the A/A launches",
    )
    s.add_argument(
        "--lead-in",
        action="store_true",
        help="overhead: before each timed request an untimed one of the same arm and kind, so that every timed request "
        "follows one of its own arm, as on a server whose switch is not flipped per request (without it each arm "
        "follows other arms' requests and switch flips, whose carry-over lands unevenly on the arms); doubles the "
        "requests",
    )
    s.add_argument(
        "--sglang-trace-peer",
        action="store_true",
        help="overhead: also an arm with the plugin off and SGLang's own tracing at level 3 (its default), set per "
        "request with GET /set_trace_level (0 for the other arms, 3 again at the end); the server must run with "
        "--enable-trace. Reports SGLang's tracing cost and the plugin's delta over it per kind",
    )
    s.add_argument(
        "--between-windows",
        action="store_true",
        help="overhead: also an arm served between tracing windows: before each of its requests (untimed) the "
        'switch is handed to windows (POST /mmtrace/enabled {"windows": "0.5s/1h"}, another period where a window '
        "is near) whose window is closed then and past the request. Reports its cost, between windows - off, per "
        "kind and whether it is within the A/A's interval: yes where its point estimate lies inside the A/A's "
        "95%% CI and that interval holds 0",
    )
    s.add_argument("--deadline", type=float, default=None, help="epoch seconds: stop sending new requests after it")
    p.add_argument("--seed", type=int, default=None, help="image/question seed (default: random per run)")
    p.add_argument(
        "--timeout", type=float, default=120.0, help="client timeout per request, seconds (default %(default)s)"
    )
    p.add_argument(
        "--records-timeout",
        type=float,
        default=30.0,
        help="how long to wait for records, seconds (default %(default)s)",
    )
    p.add_argument(
        "--no-pause", action="store_true", help="overhead-crossover: leave the idle server running (default: SIGSTOP)"
    )
    p.add_argument("--work-dir", default=None, help="launched servers' logs and records (default: a temp folder)")
    p.add_argument("--out", default=None, help="write the output lines (JSONL) here")
    p.add_argument("--json", action="store_true", help="print the summaries as JSON instead of the table")


def _error(message: str, status: int = 1) -> int:
    print(f"sglang-mmtrace bench: {message}", file=sys.stderr)
    return status


def all_failed(lines: list[dict[str, Any]]) -> str | None:
    """The one-line reason when there were measured requests and every one of them failed, else None."""
    errors = Counter(str(ln["bench"]["error"]).replace("\n", " ") for ln in lines if not ln["bench"]["ok"])
    if not lines or sum(errors.values()) < len(lines):
        return None
    error, n = errors.most_common(1)[0]
    return f"all {len(lines)} requests failed ({n} with {error})"


def unhealthy(url: str) -> str | None:
    """Why ``url`` is no server to measure, in one line; None when its GET /health answers 200.

    Asked before the first request: without it a dead ``--url`` costs every planned request its
    refusal or timeout before the run can say so, and a server still starting fails them."""
    try:
        status = http_status(url, "/health", HEALTH_PROBE_TIMEOUT_S)
    except (OSError, http.client.HTTPException) as exc:
        return (
            f"nothing answers GET {url}/health ({type(exc).__name__}: {exc}); is a server running there? Nothing sent"
        )
    if status != 200:
        return f"GET {url}/health answered HTTP {status}, not 200 (starting, or unhealthy); nothing sent"
    return None


def parse_size(text: str) -> tuple[int, int]:
    w, _, h = text.lower().partition("x")
    return int(w), int(h or w)


def run(args: argparse.Namespace) -> int:
    from ..bench import driver
    from ..bench.summary import format_table, summaries
    from ..bench.targets import configs_from, gpu_available

    if args.url and args.launch:
        return _error("give --url or --launch, not both", 2)
    if args.url:
        try:
            host_port(args.url)
        except ValueError as exc:  # no http:// scheme, a port that is not a number
            return _error(f"--url: {exc}", 2)
    if args.records:
        try:  # a mistyped path would otherwise pass as "no plugin record" for every request
            open(args.records, "rb").close()
        except OSError as exc:
            return _error(
                f"--records {args.records}: {exc.strerror or exc} (it is that server's SGLANG_MMTRACE_JSONL,"
                " which the plugin creates when the server starts)"
            )
    experiments = list(dict.fromkeys(args.experiment))
    url = args.url.rstrip("/") if args.url else None
    if url and any(e in PER_TARGET for e in experiments) and (why := unhealthy(url)):
        return _error(why)
    seed = args.seed if args.seed is not None else secrets.randbits(31)
    opts = Options(
        n=args.n,
        questions=args.questions,
        size=parse_size(args.size) if args.size else None,
        warmup=args.warmup,
        max_tokens=args.max_tokens,
        seed=seed,
        concurrency=tuple(int(c) for c in args.concurrency.split(",") if c.strip()) if args.concurrency else None,
        sizes=tuple(int(c) for c in args.sizes.split(",") if c.strip()) if args.sizes else None,
        aspects=tuple(a.strip() for a in args.aspects.split(",") if a.strip()) if args.aspects else None,
        timeout=args.timeout,
        segment_s=args.segment_s,
        segments=args.segments,
        settle_s=args.settle_s,
        gap_s=args.gap_ms / 1000,
        keep_records=args.keep_records,
        control=not args.no_aa,
        lead_in=args.lead_in,
        peer=args.sglang_trace_peer,
        between=args.between_windows,
        **({"ablation_parts": tuple(args.ablation_groups.split(","))} if args.ablation_groups else {}),
        launches=args.launches,
        aa=not args.no_aa,
        deadline=args.deadline,
    )
    gpu = gpu_available() if args.launcher == "auto" else args.launcher == "gpu"
    st = driver.Settings(
        experiments=experiments,
        opts=opts,
        url=url,
        records=Path(args.records) if args.records else None,
        launch=configs_from(args.launch),
        gpu=gpu,
        records_timeout=args.records_timeout,
        pause_other=not args.no_pause,
        work_dir=Path(args.work_dir) if args.work_dir else None,
        server_pid=args.server_pid,
    )
    started = _dt.datetime.now(_dt.UTC).strftime("%Y-%m-%d %H:%M:%S UTC")
    try:
        outcome = driver.run(st)
    except SwitchError as exc:
        return _error(str(exc).replace("\n", " "))
    except OSError as exc:  # e.g. nothing listening where the switch experiments flip the switch
        return _error(f"{st.url or 'the launched servers'}: {type(exc).__name__}: {exc}")
    if args.out:
        try:
            Path(args.out).parent.mkdir(parents=True, exist_ok=True)
            with open(args.out, "w", encoding="utf-8") as fh:
                for line in outcome.lines:
                    fh.write(json.dumps(line) + "\n")
        except OSError as exc:  # a file where the folder should be, --out a folder, no permission
            what = "write" if exc.filename == args.out else "create folder"
            return _error(f"cannot {what} {exc.filename}: {exc.strerror or exc}")
    sums = summaries(outcome.lines)
    if args.json:
        print(json.dumps({"summaries": sums, "results": outcome.results, "notes": outcome.notes}, indent=2))
    else:
        target = f"{url} (not launched here)" if url else f"servers launched here ({'GPU' if gpu else 'CPU'} launcher)"
        head = [
            f"sglang-mmtrace bench, {started}, seed {seed}; target: {target}",
            f"command: sglang-mmtrace bench {shlex.join(sys.argv[2:]) if sys.argv[1:2] == ['bench'] else ''}".rstrip(),
        ]
        print("\n".join(head))
        print(format_table(sums, outcome.notes))
        if args.out:
            print(f"{len(outcome.lines)} lines -> {args.out}")
    if reason := all_failed(outcome.lines):
        hint = f"{st.url} answered GET /health; its log may say why" if st.url else f"server logs: {st.work_dir}"
        return _error(f"{reason}; {hint}")
    return 0
