"""Server TTFT with the plugin off vs on: two real CPU SGLang servers, requests interleaved A/B.

Both servers (``SGLANG_MMTRACE=0`` and ``=1`` with a JSONL sink) run the tiny Qwen3-VL with the
same arguments. Each round sends, to each server, in a random A/B order per request kind:
``new_image`` (a fresh 512x512 PNG, new seed per round: preprocess/embedding/radix cache miss),
``same_image`` (that image again: cache hits) and ``text`` (text only). One request is in flight
at a time. TTFT is measured by a stdlib socket client: from just before the request is written to
the first received bytes that contain an SSE ``data:`` line; e2e is to the end of the response.

Per kind: median TTFT off/on, their ratio and difference, the median of the per-round paired
differences (on - off) with a bootstrap 95% interval, and e2e medians.

    python -m benchmarks.ttft_ab --rounds 30
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from sglang_mmtrace.bench.overhead import (
    KINDS,
    MAX_TOKENS,
    Pauser,
    paired_summary,
    plugin_records,
    run_rounds,
    start_pair,
)
from sglang_mmtrace.harness import CpuServer

from ._common import RESULTS, machine

SERVER_ARGS = ("--mm-preprocess-cache-size-mb", "64")


def start_servers(
    jsonl: Path,
    log_dir: Path,
    control: bool = False,
    health_timeout: float = 600.0,
    on_env: dict[str, str] | None = None,
) -> dict[str, CpuServer]:
    """``off`` and ``on``; with ``control`` the ``on`` server runs with the plugin off too (A/A)."""

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

    return start_pair(make)


def markdown(result: dict[str, Any]) -> str:
    m, c = result["machine"], result["config"]
    lines = [
        "# TTFT A/B: plugin off vs on (interleaved)",
        "",
        f"{m['date_utc']} UTC; {m['cpus']} CPUs ({m['cpu_model']}), {m['accelerator']}; SGLang {m['sglang']}; "
        f"plugin commit {m['commit']}{' (tree dirty)' if m['plugin_tree_dirty'] else ''}; "
        f"load average at start {m['loadavg_at_start'][0]:.2f}, at end {m['loadavg_at_end'][0]:.2f}.",
        f"{c['rounds']} rounds x {len(KINDS)} kinds x 2 servers, one request in flight, A/B order random per "
        f"request kind and round; tiny Qwen3-VL, max_tokens {c['max_tokens']}, server args `{' '.join(c['server_args'])}`; "
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
    pr = result.get("plugin_records", {})
    lines += [
        "",
        f"The plugin-on server wrote {pr.get('records', 0)} records (warm-up rounds included). Its own TTFT vs the "
        "client's, medians over the matched requests: "
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
    ap.add_argument("--out-dir", default=str(RESULTS))
    ap.add_argument("--keep-logs", action="store_true", help="keep the server logs and JSONL in a temp folder")
    ap.add_argument(
        "--no-pause",
        action="store_true",
        help="leave the other server running during each request (default: SIGSTOP it, see Pauser)",
    )
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
    ap.add_argument("--max-failures", type=int, default=5, help="give up after this many failed requests")
    ap.add_argument("--health-timeout", type=float, default=600.0, help="seconds a server may take to become healthy")
    args = ap.parse_args(argv)

    out_dir = Path(args.out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    work = Path(tempfile.mkdtemp(prefix="mmtrace-ttft-ab-"))
    jsonl = work / "records.jsonl"
    info = machine()

    print(f"[ttft_ab] starting both servers (logs in {work}) ...", flush=True)
    t_start = time.monotonic()
    on_env = dict(kv.split("=", 1) for kv in args.on_env)
    servers = start_servers(jsonl, work, control=args.control, health_timeout=args.health_timeout, on_env=on_env)
    startup = {k: round(s.startup_seconds or 0, 1) for k, s in servers.items()}
    print(f"[ttft_ab] healthy after {startup} s", flush=True)
    pauser = Pauser(servers, enabled=not args.no_pause, settle_s=args.settle_ms / 1000)
    try:
        run = run_rounds(
            servers,
            args.rounds,
            args.warmup_rounds,
            args.seed,
            pauser,
            request_timeout=args.request_timeout,
            max_failures=args.max_failures,
            round_log=True,
            log=lambda msg: print(msg, flush=True),
        )
    finally:
        pauser.resume_all()
        for srv in servers.values():
            srv.stop()
    info["loadavg_at_end"] = list(os.getloadavg())

    time.sleep(0.5)
    result: dict[str, Any] = {
        "benchmark": "ttft_ab",
        "machine": info,
        "config": {
            "rounds": args.rounds,
            "warmup_rounds": args.warmup_rounds,
            "seed": args.seed,
            "kinds": list(KINDS),
            "image": "512x512 PNG (harness make_image), new seed per round",
            "max_tokens": MAX_TOKENS,
            "server_args": list(SERVER_ARGS),
            "startup_s": startup,
            "pause_other_server": not args.no_pause,
            "settle_ms": args.settle_ms,
            "control_aa": args.control,
            "on_server_extra_env": on_env,
            "run_wall_s": round(time.monotonic() - t_start, 1),
        },
        "kinds": {kind: paired_summary(run.rows, kind) for kind in KINDS},
        "plugin_records": plugin_records(jsonl, run.rows),
        "server_health_per_round": run.health,
        "failed_requests": run.failures,
        "samples": [
            {k: (round(v, 6) if isinstance(v, float) else v) for k, v in r.items() if k != "usage"}
            | {"cached_tokens": ((r.get("usage") or {}).get("prompt_tokens_details") or {}).get("cached_tokens")}
            for r in run.rows
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
