"""Server TTFT with the plugin off vs on: two real CPU SGLang servers, requests interleaved A/B.

One launch of ``overhead-crossover`` (``sglang_mmtrace.bench.overhead``): two servers
(``SGLANG_MMTRACE=0`` and ``=1`` with a JSONL sink) run the tiny Qwen3-VL with the same arguments,
started one after the other (``--first``). Each round sends, to each server, ``new_image`` (a new
640x480 JPEG per request: preprocess/embedding/radix cache miss), ``same_image`` (one fixed JPEG:
cache hits) and ``text`` (a new prompt), the leading server alternating by round. One request is in
flight at a time; the idle server is paused. TTFT is measured by the bench's socket client: from
just before the request is written to the first SSE chunk carrying ``choices``; e2e is to the end
of the response.

Per kind: median TTFT off/on, their ratio with a bootstrap interval, the median of the per-round
paired differences (on - off) with a bootstrap 95% interval, and e2e medians. Two instances differ
by themselves: the same-instance ``sglang-mmtrace bench --experiment overhead`` (runtime switch) and
the multi-launch ``--experiment overhead-crossover`` are the estimators to trust.

    python -m benchmarks.ttft_ab --rounds 30
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from sglang_mmtrace.bench.experiments import Options
from sglang_mmtrace.bench.overhead import (
    KINDS,
    MAX_TOKENS,
    Workload,
    paired_plan,
    plugin_vs_client,
    ratio_summary,
    record_check,
    run_launch,
)
from sglang_mmtrace.harness import CpuServer

from ._common import machine

SERVER_ARGS = ("--mm-preprocess-cache-size-mb", "64")


def server_factory(
    jsonl: Path,
    log_dir: Path,
    control: bool = False,
    health_timeout: float = 600.0,
    on_env: dict[str, str] | None = None,
) -> Callable[[str], CpuServer]:
    """arm -> a not-yet-started server; with ``control`` the ``on`` server runs with the plugin off too (A/A)."""

    def make(arm: str) -> CpuServer:
        on = arm == "on"
        return CpuServer(
            plugin_enabled=on and not control,
            jsonl_path=jsonl if on and not control else None,
            server_args=SERVER_ARGS,
            log_path=log_dir / f"server-{arm}.log",
            health_timeout=health_timeout,
            env=on_env if on else None,
        )

    return make


def markdown(result: dict[str, Any]) -> str:
    m, c = result["machine"], result["config"]
    lines = [
        "# TTFT A/B: plugin off vs on (interleaved)",
        "",
        f"{m['date_utc']} UTC; {m['cpus']} CPUs ({m['cpu_model']}), {m['accelerator']}; SGLang {m['sglang']}; "
        f"plugin commit {m['commit']}{' (tree dirty)' if m['plugin_tree_dirty'] else ''}; "
        f"load average at start {m['loadavg_at_start'][0]:.2f}, at end {m['loadavg_at_end'][0]:.2f}.",
        f"{c['rounds']} rounds x {len(KINDS)} kinds x 2 servers (started one after the other, '{c['first']}' first), "
        f"one request in flight, the leading server alternating by round; tiny Qwen3-VL, max_tokens {c['max_tokens']}, "
        f"server args `{' '.join(c['server_args'])}`; "
        + (
            f"the server not being measured was paused (SIGSTOP, resumed {c['settle_ms']:.0f} ms before its request)."
            if c.get("pause_other_server")
            else "both servers ran throughout."
        )
        + (" **A/A control: both servers have the plugin off.**" if c.get("control_aa") else "")
        + (f" Plugin-on server extra env: `{c['on_server_extra_env']}`." if c.get("on_server_extra_env") else ""),
        "",
        "| kind | TTFT off median ms | TTFT on median ms | ratio on/off | delta ms | paired delta median ms [95% CI] | e2e off / on median ms |",
        "|---|---:|---:|---:|---:|---:|---:|",
    ]
    for kind, s in result["kinds"].items():
        ci = s["ttft_paired_delta_ci95_ms"]
        lines.append(
            f"| {kind} | {s['ttft_off_median_ms']:.2f} | {s['ttft_on_median_ms']:.2f} | {s['ttft_ratio_on_off']:.3f} | "
            f"{s['ttft_delta_median_ms']:+.2f} | {s['ttft_paired_delta_median_ms']:+.2f} [{ci[0]:+.2f}, {ci[1]:+.2f}] | "
            f"{s['e2e_off_median_ms']:.1f} / {s['e2e_on_median_ms']:.1f} |"
        )
    if result.get("failed_requests"):
        lines += ["", f"Failed requests (left out of the table): {len(result['failed_requests'])}."]
    pr = result.get("plugin_vs_client", {})
    rc = result.get("records", {})
    lines += [
        "",
        f"Records: {rc.get('on_with_record', 0)} of {rc.get('on_ok', 0)} plugin-on requests. The plugin's own TTFT vs "
        "the client's, medians over the matched requests: "
        + "; ".join(
            f"{k} {v['plugin_ttft_median_ms']:.2f} vs {v['client_ttft_median_ms']:.2f} ms"
            for k, v in pr.items()
            if isinstance(v, dict) and v.get("matched")
        )
        + ".",
        "",
        "Caveats: 2 cores shared by the server being measured (API, scheduler and detokenizer processes; an idle "
        "CPU scheduler polls at about half a core), the client, and any other work on the machine (see the load "
        "averages: anything above 2 means the run was CPU-starved, and TTFT then mostly measures contention); "
        "a toy model, so TTFT is almost all fixed overhead. The hot-path microbenchmark (hotpath.json) gives the "
        "plugin's own cost with far less noise.",
    ]
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rounds", type=int, default=30)
    ap.add_argument("--warmup-rounds", type=int, default=2, help="untimed rounds first (seeds not reused)")
    ap.add_argument("--seed", type=int, default=1234)
    ap.add_argument("--out-dir", default=".", help="folder for ttft_ab.json and ttft_ab.md (default: here)")
    ap.add_argument("--keep-logs", action="store_true", help="keep the server logs and JSONL in a temp folder")
    ap.add_argument(
        "--no-pause",
        action="store_true",
        help="leave the other server running during each request (default: SIGSTOP it, see Pauser)",
    )
    ap.add_argument("--first", choices=("off", "on"), default="off", help="which server starts first")
    ap.add_argument("--settle-ms", type=float, default=100.0, help="wait after resuming a paused server")
    ap.add_argument("--control", action="store_true", help="A/A control: both servers with the plugin off")
    ap.add_argument(
        "--on-env",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="extra environment of the plugin-on server (e.g. SGLANG_MMTRACE_METRICS=0), to bisect the overhead",
    )
    ap.add_argument("--request-timeout", type=float, default=120.0, help="client timeout per request (s)")
    ap.add_argument("--health-timeout", type=float, default=600.0, help="seconds a server may take to become healthy")
    args = ap.parse_args(argv)

    out_dir = Path(args.out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    work = Path(tempfile.mkdtemp(prefix="mmtrace-ttft-ab-"))
    jsonl = work / "records.jsonl"
    info = machine()

    print(f"[ttft_ab] starting the servers one after the other (logs in {work}) ...", flush=True)
    on_env = dict(kv.split("=", 1) for kv in args.on_env)
    make = server_factory(jsonl, work, control=args.control, health_timeout=args.health_timeout, on_env=on_env)
    opts = Options(n=args.rounds, warmup=args.warmup_rounds, seed=args.seed, timeout=args.request_timeout)
    plan = paired_plan("overhead-crossover", args.rounds, args.warmup_rounds, Workload(args.seed, opts.nonce))
    t_start = time.monotonic()
    launch = run_launch(
        make, args.first, plan, opts, pause=not args.no_pause, desc="ttft_ab", settle_s=args.settle_ms / 1000,
        log=lambda msg: print(msg, flush=True),
    )  # fmt: skip
    info["loadavg_at_end"] = list(os.getloadavg())
    ok = [ln["bench"] for ln in launch.lines if ln["bench"]["ok"]]
    failed = [ln["bench"] for ln in launch.lines if not ln["bench"]["ok"]]
    result: dict[str, Any] = {
        "benchmark": "ttft_ab",
        "machine": info,
        "config": {
            "rounds": args.rounds,
            "warmup_rounds": args.warmup_rounds,
            "seed": args.seed,
            "kinds": list(KINDS),
            "image": "640x480 JPEG (harness make_image): a new one per new_image request, one fixed for same_image",
            "max_tokens": MAX_TOKENS,
            "server_args": list(SERVER_ARGS),
            "first": args.first,
            "startup_s": launch.startup_s,
            "pause_other_server": not args.no_pause,
            "settle_ms": args.settle_ms,
            "control_aa": args.control,
            "on_server_extra_env": on_env,
            "run_wall_s": round(time.monotonic() - t_start, 1),
        },
        "kinds": {kind: ratio_summary(launch.lines, kind) for kind in KINDS},
        "records": record_check(launch.lines),
        "plugin_vs_client": plugin_vs_client(launch.lines),
        "server_health_per_round": launch.health,
        "failed_requests": [{k: b.get(k) for k in ("round", "kind", "arm", "error")} for b in failed],
        "samples": [
            {k: b.get(k) for k in ("round", "kind", "arm", "order", "client_ttft_s", "client_e2e_s")}
            | {"cached_tokens": (b.get("usage") or {}).get("cached_tokens")}
            for b in ok
        ],
    }
    (out_dir / "ttft_ab.json").write_text(json.dumps(result, indent=2) + "\n")
    md = markdown(result)
    (out_dir / "ttft_ab.md").write_text(md)
    print(md)
    if not args.keep_logs:
        for p in work.iterdir():
            p.unlink()
        work.rmdir()
    return 0


if __name__ == "__main__":
    sys.exit(main())
