"""The plugin's overhead on the GPU (SGLang 0.5.17 on the H200), within one deadline.

    python3 benchmarks/gpu/overhead_017.py --out OUTDIR --deadline EPOCH_S [--model DIR]
        [--server-flags "$SGLANG_GPU_FLAGS"] [--n 400] [--ablation-rounds 60] [--concurrency 64]
        [--segment-s 15] [--segments 3] [--gap-ms 60] [--crossover-rounds 30] [--launches 2]
        [--crossover-runs ab,aa] [--throughput-parts PART,...[;PART,...]]

Uses whatever ``sglang_mmtrace`` is on PYTHONPATH (the installed wheel, whose dist-info registers
the plugin's entry point) and prints its commit (``$MMTRACE_COMMIT``) and location. Everything goes
through the package's bench (``sglang_mmtrace.bench``: ``GpuServer`` via ``launched``/``make_server``,
``driver.run_switched``, ``driver.run_crossover``). Phases, in order, each writing
``OUTDIR/<phase>.json`` (summary) and ``OUTDIR/<phase>.lines.jsonl`` (one compact line per request)
as soon as it ends, so a timeout loses only the running phase:

1. ``overhead``: one server (plugin installed, ``--enable-metrics``, JSONL, OTLP to a receiver),
   on/off by the runtime switch before each request, ``--n`` rounds per kind (default: the bench's
   GPU default); every 'on' request gets its record (built under its generation's setting after the
   next flip). The same-instance A/A control (a second 'off' request per round and kind) runs
   unless ``--no-control``.
2. ``ablation`` on the same server: levels L0..L12, as many rounds as fit into the time left after
   reserving the throughput phase (at most ``--ablation-rounds``; printed), with ``keep_records``:
   after a request at a level with ``records`` on the bench waits until its record is built
   (~0.1 s), so the ``records``/``jsonl``/``prometheus``/``otlp`` work of one level does not spill
   into the next request; ``--ablation-no-records`` skips that wait.
3. ``throughput`` on the same server: ``--concurrency`` clients, 256 output tokens with
   ``ignore_eos``, ``--segments`` segments per arm of ``--segment-s`` seconds (shortened to fit);
   ``--throughput-parts`` names the parts its 'on' segments enable (default all), to bisect its cost;
   several sets separated by ``;`` (``all`` for every part) run one after the other on the same server,
   each saved as ``throughput-<i>.json`` (a single set: ``throughput.json``).
4. ``crossover`` if time is left: server pairs ``SGLANG_MMTRACE=1``/``=0`` started one after the
   other, ``--launches`` launches per orientation, then the A/A control while time lasts
   (``crossover.json`` is rewritten after every launch).

The ``otlp`` part exports to the repository's OTLP receiver (``tests/peers/otlp_receiver.py``,
HTTP/protobuf), run in its own process so that decoding spans does not take the GIL from the
client's timing threads; its span count goes into ``otlp_receiver.json``. The run stops at once when the
OTLP exporter cannot load (before 2026-12-03 the device bundle lacked two of its wheels, and the
collector ran with OTLP export disabled: those runs measured every part but the export). ``nvtx`` does work only
under an NVTX tool (not attached here), so its level measures the plugin's "no tool" check.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import shlex
import signal
import subprocess
import sys
import time
from importlib.metadata import version
from pathlib import Path
from typing import Any

import sglang_mmtrace
from sglang_mmtrace import switch
from sglang_mmtrace.bench import driver
from sglang_mmtrace.bench.experiments import Options
from sglang_mmtrace.bench.targets import LaunchConfig, launched
from sglang_mmtrace.harness.random_model import ensure_model
from sglang_mmtrace.sinks.otlp import make_exporter

REPO = Path(__file__).resolve().parents[2]
RECORD_WAIT_S = 0.15  # a record is built ~50-100 ms after the response (other processes' events)
RECEIVER = r"""
import json, signal, sys, threading
sys.path.insert(0, sys.argv[1])
from peers.otlp_receiver import OtlpReceiver
r = OtlpReceiver()
print(r.start_http(), flush=True)
done = threading.Event()
signal.signal(signal.SIGTERM, lambda *a: done.set())
done.wait()
spans = r.snapshot()
json.dump({"spans": len(spans), "requests": r.requests, "bad_requests": r.bad_requests[:5],
           "traces": len({s.trace_id for s in spans})}, open(sys.argv[2], "w"))
"""


def log(msg: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {msg}", flush=True)


def left(deadline: float) -> float:
    return deadline - time.time()


def compact(line: dict[str, Any]) -> dict[str, Any]:
    """The request's bench facts plus the record's headline (full records stay on the device)."""
    return {k: line.get(k) for k in ("rid", "status", "ttft_s", "coverage")} | {"bench": line["bench"]}


def save(out: Path, phase: str, result: dict[str, Any], lines: list[dict[str, Any]] | None = None) -> None:
    (out / f"{phase}.json").write_text(json.dumps(result, indent=1, default=str))
    if lines is not None:
        with (out / f"{phase}.lines.jsonl").open("w") as fh:
            for ln in lines:
                fh.write(json.dumps(compact(ln), default=str) + "\n")
    log(f"wrote {phase}.json")


def start_receiver(out: Path) -> tuple[subprocess.Popen[bytes] | None, str | None]:
    """The OTLP receiver in its own process; (process, endpoint) or (None, None) if it cannot run."""
    try:
        with (out / "otlp_receiver.log").open("wb") as err:
            proc = subprocess.Popen(
                [sys.executable, "-c", RECEIVER, str(REPO / "tests"), str(out / "otlp_receiver.json")],
                stdout=subprocess.PIPE, stderr=err, start_new_session=True,
            )  # fmt: skip
        assert proc.stdout is not None
        port = int(proc.stdout.readline().strip() or 0)
        if port:
            return proc, f"http://127.0.0.1:{port}"
        proc.wait(timeout=5)
    except Exception as exc:
        log(f"OTLP receiver did not start: {exc!r}")
    return None, None


def stop_receiver(proc: subprocess.Popen[bytes] | None) -> None:
    if proc is None:
        return
    proc.send_signal(signal.SIGTERM)
    try:
        proc.wait(timeout=15)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)


PHASES = ("overhead", "ablation", "throughput", "crossover")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", required=True)
    ap.add_argument("--deadline", type=float, default=time.time() + 540, help="epoch seconds (default now + 540)")
    ap.add_argument("--model", default=os.environ.get("MODEL", "/tmp/tiny-qwen3vl"))
    ap.add_argument("--shape", default=os.environ.get("SHAPE", "tiny"), help="the model's shape, built when missing")
    ap.add_argument("--server-flags", default=os.environ.get("SGLANG_GPU_FLAGS", ""))
    ap.add_argument("--n", type=int, default=None, help="overhead: rounds per kind (default: the bench's GPU default)")
    ap.add_argument("--no-control", action="store_true", help="overhead: no same-instance A/A control arm")
    ap.add_argument("--ablation-rounds", type=int, default=60, help="at most this many (fewer if time is short)")
    ap.add_argument(
        "--ablation-no-records",
        action="store_true",
        help="ablation without waiting for each record to be built (its work then overlaps the next request)",
    )
    ap.add_argument(
        "--ablation-groups",
        default=None,
        help='ablation levels as comma-separated groups of parts joined by "+" (default: one level per part)',
    )
    ap.add_argument(
        "--throughput-parts",
        default=None,
        help="comma-separated parts the throughput phase's 'on' segments enable (default: all): to bisect its cost; "
        "several sets separated by ';' (each its own run on the same server; 'all' = every part)",
    )
    ap.add_argument("--concurrency", type=int, default=64)
    ap.add_argument("--segment-s", type=float, default=15.0, help="throughput segment (the CLI's default is 25)")
    ap.add_argument("--gap-ms", type=float, default=60.0, help="idle gap before each request, both arms")
    ap.add_argument("--segments", type=int, default=3, help="throughput segments per arm")
    ap.add_argument("--crossover-rounds", type=int, default=30, help="rounds per launch")
    ap.add_argument("--launches", type=int, default=2, help="crossover launches per orientation")
    ap.add_argument(
        "--crossover-runs",
        default="ab,aa",
        help="ab (plugin on vs off), aa (the A/A control, both off), or both: one device call may hold only one",
    )
    ap.add_argument("--seed", type=int, default=20261130)
    ap.add_argument(
        "--phases", default=",".join(PHASES), help=f"comma-separated subset of {','.join(PHASES)} (in that order)"
    )
    ap.add_argument("--work-dir", default="/tmp/mmtrace-overhead-work", help="server logs and full records")
    args = ap.parse_args()
    part_sets: list[tuple[str, ...]] = []
    for spec in (args.throughput_parts or "all").split(";"):
        try:  # the switch's own parser: known parts only, in stack order
            names = list(switch.PARTS) if spec.strip() == "all" else spec.split(",")
            part_sets.append(switch.Setting.parse({"on": True, "parts": names}).parts)
        except ValueError as exc:
            ap.error(f"--throughput-parts: {exc}")
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    work = Path(args.work_dir)
    work.mkdir(parents=True, exist_ok=True)
    deadline = args.deadline
    info: dict[str, Any] = {
        "mmtrace_commit": os.environ.get("MMTRACE_COMMIT", "unknown"),
        "sglang_mmtrace_file": sglang_mmtrace.__file__,
        "sglang": version("sglang"),
        "server_flags": args.server_flags,
        "started_unix": time.time(),
        "deadline_unix": deadline,
        "args": vars(args),
    }
    log(f"sglang_mmtrace commit {info['mmtrace_commit']} from {info['sglang_mmtrace_file']}; sglang {info['sglang']}")
    model = ensure_model(Path(args.model), args.shape)
    receiver, endpoint = start_receiver(out)
    info["otlp_endpoint"] = endpoint
    if endpoint:
        try:  # the collector builds its exporter the same way; without it the 'otlp' part would do nothing
            make_exporter(endpoint, "http/protobuf").shutdown()
        except Exception as exc:
            log(f"the OTLP exporter cannot load here ({exc!r}): the plugin would measure without OTLP export")
            stop_receiver(receiver)
            return 2
    env = (
        {"SGLANG_MMTRACE_OTLP_ENDPOINT": endpoint, "SGLANG_MMTRACE_OTLP_PROTOCOL": "http/protobuf"} if endpoint else {}
    )
    cfg = LaunchConfig(
        "h200 0.5.17", ("--model-path", str(model), *shlex.split(args.server_flags), "--enable-metrics"), env
    )
    opts = Options(
        n=args.n, warmup=2, seed=args.seed, concurrency=(args.concurrency,), segment_s=args.segment_s,
        segments=args.segments, launches=args.launches, ab="ab" in args.crossover_runs.split(","),
        aa="aa" in args.crossover_runs.split(","), timeout=120.0, deadline=deadline - 30, gap_s=args.gap_ms / 1000,
        control=not args.no_control,
    )  # fmt: skip
    if args.ablation_groups:
        opts.ablation_parts = tuple(args.ablation_groups.split(","))
    st = driver.Settings(
        experiments=[], opts=opts, launch=[cfg], gpu=True, pause_other=False, work_dir=work,
        health_timeout=max(60.0, min(300.0, left(deadline) - 60)), records_timeout=10.0,
    )  # fmt: skip
    (out / "run_info.json").write_text(json.dumps(info, indent=1, default=str))
    status = 0
    phases = set(args.phases.split(","))
    per_request = 0.1  # s per request until the overhead phase has measured it
    try:
        same_instance = phases & {"overhead", "ablation", "throughput"}
        with launched(cfg, work, True, st.health_timeout) if same_instance else contextlib.nullcontext() as target:
            if "overhead" in phases:
                # 1. overhead, same instance
                res = driver.Outcome()
                t0 = time.time()
                driver.run_switched(target, "overhead", st, res)
                took = time.time() - t0
                per_request = cycle_s(res.lines) or took / max(1, res.results["overhead"]["requests_sent"])
                save(out, "overhead", {"info": info, **res.results["overhead"], "wall_s": round(took, 1)}, res.lines)
                print("\n".join(res.notes), flush=True)
            if "ablation" in phases:
                # 2. ablation, rounds fitted to the time left after reserving the throughput phase; with
                # keep_records each of the 5 levels with records on waits for its record (~0.1 s) per kind
                tp_need = 2 * args.segments * args.segment_s + 30
                budget = left(deadline) - 40 - tp_need
                keep = not args.ablation_no_records
                per_round = 3 * (len(opts.ablation_parts) + 1) * per_request + (3 * 5 * RECORD_WAIT_S if keep else 0.0)
                rounds = driver.estimate_rounds(budget, per_round, 1, args.ablation_rounds)
                log(f"ablation: {rounds} rounds (asked {args.ablation_rounds}; {per_request * 1e3:.0f} ms per request, "
                    f"records {'kept' if keep else 'not kept'}: ~{per_round:.0f} s per round)")  # fmt: skip
                opts.n, opts.keep_records, opts.deadline = rounds, keep, time.time() + budget
                res = driver.Outcome()
                t0 = time.time()
                driver.run_switched(target, "ablation", st, res)
                opts.keep_records, opts.deadline = False, deadline - 30
                save(out, "ablation", {**res.results["ablation"], "rounds_asked": args.ablation_rounds,
                                       "wall_s": round(time.time() - t0, 1)}, res.lines)  # fmt: skip
                (out / "ablation.md").write_text(res.results["ablation"]["markdown"])
                print(res.results["ablation"]["markdown"], flush=True)
            for i, on_parts in enumerate(part_sets if "throughput" in phases else []):
                # 3. throughput, once per set of parts, segments shortened to fit the sets still to run
                seg = min(args.segment_s, (left(deadline) - 45) / (2 * args.segments * (len(part_sets) - i)))
                if seg >= 6:
                    opts.segment_s, opts.on_parts = seg, on_parts
                    res = driver.Outcome()
                    driver.run_switched(target, "throughput", st, res)
                    save(out, "throughput" if len(part_sets) == 1 else f"throughput-{i}", res.results["throughput"])
                    print("\n".join(res.notes), flush=True)
                else:
                    log(f"throughput: set {i} skipped, {left(deadline):.0f} s left")
        # 4. crossover, if time is left: a launch pair takes two starts plus its rounds
        if "crossover" in phases and left(deadline) > 150:
            opts.n = args.crossover_rounds
            opts.deadline = deadline - 20
            res = driver.Outcome()
            driver.run_crossover(
                st, res, after_launch=lambda o: save(out, "crossover", o.results["overhead-crossover"])
            )
            save(out, "crossover", res.results["overhead-crossover"], res.lines)
            print("\n".join(res.notes), flush=True)
        else:
            log(f"crossover: skipped, {left(deadline):.0f} s left")
    except Exception as exc:
        log(f"ERROR {exc!r}")
        (out / "error.txt").write_text(repr(exc))
        status = 1
    finally:
        stop_receiver(receiver)
        tail_logs(work, info["started_unix"], out / "server_logs.txt")
    log(f"done, {left(deadline):.0f} s before the deadline")
    return status


def cycle_s(lines: list[dict[str, Any]]) -> float | None:
    """Seconds per request in a sequential run (flip, request, bookkeeping), from the send times."""
    sent = sorted(ln["bench"]["sent_unix_s"] for ln in lines)
    return (sent[-1] - sent[0]) / (len(sent) - 1) if len(sent) > 1 else None


def tail_logs(folder: Path, since: float, dest: Path, lines: int = 40) -> None:
    """Errors, plugin lines and the tail of each server log written during this run."""
    with dest.open("w") as fh:
        for path in sorted(folder.glob("*.log")):
            if path.stat().st_mtime < since:
                continue
            text = path.read_text(errors="replace").splitlines()
            keep = [ln[:400] for ln in text if "Traceback" in ln or "mmtrace" in ln.lower() or "Error" in ln][:30]
            fh.write("\n".join([f"===== {path.name}", *keep, "----- tail", *(ln[:400] for ln in text[-lines:])]) + "\n")


if __name__ == "__main__":
    sys.exit(main())
