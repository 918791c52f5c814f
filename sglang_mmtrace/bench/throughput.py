"""``throughput``: output tokens/s and per-request CPU under load, plugin on vs off, on one instance.

``clients`` streaming clients (64 unless ``--concurrency``) send a mix of new image / same image /
text requests (the ``overhead`` workload, kind drawn per request from a seeded stream) with
``max_tokens`` 256 and ``ignore_eos`` (SGLang's extension of the OpenAI body), so every request
generates the full length. The run is cut into segments of ``segment_s`` seconds whose arm
alternates ABBA by pair (on/off, off/on, ...), the switch flipped at each segment start while the
load keeps running; the first ``settle_s`` seconds after a flip are excluded.

Per segment, over its window: output tokens/s, requests completed, and the CPU seconds (utime +
stime from /proc) of the API process, the scheduler and detokenizer processes and the plugin's
collector, read at the window's ends. The tokens are those streamed inside the window
(``streamed_in``: each request's first token at its client TTFT, its other tokens spread evenly up
to its end), not the tokens of the requests that completed in it: clients that start together
finish together, so a window held whole waves of requests (counting completed requests, a window's
tokens/s jumps between multiples of one wave's and reads nothing between). The CPU is
per request the same way: per the share of each request's time that lies in the window. Per arm:
tokens/s (mean over segments) and CPU milliseconds per request by process. The ratio on/off is the
ratio of the arms' mean tokens/s, with a t interval over segment pairs; ``carryover`` separates a
cost that shows one segment late (a cost that arrives seconds after its request, such as batched
export or garbage collections, is paid in the next segment, under the other arm).
"""

from __future__ import annotations

import random
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np

from .client import send
from .experiments import Options
from .overhead import KINDS, workload_for
from .procs import ACCOUNTED, cpu_by_role, server_processes
from .stats import ratio_of_means_ci
from .switchctl import PARTS, Flipper, SwitchError

EXPERIMENT = "throughput"


def segment_arms(segments_per_arm: int) -> list[str]:
    """ABBA: pair k is (on, off) for even k, (off, on) for odd k, so a linear drift cancels."""
    out: list[str] = []
    for k in range(segments_per_arm):
        out += ["on", "off"] if k % 2 == 0 else ["off", "on"]
    return out


@dataclass(slots=True)
class Done:
    """One finished request, on the monotonic clock."""

    t_start: float
    t_end: float
    kind: str
    ok: bool
    completion_tokens: int
    error: str | None = None
    t_first: float | None = None  # the first token (client TTFT after t_start)


def _overlap(a0: float, a1: float, w0: float, w1: float) -> float:
    return max(0.0, min(a1, w1) - max(a0, w0))


def streamed_in(d: Done, w0: float, w1: float) -> float:
    """Output tokens of ``d`` streamed inside [w0, w1): the first at ``t_first``, the others spread
    evenly over (``t_first``, ``t_end``] (all at ``t_end`` when the first token's time is unknown)."""
    if not d.ok or d.completion_tokens <= 0:
        return 0.0
    tf = d.t_first if d.t_first is not None else d.t_end
    first = 1.0 if w0 <= tf < w1 else 0.0
    rest = d.completion_tokens - 1
    span = d.t_end - tf
    if rest <= 0 or span <= 0:
        return first + (rest if rest > 0 and w0 <= d.t_end < w1 else 0.0)
    return first + rest * _overlap(tf, d.t_end, w0, w1) / span


def window_stats(done: list[Done], w0: float, w1: float) -> dict[str, Any]:
    """Over [w0, w1): requests completed and failed, the tokens streamed (``streamed_in``) and their
    rate, and ``request_share``: the requests' time inside the window, in whole requests."""
    ended = [d for d in done if w0 <= d.t_end < w1]
    ok = [d for d in ended if d.ok]
    tokens = sum(streamed_in(d, w0, w1) for d in done)
    share = sum(
        _overlap(d.t_start, d.t_end, w0, w1) / (d.t_end - d.t_start) for d in done if d.ok and d.t_end > d.t_start
    )
    return {
        "window_s": round(w1 - w0, 3),
        "requests": len(ok),
        "errors": len(ended) - len(ok),
        "request_share": round(share, 3),
        "output_tokens": round(tokens, 1),
        "tokens_per_s": round(tokens / (w1 - w0), 2) if w1 > w0 else None,
        "by_kind": {k: sum(1 for d in ok if d.kind == k) for k in KINDS},
    }


def _valid(segments: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The segments whose arm is certain (their flip was confirmed) and that saw requests."""
    return [s for s in segments if not s.get("flip_error") and s["request_share"]]


def carryover(segments: list[dict[str, Any]]) -> dict[str, Any] | None:
    """How much of the plugin's cost shows in the segment *after* the one that caused it.

    A least-squares fit over the valid segments that follow a valid one, ``tokens/s = base + own x
    (this segment on) + previous x (the segment before on)``: ABBA gives each arm as many segments
    after an 'on' one as after an 'off' one, so ``own`` (what the pair ratio sees) and ``previous`` (a
    cost that arrives seconds late: batched export, collections) separate, and the cost of staying on
    is ``own + previous``: ``steady_ratio`` = ``(base + own + previous) / base``. None with fewer than
    six such segments (three coefficients)."""
    ok = {s["index"]: s for s in _valid(segments)}
    rows = [(1.0, ok[i]["arm"] == "on", ok[i - 1]["arm"] == "on", ok[i]["tokens_per_s"]) for i in ok if i - 1 in ok]
    if len(rows) < 6:
        return None
    x = np.array([r[:3] for r in rows], dtype=float)
    if np.linalg.matrix_rank(x) < 3:
        return None
    y = np.array([r[3] for r in rows])
    coef = np.linalg.lstsq(x, y, rcond=None)[0]
    base, own, previous = (float(v) for v in coef)
    # ordinary least squares' standard errors (residual variance over n - 3 degrees of freedom)
    resid = y - x @ coef
    se = np.sqrt(np.diag(np.linalg.inv(x.T @ x)) * float(resid @ resid) / (len(rows) - 3))
    return {
        "segments": len(rows),
        "base_tokens_per_s": round(base, 2),
        "own": round(own, 2),
        "own_se": round(float(se[1]), 2),
        "previous": round(previous, 2),
        "previous_se": round(float(se[2]), 2),
        "steady_ratio": round((base + own + previous) / base, 4),
    }


def summarize_segments(segments: list[dict[str, Any]]) -> dict[str, Any]:
    """Per arm tokens/s and CPU per request; the on/off ratio over complete segment pairs."""
    valid = _valid(segments)
    arms: dict[str, Any] = {}
    for arm in ("on", "off"):
        segs = [s for s in valid if s["arm"] == arm]
        reqs = sum(s["request_share"] for s in segs)
        cpu = {
            r: sum(s["cpu_s"][r] for s in segs) if segs and all(r in s["cpu_s"] for s in segs) else None
            for r in ACCOUNTED
        }
        arms[arm] = {
            "segments": len(segs),
            "tokens_per_s_mean": round(float(np.mean([s["tokens_per_s"] for s in segs])), 2) if segs else None,
            "requests": sum(s["requests"] for s in segs),
            "cpu_ms_per_request": {
                r: round(v * 1e3 / reqs, 3) if reqs and v is not None else None for r, v in cpu.items()
            },
        }
    by_pair: dict[int, dict[str, float]] = {}
    for s in valid:
        by_pair.setdefault(s["pair"], {})[s["arm"]] = s["tokens_per_s"]
    prs = [(v["off"], v["on"]) for _, v in sorted(by_pair.items()) if "off" in v and "on" in v]
    ratio, lo, hi = ratio_of_means_ci([a for a, _ in prs], [b for _, b in prs])
    cpu_ratio = {
        r: (round(arms["on"]["cpu_ms_per_request"][r] / arms["off"]["cpu_ms_per_request"][r], 4)
            if arms["on"]["cpu_ms_per_request"][r] and arms["off"]["cpu_ms_per_request"][r] else None)
        for r in ACCOUNTED
    }  # fmt: skip
    return {
        "arms": arms,
        "pairs": len(prs),
        "tokens_per_s_ratio_on_off": round(ratio, 4),
        "tokens_per_s_ratio_ci95": [round(lo, 4), round(hi, 4)],
        "cpu_per_request_ratio_on_off": cpu_ratio,
        "carryover": carryover(segments),
    }


def run_throughput(
    base_url: str,
    flipper: Flipper,
    opts: Options,
    api_pid: int | None,
    log: Callable[[str], None] = lambda s: print(s, file=sys.stderr, flush=True),
) -> dict[str, Any]:
    """Run the segments under load and return ``{"config", "segments", "summary", "processes"}``."""
    clients = opts.throughput_clients()
    max_tokens = opts.max_tokens_for(EXPERIMENT)
    workload = workload_for(opts, EXPERIMENT)
    procs = server_processes(api_pid) if api_pid else {}
    arms = segment_arms(opts.segments)
    done: list[Done] = []
    lock = threading.Lock()
    stop = threading.Event()

    def client(ci: int) -> None:
        rng = random.Random(opts.seed * 1000 + ci)
        k = 0
        while not stop.is_set():
            kind = rng.choice(KINDS)
            k += 1
            t0 = time.monotonic()
            res = send(base_url, workload.messages(kind, k, f"tp{ci}"), max_tokens, opts.timeout, {"ignore_eos": True})
            t1 = time.monotonic()
            toks = int((res.usage or {}).get("completion_tokens") or 0)
            t_first = t0 + res.ttft_s if res.ttft_s is not None else None
            with lock:
                done.append(Done(t0, t1, kind, res.ok, toks, res.error, t_first))

    flipper.set(opts.on_parts if arms[0] == "on" else None)
    threads = [threading.Thread(target=client, args=(i,), daemon=True, name=f"tp-client-{i}") for i in range(clients)]
    for t in threads:
        t.start()
    log(f"[throughput] {clients} clients, max_tokens {max_tokens}, {len(arms)} segments of {opts.segment_s:.0f} s")
    segments: list[dict[str, Any]] = []
    try:
        for i, arm in enumerate(arms):
            seg: dict[str, Any] = {"index": i, "pair": i // 2, "arm": arm}
            t_flip = time.monotonic()
            try:
                if i:
                    flipper.set(opts.on_parts if arm == "on" else None)
            except SwitchError as exc:  # the segment's arm is uncertain: excluded from the summary
                seg["flip_error"] = str(exc)[:300]
            seg["flip_s"] = round(time.monotonic() - t_flip, 3)
            time.sleep(max(0.0, t_flip + opts.settle_s - time.monotonic()))
            w0, cpu0 = time.monotonic(), cpu_by_role(procs)
            time.sleep(max(0.0, t_flip + opts.segment_s - time.monotonic()))
            w1, cpu1 = time.monotonic(), cpu_by_role(procs)
            seg["cpu_s"] = {r: round(cpu1[r] - cpu0[r], 3) for r in cpu0}
            seg["_window"] = (w0, w1)
            segments.append(seg)
            log(f"[throughput] segment {i + 1}/{len(arms)} ({arm}) done")
    finally:
        stop.set()
        for t in threads:
            t.join(timeout=opts.timeout + 5)
    for seg in segments:
        w0, w1 = seg.pop("_window")
        seg.update(window_stats(done, w0, w1))
        reqs = seg["request_share"]
        seg["cpu_ms_per_request"] = {r: round(v * 1e3 / reqs, 3) if reqs else None for r, v in seg["cpu_s"].items()}
    errors = [d.error for d in done if not d.ok]
    return {
        "config": {
            "clients": clients,
            "max_tokens": max_tokens,
            "ignore_eos": True,
            "segment_s": opts.segment_s,
            "settle_s": opts.settle_s,
            "segments_per_arm": opts.segments,
            "on_parts": list(opts.on_parts),
            "image_size": list(workload.size),
        },
        "processes": procs,
        "requests_total": len(done),
        "errors_total": len(errors),
        "error_examples": errors[:5],
        "segments": segments,
        "summary": summarize_segments(segments),
    }


def notes(result: dict[str, Any]) -> list[str]:
    s = result["summary"]
    c = result["config"]
    out = [
        f"== throughput: {c['clients']} clients, max_tokens {c['max_tokens']}, {c['segments_per_arm']} segments per arm "
        f"of {c['segment_s']:.0f} s ({c['settle_s']:.0f} s settle excluded)"
        + ("" if c.get("on_parts", list(PARTS)) == list(PARTS) else f"; 'on' = only {','.join(c['on_parts'])}")
    ]
    for arm in ("on", "off"):
        a = s["arms"][arm]
        cpu = ", ".join(f"{r} {v:.2f}" if v is not None else f"{r} -" for r, v in a["cpu_ms_per_request"].items())
        tps = f"{a['tokens_per_s_mean']:.1f}" if a["tokens_per_s_mean"] is not None else "-"
        out.append(
            f"   {arm:<3} {tps} output tokens/s (mean of {a['segments']} segments), {a['requests']} requests; CPU ms/request: {cpu}"
        )
    lo, hi = s["tokens_per_s_ratio_ci95"]
    out.append(
        f"   tokens/s on/off {s['tokens_per_s_ratio_on_off']:.4f} [{lo:.4f}, {hi:.4f}] over {s['pairs']} segment pairs"
    )
    if (co := s.get("carryover")) is not None:
        out.append(
            f"   carry-over fit over {co['segments']} segments: tokens/s {co['base_tokens_per_s']:.0f} "
            f"{co['own']:+.0f} (se {co['own_se']:.0f}, this segment on) {co['previous']:+.0f} "
            f"(se {co['previous_se']:.0f}, the one before on): staying on {co['steady_ratio']:.4f} of off"
        )
    if not result["processes"]:
        out.append("   note: server processes unknown (give --server-pid): no CPU accounting")
    if result["errors_total"]:
        out.append(
            f"   errors: {result['errors_total']} of {result['requests_total']}, e.g. {result['error_examples'][:1]}"
        )
    return out
