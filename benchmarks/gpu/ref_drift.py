"""How well a reference mark places later marks on the host timeline, as it ages (issue 11).

    python3 benchmarks/gpu/ref_drift.py [--seconds 5] [--every-ms 25] [--out FILE.json]

The plugin places a CUDA mark on the host's ``perf_counter`` timeline by its GPU offset from a
reference mark whose host time is known (``hooks/cuda_marks.Reference``), and a device's reference
serves the work that starts within ``REF_TTL_S`` (0.5 s) of it. Two things can make a placement
wrong: the reference's own host time (read right after its record call, so late by up to that
call's time) and the drift of the GPU's event clock against the host's clock, which grows with the
reference's age. This measures both on an idle GPU, the way the plugin takes its marks (its own
``hooks/cuda_marks.py``, loaded by file): one reference, then every ``--every-ms`` for
``--seconds`` a probe mark, each after the stream has finished its work (so the GPU records it as
soon as it is issued), with the host time just before and just after its record call. When all are
taken, each probe's placement (the reference's host time plus the probe's GPU offset from it) is
compared with its record call's host window: the error is the placement minus the window's middle.

Reports the error's median and largest magnitude per age bucket, the linear drift fitted over all
probes (ppm: µs of error gained per second of age), and the record calls' windows. The host
synchronizes here between probes (a benchmark, not the plugin: the plugin never does). Runs with
the device's base torch (the first install call), like ``record_cost.py``.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from record_cost import PLUGIN_MARKS, load

BUCKETS_S = (0.1, 0.25, 0.5, 1.0, 2.0, 5.0, float("inf"))


def measure(
    marks: Any, ref_mark: Callable[[], Any], idle: Callable[[], None], seconds: float, every_s: float
) -> list[dict[str, float]]:
    """Probes of one reference: age (s), placement error and record window (µs). ``ref_mark()`` makes
    the reference (``Marks.mark_reference``); ``idle()`` returns once the GPU has finished its work."""
    clock = time.perf_counter
    idle()
    ref = ref_mark()
    assert ref is not None, "the reference mark failed"
    taken = []
    end = ref.taken + seconds
    while clock() < end:
        time.sleep(every_s)
        idle()
        h0 = clock()
        m = marks.mark()
        h1 = clock()
        if m is not None:
            taken.append((m, h0, h1))
    idle()
    probes = []
    for m, h0, h1 in taken:
        s = marks.elapsed_s(ref.seq, m)
        if isinstance(s, float):
            placed = ref.t + s
            probes.append(
                {
                    "age_s": round(h0 - ref.taken, 6),
                    "error_us": round((placed - (h0 + h1) / 2) * 1e6, 3),
                    "window_us": round((h1 - h0) * 1e6, 3),
                }
            )
    return probes


def summarize(probes: list[dict[str, float]]) -> dict[str, Any]:
    """Per age bucket: probes, median error and largest |error| (µs); the fitted drift (ppm); windows."""
    buckets = []
    lo = 0.0
    for hi in BUCKETS_S:
        errs = [p["error_us"] for p in probes if lo <= p["age_s"] < hi]
        if errs:
            buckets.append(
                {
                    "age_s": [lo, hi],
                    "probes": len(errs),
                    "error_median_us": round(statistics.median(errs), 3),
                    "error_max_abs_us": round(max(abs(e) for e in errs), 3),
                }
            )
        lo = hi
    ages = [p["age_s"] for p in probes]
    errs = [p["error_us"] for p in probes]
    slope = statistics.linear_regression(ages, errs).slope if len(set(ages)) > 1 else float("nan")
    windows = [p["window_us"] for p in probes]
    return {
        "probes": len(probes),
        "buckets": buckets,
        "drift_ppm": round(slope, 3),  # µs of error per s of age
        "record_window_us": {"median": round(statistics.median(windows), 3), "max": round(max(windows), 3)}
        if windows
        else {},
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--seconds", type=float, default=5.0)
    ap.add_argument("--every-ms", type=float, default=25.0)
    ap.add_argument("--out")
    args = ap.parse_args()
    import torch

    torch.cuda.init()  # the marks use CUDA only once the process has (``device_marks``: None before)
    cuda_marks = load(PLUGIN_MARKS)
    marks = cuda_marks.device_marks()
    assert marks is not None, "no CUDA runtime found for the plugin's marks"
    marks.mark()  # creates the ring, as a process's first mark does
    probes = measure(
        marks,
        lambda: marks.mark_reference(time.perf_counter),
        torch.cuda.synchronize,
        args.seconds,
        args.every_ms / 1000,
    )
    result = {
        "benchmark": "ref_drift",
        "device": torch.cuda.get_device_name(),
        "ref_ttl_s": cuda_marks.REF_TTL_S,
        "seconds": args.seconds,
        "every_ms": args.every_ms,
        "summary": summarize(probes),
        "probes": probes,
    }
    s = result["summary"]
    print(f"ref_drift: {s['probes']} probes over {args.seconds} s, drift {s['drift_ppm']} ppm, "
          f"record window {s['record_window_us']}")  # fmt: skip
    for b in s["buckets"]:
        print(f"  age {b['age_s'][0]}-{b['age_s'][1]} s: n={b['probes']} median error {b['error_median_us']} µs, "
              f"max |error| {b['error_max_abs_us']} µs")  # fmt: skip
    if args.out:
        Path(args.out).write_text(json.dumps(result, indent=1))


if __name__ == "__main__":
    main()
