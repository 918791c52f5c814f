"""One server run of the reference experiment against real SGLang (0.5.17 on the H200), plugin on.

    python benchmarks/gpu/drive_017.py --model DIR --out OUTDIR --label ipc [--rounds 5]
        [--deadline EPOCH_S] [--server-flags "..."] [--nsys OUT_BASE] [-- extra server args]

Starts ``python3 -m sglang.launch_server`` (records to OUTDIR/records_<label>.jsonl), waits for
/health, sends a warm-up round (the first request pays Triton JIT), then ``rounds`` rounds of the
four reference requests (new image; same image again; different image, same question; same image,
question first), reads /mmtrace/state and the plugin's /metrics lines, waits for the records,
stops the server (its own process group, by id) and writes OUTDIR/summary_<label>.json plus a
per-kind table to stdout. Stdlib + sglang_mmtrace only; every step is bounded by ``--deadline``.
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import signal
import subprocess
import sys
import time
import urllib.request
from pathlib import Path
from typing import Any

from sglang_mmtrace.bench.records import RecordsTail
from sglang_mmtrace.cli.demo import KINDS, reference_requests
from sglang_mmtrace.harness import stream_chat
from sglang_mmtrace.report.analysis import format_table, quantile, read_jsonl, summarize

WARMUP_ROUND = 100  # image seeds far from the measured rounds


def log(msg: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {msg}", flush=True)


def http_get(url: str, timeout: float = 5.0) -> tuple[int | None, bytes]:
    try:
        with urllib.request.urlopen(url, timeout=timeout) as r:
            return r.status, r.read()
    except urllib.error.HTTPError as e:
        return e.code, e.read()
    except Exception:
        return None, b""


def nsys_prefix(out_base: str) -> list[str]:
    """Nsight Systems around the whole server (the scheduler is a spawned child, so follow exec);
    collection only between SGLang's ``/start_profile`` and ``/stop_profile`` with CUDA_PROFILER."""
    return [
        os.environ.get("NSYS", "nsys"), "profile", "-t", "cuda,nvtx", "--sample=none", "--cpuctxsw=none",
        "--trace-fork-before-exec=true", "--capture-range=cudaProfilerApi", "--capture-range-end=stop-shutdown",
        "-o", out_base, "--force-overwrite=true",
    ]  # fmt: skip


def http_post(url: str, body: dict[str, Any], timeout: float = 30.0) -> tuple[int | None, bytes]:
    req = urllib.request.Request(url, data=json.dumps(body).encode(), headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(req, timeout=timeout) as r:
            return r.status, r.read()
    except urllib.error.HTTPError as e:
        return e.code, e.read()
    except Exception as e:
        return None, repr(e).encode()


def start_server(
    args: argparse.Namespace, jsonl: Path, log_path: Path, extra: list[str], env: dict[str, str] | None = None
) -> subprocess.Popen:
    cmd = [
        *(nsys_prefix(args.nsys) if args.nsys else []),
        sys.executable, "-m", "sglang.launch_server",
        "--model-path", args.model,
        "--host", "127.0.0.1", "--port", str(args.port),
        *shlex.split(args.server_flags),
        "--enable-metrics",
        *extra,
    ]  # fmt: skip
    env = {**os.environ, "SGLANG_MMTRACE_JSONL": str(jsonl), "PYTHONUNBUFFERED": "1", **(env or {})}
    log("server: " + " ".join(cmd))
    fh = log_path.open("wb")
    return subprocess.Popen(
        cmd, env=env, stdout=fh, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, start_new_session=True
    )


def stop_server(proc: subprocess.Popen) -> None:
    """SIGTERM, then SIGKILL, to the server's own process group (start_new_session: led by our child)."""
    pgid = proc.pid
    for sig, wait in ((signal.SIGTERM, 20.0), (signal.SIGKILL, 10.0)):
        try:
            os.killpg(pgid, sig)
        except ProcessLookupError:
            return
        end = time.time() + wait
        while time.time() < end:
            proc.poll()
            try:
                os.killpg(pgid, 0)
            except ProcessLookupError:
                return
            time.sleep(0.5)


def wait_healthy(proc: subprocess.Popen, base: str, deadline: float) -> float:
    t0 = time.monotonic()
    while time.time() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"server exited with {proc.returncode} before becoming healthy")
        status, _ = http_get(base + "/health", timeout=2.0)
        if status == 200:
            return time.monotonic() - t0
        time.sleep(1.0)
    raise TimeoutError("server not healthy before the deadline")


def one(base: str, kind: str, messages: list[dict[str, Any]], timeout: float) -> dict[str, Any]:
    t0 = time.monotonic()
    chunks, usage, _ = stream_chat(base, messages, max_tokens=4, timeout=timeout)
    wall = time.monotonic() - t0
    details = (usage or {}).get("prompt_tokens_details") or {}
    return {
        "rid": chunks[0]["id"] if chunks else None,
        "kind": kind,
        "client_wall_s": round(wall, 6),
        "usage_prompt_tokens": (usage or {}).get("prompt_tokens"),
        "usage_cached_tokens": details.get("cached_tokens"),
    }


def run(args: argparse.Namespace, extra: list[str]) -> int:
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    label = args.label
    jsonl = out / f"records_{label}.jsonl"
    server_log = Path(args.log_dir) / f"server_{label}.log"
    base = f"http://127.0.0.1:{args.port}"
    summary: dict[str, Any] = {"label": label, "extra_args": extra, "requests": [], "errors": []}
    proc = start_server(args, jsonl, server_log, extra)
    try:
        summary["startup_s"] = round(wait_healthy(proc, base, min(args.deadline, time.time() + args.health_timeout)), 1)
        log(f"healthy after {summary['startup_s']} s")
        warm = []
        for kind, messages in reference_requests(WARMUP_ROUND):
            t0 = time.monotonic()
            warm.append(one(base, "warmup: " + kind, messages, timeout=max(30.0, args.deadline - time.time() - 60)))
            log(f"warm-up {kind}: {time.monotonic() - t0:.2f} s")
        summary["warmup"] = warm
        if args.nsys:
            summary["start_profile"] = http_post(base + "/start_profile", {"activities": ["CUDA_PROFILER"]})
            log(f"start_profile: {summary['start_profile']}")
        for r in range(args.rounds):
            if time.time() > args.deadline - 45:
                summary["errors"].append(f"stopped before round {r}: deadline")
                break
            for kind, messages in reference_requests(r):
                summary["requests"].append(one(base, kind, messages, timeout=60.0))
        log(f"sent {len(summary['requests'])} reference requests")
        status, body = http_get(base + "/mmtrace/state")
        summary["mmtrace_state"] = {"http": status, "body": _json(body)}
        status, body = http_get(base + "/metrics", timeout=10.0)
        lines = [ln for ln in body.decode(errors="replace").splitlines() if ln.startswith("sglang_mmtrace_")]
        summary["metrics"] = {"http": status, "mmtrace_lines": len(lines), "sample": lines[:40]}
        rids = {q["rid"] for q in summary["requests"] + warm if q["rid"]}
        # 0.5.17 keeps each streamed response open ~2 s after its end (create_abort_task): wait for it.
        RecordsTail(jsonl, from_start=True).wait(rids, timeout=max(0.0, min(args.deadline - time.time(), 20.0)))
        records = read_jsonl(str(jsonl)) if jsonl.exists() else []
        summary["records_seen"] = len(records)
        status, body = http_get(base + "/mmtrace/state")
        summary["mmtrace_state_after"] = {"http": status, "body": _json(body)}
        if args.nsys:
            # stop-shutdown: nsys ends the collection, stops the server and writes the report
            summary["stop_profile"] = http_post(base + "/stop_profile", {}, timeout=60.0)
            try:
                proc.wait(timeout=max(10.0, min(240.0, args.deadline - time.time())))
            except subprocess.TimeoutExpired:
                summary["errors"].append("nsys did not finish before the deadline")
            log(f"stop_profile: {summary['stop_profile']}; nsys exit {proc.returncode}")
    except Exception as exc:
        summary["errors"].append(repr(exc))
        log(f"ERROR {exc!r}")
        records = read_jsonl(str(jsonl)) if jsonl.exists() else []
    finally:
        stop_server(proc)
    summarize_run(summary, records)
    (out / f"summary_{label}.json").write_text(json.dumps(summary, indent=1, default=str))
    return 0 if not summary["errors"] else 1


def _json(body: bytes) -> Any:
    try:
        return json.loads(body)
    except Exception:
        return body[:2000].decode(errors="replace")


def summarize_run(summary: dict[str, Any], records: list[dict[str, Any]]) -> None:
    by_rid = {r["rid"]: r for r in records}
    kinds = {q["rid"]: q["kind"] for q in summary["requests"]}
    rows = []
    for q in summary["requests"] + summary.get("warmup", []):
        rec = by_rid.get(q["rid"])
        if rec is None:
            rows.append({**q, "record": None})
            continue
        rows.append(
            {
                **q,
                "status": rec["status"],
                "ttft_s": rec["ttft_s"],
                "coverage": rec["coverage"],
                "record_cached_tokens": rec["cached_tokens"],
                "record_prompt_tokens": rec["prompt_tokens"],
                "cache": rec["cache"],
                "unobserved": rec.get("unobserved"),
                "transport": rec["transport"],
                "images": rec["images"],
                "clocks": {s["name"]: s["clock"] for s in rec["stages"]},
                "stages_ms": {s["name"]: round(s["dur_s"] * 1e3, 3) for s in rec["stages"]},
            }
        )
    summary["rows"] = rows
    ours = [by_rid[r] for r in kinds if r in by_rid]
    table = summarize(ours, group=lambda r: kinds[r["rid"]])
    table = {k: table[k] for k in KINDS if k in table}
    summary["table"] = table
    covs = sorted(r["coverage"] for r in ours if r["status"] == "ok")
    summary["coverage"] = {"n": len(covs), "min": covs[0], "median": quantile(covs, 0.5)} if covs else None
    summary["statuses"] = {s: sum(1 for r in ours if r["status"] == s) for s in {r["status"] for r in ours}}
    gpu_clock = {s["name"]: s["clock"] for r in ours for s in r["stages"] if s["clock"] == "cuda"}
    summary["cuda_clock_stages"] = sorted(gpu_clock)
    print(f"== {summary['label']}: {len(ours)}/{len(kinds)} records, statuses {summary['statuses']}")
    print(format_table(table))
    if covs:
        print(f"coverage: min {covs[0]:.3f}, median {quantile(covs, 0.5):.3f}")
    print(f"stages with clock=cuda: {summary['cuda_clock_stages']}")
    print("cached tokens, usage vs record (first round):")
    for row in rows[: len(KINDS)]:
        print(f"   {row['kind']:<34} usage {row.get('usage_cached_tokens')}/{row.get('usage_prompt_tokens')}"
              f"  record {row.get('record_cached_tokens')}/{row.get('record_prompt_tokens')}")  # fmt: skip


def main() -> int:
    argv = sys.argv[1:]
    extra: list[str] = []
    if "--" in argv:
        i = argv.index("--")
        argv, extra = argv[:i], argv[i + 1 :]
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", required=True)
    ap.add_argument("--out", required=True)
    ap.add_argument("--label", required=True)
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--port", type=int, default=30000)
    ap.add_argument("--deadline", type=float, default=time.time() + 540)
    ap.add_argument("--health-timeout", type=float, default=300.0)
    ap.add_argument("--server-flags", default=os.environ.get("SGLANG_GPU_FLAGS", ""))
    ap.add_argument("--log-dir", default="/tmp")
    ap.add_argument("--nsys", default=None, help="profile the measured rounds with Nsight Systems into this base path")
    return run(ap.parse_args(argv), extra)


if __name__ == "__main__":
    sys.exit(main())
