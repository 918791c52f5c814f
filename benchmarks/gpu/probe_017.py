"""What the plugin costs inside each SGLang process: own time per hook, GC, CPU, on vs off by the switch.

    python3 benchmarks/gpu/probe_017.py --out OUTDIR --deadline EPOCH_S [--model DIR]
        [--arms on,off,on,off] [--rounds 60] [--gap-ms 60] [--concurrency 1] [--max-tokens 8] [--cpu]

One server (``$SGLANG_GPU_FLAGS --enable-metrics``, JSONL) started with ``probe/`` on its
PYTHONPATH and ``MMTRACE_PROBE_DIR`` set (see ``probe/sitecustomize.py``). Per block (an arm:
``on``, ``off``, or ``on-<part>[-<part>...]`` = every part but those), the switch is set, then one
client sends ``--rounds`` rounds of new image / same image / text, one request at a time with a
``--gap-ms`` idle gap. Around each block the probe files are read (after 1.5 s, so a dump has
happened). Writes ``OUTDIR/probe.json``: per block and process role the differences per request
(CPU seconds, GC collections, seconds and objects collected per generation, per hook id: calls, own seconds and the
wrapped SGLang call's seconds) and the
client TTFT medians per kind. ``--concurrency C``: C clients at once, each its own ``--rounds``
rounds back to back (no gap), ``--max-tokens`` output tokens per request: what the plugin costs
under load, where requests overlap and its objects pile up (the garbage collector's share).
``--cpu``: the CPU demo server instead (a smoke test of the probe here, or the CPU side of the
measurement).

``--paired N``: where the plugin's cost lands, request by request. The server's probe times SGLang's
own functions (every hook's target, under the hook, in both arms: ``MMTRACE_PROBE_SEGMENTS``); the
client sends N rounds of new image / same image / text, each kind once per arm, the switch flipped
before every request and the leading arm alternating by round, as ``bench --experiment overhead``
does. Each timed call's part inside its request's TTFT window (from just before the request was
written to the first chunk's arrival; ``perf_counter`` is one clock for the machine's processes) is
summed per request and target; the on-minus-off differences, paired by round, give a median with a
bootstrap 95% interval per target, beside the client's TTFT. A target whose SGLang time grows with
the plugin on shows where the cost lands: in the plugin's nested hooks (an outer target's time
holds the hooks of the targets it calls) or in SGLang's own code run slower. Writes
``OUTDIR/paired.json`` and ``OUTDIR/paired.lines.jsonl`` (the requests).
"""

from __future__ import annotations

import argparse
import bisect
import json
import os
import shlex
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

from sglang_mmtrace.bench import procs, switchctl
from sglang_mmtrace.bench.client import timed_chat
from sglang_mmtrace.bench.overhead import KINDS, Workload, arm_order
from sglang_mmtrace.bench.stats import bootstrap_median_ci
from sglang_mmtrace.bench.targets import LaunchConfig, default_config, launched
from sglang_mmtrace.harness import SHIMS_DIR
from sglang_mmtrace.harness.random_model import ensure_model
from sglang_mmtrace.report.analysis import quantile

PROBE = Path(__file__).resolve().parent / "probe"


def log(msg: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {msg}", file=sys.stderr, flush=True)


def level(arm: str) -> tuple[str, ...] | None:
    if arm == "off":
        return None
    if arm == "on":
        return tuple(switchctl.PARTS)
    drop = set(arm.split("-")[1:])
    assert arm.startswith("on-") and drop <= set(switchctl.PARTS), arm
    return tuple(p for p in switchctl.PARTS if p not in drop)


def snapshot(folder: Path, roles: dict[str, list[int]]) -> dict[str, dict[str, Any]]:
    time.sleep(1.5)
    out = {}
    for role, pids in roles.items():
        for i, pid in enumerate(pids):
            path = folder / f"{pid}.json"
            if path.exists():
                out[f"{role}{i or ''}"] = json.loads(path.read_text())
    return out


def diff(a: dict[str, Any], b: dict[str, Any], n: int) -> dict[str, Any]:
    own = {}
    for hook, (calls, secs, inner) in b["own"].items():
        c0, s0, i0 = a["own"].get(hook, (0, 0.0, 0.0))
        if calls - c0:
            own[hook] = {
                "calls_per_req": round((calls - c0) / n, 2),
                "own_us_per_req": round((secs - s0) / n * 1e6, 2),
                "sglang_us_per_req": round((inner - i0) / n * 1e6, 1),
            }
    gc = {}
    for gen, (cnt, secs, freed) in b["gc"].items():
        c0, s0, f0 = a["gc"].get(gen, (0, 0.0, 0))
        gc[gen] = {
            "per_req": round((cnt - c0) / n, 3),
            "us_per_req": round((secs - s0) / n * 1e6, 1),
            "collected_per_req": round((freed - f0) / n, 1),
        }
    return {
        "cpu_ms_per_req": round((b["cpu_s"] - a["cpu_s"]) / n * 1e3, 3),
        "threads": b["threads"],
        "own_us_per_req_total": round(sum(v["own_us_per_req"] for v in own.values()), 1),
        "gc": gc,
        "own": dict(sorted(own.items(), key=lambda kv: -kv[1]["own_us_per_req"])),
    }


def run_paired(base_url: str, workload: Workload, rounds: int, gap_s: float, max_tokens: int) -> list[dict[str, Any]]:
    """``rounds`` rounds of each kind in both arms (``arm_order``), the switch set before each request
    and ``gap_s`` idle before it; each request's TTFT window on ``perf_counter``."""
    sent = []
    for r in range(rounds):
        for kind in KINDS:
            for arm in arm_order(r):
                switchctl.set_level(base_url, level(arm))
                time.sleep(gap_s)
                msgs = workload.messages(kind, r, f"paired {arm}")
                t_send = time.perf_counter()
                res = timed_chat(base_url, msgs, max_tokens)
                sent.append({"round": r, "kind": kind, "arm": arm, "t_send": t_send, "ttft_s": res["ttft_s"]})
    return sent


def collect_calls(probe_dir: Path, pids: dict[int, str], timeout_s: float = 30.0) -> dict[str, dict[str, list[float]]]:
    """Touch ``dump-calls`` and read every probed process's ``<pid>.calls.json`` written after it:
    role -> target -> flat [start, end, ...] (a role's several processes merged)."""
    trigger = probe_dir / "dump-calls"
    trigger.write_text(str(time.time()))
    stamp = trigger.stat().st_mtime
    found: dict[int, dict[str, Any]] = {}
    t_end = time.time() + timeout_s
    while time.time() < t_end and len(found) < len(pids):
        for pid in pids:
            path = probe_dir / f"{pid}.calls.json"
            if pid not in found and path.exists():
                data = json.loads(path.read_text())
                if data.get("trigger") == stamp:
                    found[pid] = data
        time.sleep(0.5)
    out: dict[str, dict[str, list[float]]] = {}
    for pid, data in found.items():
        for target, flat in data["calls"].items():
            out.setdefault(pids[pid], {}).setdefault(target, []).extend(flat)
    return out


def _sorted_calls(flat: list[float]) -> tuple[list[tuple[float, float]], list[float]]:
    """The calls of a flat [start, end, ...] list in start order (the probe's threads append them as
    they end), and their starts (for ``bisect``)."""
    calls = sorted(zip(flat[0::2], flat[1::2], strict=True))
    return calls, [c[0] for c in calls]


def in_windows(flat: list[float], windows: list[tuple[float, float]]) -> list[tuple[float, int]]:
    """Per window (start, end): the seconds the calls overlap it, and how many calls overlap it."""
    calls, starts = _sorted_calls(flat)
    out = []
    for w0, w1 in windows:
        total, n = 0.0, 0
        for c0, c1 in calls[bisect.bisect_left(starts, w0 - 5.0) : bisect.bisect_left(starts, w1)]:
            overlap = min(c1, w1) - max(c0, w0)
            if overlap > 0:
                total += overlap
                n += 1
        out.append((total, n))
    return out


def first_in_windows(flat: list[float], windows: list[tuple[float, float]]) -> list[tuple[float, float] | None]:
    """Per window: (start, end) of the first call that starts inside it, relative to the window's start."""
    calls, starts = _sorted_calls(flat)
    out: list[tuple[float, float] | None] = []
    for w0, w1 in windows:
        i = bisect.bisect_left(starts, w0)
        out.append((calls[i][0] - w0, calls[i][1] - w0) if i < len(calls) and calls[i][0] < w1 else None)
    return out


def _pairs_of(sent: list[dict[str, Any]], kind: str) -> tuple[dict[tuple[int, str], int], list[int]]:
    """A kind's requests by (round, arm) -> index into ``sent``, and the rounds that have both arms."""
    idx = {(s["round"], s["arm"]): i for i, s in enumerate(sent) if s["kind"] == kind}
    return idx, sorted({r for r, _ in idx if (r, "on") in idx and (r, "off") in idx})


def _median_delta(deltas: list[float]) -> dict[str, Any]:
    """The median of paired on-minus-off differences (seconds) in µs, with its bootstrap 95% interval."""
    lo, hi = bootstrap_median_ci(deltas)
    return {
        "delta_us": round(quantile(deltas, 0.5) * 1e6, 1),
        "delta_ci95_us": [round(lo * 1e6, 1), round(hi * 1e6, 1)],
    }


def checkpoints(sent: list[dict[str, Any]], calls: dict[str, dict[str, list[float]]]) -> dict[str, Any]:
    """Per kind: when each target's first call in the TTFT window starts and ends, after the request
    was written, on vs off paired by round, in the order of the off arm's times. Where the on-minus-off
    difference grows between two consecutive points, the plugin's cost lies between them (a
    duration's difference cannot show the cost of hooks no timed call encloses)."""
    windows = [(s["t_send"], s["t_send"] + s["ttft_s"]) for s in sent]
    points: dict[str, list[float | None]] = {"client.first_chunk": [s["ttft_s"] for s in sent]}
    for role, targets in calls.items():
        for target, flat in targets.items():
            got = first_in_windows(flat, windows)
            points[f"{role}:{target} start"] = [g[0] if g else None for g in got]
            points[f"{role}:{target} end"] = [g[1] if g else None for g in got]
    result: dict[str, Any] = {}
    for kind in KINDS:
        idx, rounds = _pairs_of(sent, kind)
        rows = []
        for key, xs in points.items():
            pairs = [(xs[idx[(r, "on")]], xs[idx[(r, "off")]]) for r in rounds]
            pairs = [(a, b) for a, b in pairs if a is not None and b is not None]
            if len(pairs) < 0.9 * len(rounds):
                continue  # not a point every request of this kind passes
            off_ms = round(quantile([b for _, b in pairs], 0.5) * 1e3, 3)
            rows.append({"point": key, "off_ms": off_ms, **_median_delta([a - b for a, b in pairs])})
        result[kind] = sorted(rows, key=lambda r: r["off_ms"])
    return result


def paired_table(sent: list[dict[str, Any]], calls: dict[str, dict[str, list[float]]]) -> dict[str, Any]:
    """Per kind: the client's TTFT and each target's time inside the TTFT window, on vs off, paired by round."""
    windows = [(s["t_send"], s["t_send"] + s["ttft_s"]) for s in sent]
    series: dict[str, list[float]] = {"client.ttft": [s["ttft_s"] for s in sent]}
    counts: dict[str, list[int]] = {"client.ttft": [1] * len(sent)}
    for role, targets in calls.items():
        for target, flat in targets.items():
            got = in_windows(flat, windows)
            series[f"{role}:{target}"] = [g[0] for g in got]
            counts[f"{role}:{target}"] = [g[1] for g in got]
    result: dict[str, Any] = {}
    for kind in KINDS:
        idx, rounds = _pairs_of(sent, kind)
        rows = {}
        for key, xs in series.items():
            on = [xs[idx[(r, "on")]] for r in rounds]
            off = [xs[idx[(r, "off")]] for r in rounds]
            if not any(on) and not any(off):
                continue
            calls_on = [counts[key][idx[(r, "on")]] for r in rounds]
            rows[key] = {
                "on_ms": round(quantile(on, 0.5) * 1e3, 4),
                "off_ms": round(quantile(off, 0.5) * 1e3, 4),
                **_median_delta([a - b for a, b in zip(on, off, strict=True)]),
                "calls_per_request": round(sum(calls_on) / max(1, len(calls_on)), 2),
            }
        result[kind] = {
            "pairs": len(rounds),
            "targets": dict(sorted(rows.items(), key=lambda kv: -abs(kv[1]["delta_us"]))),
        }
    return result


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", required=True)
    ap.add_argument("--deadline", type=float, default=time.time() + 540)
    ap.add_argument("--model", default=os.environ.get("MODEL", "/tmp/tiny-qwen3vl"))
    ap.add_argument("--server-flags", default=os.environ.get("SGLANG_GPU_FLAGS", ""))
    ap.add_argument("--arms", default="on,off,on,off")
    ap.add_argument("--rounds", type=int, default=60)
    ap.add_argument("--gap-ms", type=float, default=60.0)
    ap.add_argument("--concurrency", type=int, default=1, help="clients at once (1: one request at a time)")
    ap.add_argument("--max-tokens", type=int, default=8)
    ap.add_argument("--cpu", action="store_true", help="the CPU demo server (no GPU)")
    ap.add_argument("--paired", type=int, default=0, help="N rounds switch-flipped per request (see above)")
    args = ap.parse_args()
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    probe_dir = out / "probe"
    probe_dir.mkdir(exist_ok=True)
    env = {
        "MMTRACE_PROBE_DIR": str(probe_dir),
        "PYTHONPATH": os.pathsep.join(p for p in (str(PROBE), os.environ.get("PYTHONPATH", "")) if p),
        "SGLANG_MMTRACE_JSONL": str(out / "records.jsonl"),
    }
    if args.paired:
        env["MMTRACE_PROBE_SEGMENTS"] = "1"
    if args.cpu:
        env["PYTHONPATH"] = os.pathsep.join((str(PROBE), str(SHIMS_DIR), os.environ.get("PYTHONPATH", "")))
        cfg = LaunchConfig("cpu demo config probed", default_config(False).args, env)
    else:
        model = ensure_model(Path(args.model))
        flags = (*shlex.split(args.server_flags), "--enable-metrics")
        cfg = LaunchConfig("h200 0.5.17 probed", ("--model-path", str(model), *flags), env)
    workload = Workload(seed=7, nonce=f"probe{int(time.time())}")  # the overhead bench's requests
    blocks = []
    with launched(cfg, Path("/tmp/probe-work"), not args.cpu, 300.0) as target:
        roles = procs.server_processes(target.pid)
        log(f"processes {roles}")
        for i in range(5):  # warm-up (JIT)
            timed_chat(target.base_url, workload.messages("new_image", -1 - i, "warm-up"))
        if args.paired:
            rounds = args.paired
            left = args.deadline - time.time() - 40
            per_round = 6 * (0.1 + args.gap_ms / 1000) + (0.3 if args.cpu else 0.1)
            if rounds * per_round > left:
                rounds = max(1, int(left / per_round))
                log(f"paired: {rounds} rounds fit before the deadline (asked {args.paired})")
            sent = run_paired(target.base_url, workload, rounds, args.gap_ms / 1000, args.max_tokens)
            switchctl.set_level(target.base_url, tuple(switchctl.PARTS))
            pids = {pid: role for role, ps in roles.items() for pid in ps}
            calls = collect_calls(probe_dir, pids)
            (out / "paired.lines.jsonl").write_text("".join(json.dumps(s) + "\n" for s in sent))
            table = paired_table(sent, calls)
            (out / "paired.json").write_text(json.dumps(table, indent=1))
            points = checkpoints(sent, calls)
            (out / "checkpoints.json").write_text(json.dumps(points, indent=1))
            for kind, rows in points.items():
                log(f"{kind}: when each point is reached after the request was written (on - off)")
                for row in rows:
                    log(
                        f"  {row['point']:66s} off {row['off_ms']:8.3f} ms  delta {row['delta_us']:+8.1f} us {row['delta_ci95_us']}"
                    )
            for kind, res in table.items():
                log(f"{kind}: {res['pairs']} pairs")
                for key, row in list(res["targets"].items())[:25]:
                    log(f"  {key:60s} on {row['on_ms']:9.3f} off {row['off_ms']:9.3f} ms  delta {row['delta_us']:+8.1f} us "
                        f"{row['delta_ci95_us']}  calls {row['calls_per_request']}")  # fmt: skip
            return 0
        for b, arm in enumerate(args.arms.split(",")):
            if time.time() + args.rounds * args.concurrency * 0.2 + 10 > args.deadline:
                log(f"stopping before block {b}: deadline")
                break
            switchctl.set_level(target.base_url, level(arm))
            before = snapshot(probe_dir, roles)
            ttft: dict[str, list[float]] = {"new_image": [], "same_image": [], "text": []}

            def client(c: int, b: int = b, ttft: dict[str, list[float]] = ttft) -> None:
                for r in range(args.rounds):
                    for kind in ttft:
                        msgs = workload.messages(kind, r, f"block{b} client{c}")
                        ttft[kind].append(timed_chat(target.base_url, msgs, args.max_tokens)["ttft_s"])
                        if args.concurrency == 1:
                            time.sleep(args.gap_ms / 1000)

            with ThreadPoolExecutor(args.concurrency) as pool:
                for f in [pool.submit(client, c) for c in range(args.concurrency)]:
                    f.result()
            after = snapshot(probe_dir, roles)
            n = 3 * args.rounds * args.concurrency
            block = {
                "block": b,
                "arm": arm,
                "requests": n,
                "ttft_p50_ms": {k: round(quantile(v, 0.5) * 1000, 3) for k, v in ttft.items()},
                "processes": {r: diff(before[r], after[r], n) for r in after if r in before},
            }
            blocks.append(block)
            log(f"block {b} ({arm}): TTFT p50 {block['ttft_p50_ms']} "
                + " ".join(f"{r}: cpu {p['cpu_ms_per_req']} ms own {p['own_us_per_req_total']} us gc {p['gc']}"
                           for r, p in block["processes"].items()))  # fmt: skip
            (out / "probe.json").write_text(json.dumps(blocks, indent=1))
        switchctl.set_level(target.base_url, tuple(switchctl.PARTS))
    return 0


if __name__ == "__main__":
    sys.exit(main())
