"""When a CUDA event record is expensive for the host thread, and whether the driver API is cheaper.

    python3 benchmarks/gpu/record_cost.py [--samples 200] [--out FILE.json]

Inside SGLang on the H200 a mark's ``cudaEventRecord`` costs 12-60 µs of CPU (2 µs in a loop), and
the two around the HF processor cost 4-5x those around the pool copy, on the same thread and stream
(``benchmarks/results/probe-h200-20261201/``). This times one record, the way ``hooks/cuda_marks``
takes it (``ctypes.PyDLL``, GIL held), after each of these, ``--samples`` times, median and p90 µs:

- ``loop``: right after the previous record;
- ``idle``: after 60 ms without CUDA calls (the gap between two requests of the overhead bench);
- ``scrub``: after 64 MiB of host memory were written (the CPU caches hold other work's data);
- ``launches``: right after 50 small kernel launches (the end of a resize or a forward);
- ``copy``: right after a 2 MiB device-to-device copy (the pool copy).

for the runtime's ``cudaEventRecord`` and the driver's ``cuEventRecord`` (the same event and stream
handles), on the current stream (the legacy default stream on a thread that never set one, as the
API's PROC threads) and on a stream of its own (as SGLang's scheduler forward). Also the current
stream's lookup (``torch._C._cuda_getCurrentRawStream``) and a no-op runtime call
(``cudaGetLastError``) after ``idle``: what the call's path costs without the record.

And whether a mark's idle cost is its own or the one the next CUDA call would pay anyway
(``shared idle``): after 60 ms idle, 10 small kernel launches (a forward's first work) alone, and
the same launches right after a record, alternating, ``--samples`` each; the difference of their
medians is what a mark taken before a forward adds to it.
"""

from __future__ import annotations

import argparse
import ctypes
import json
import statistics
import time
from collections.abc import Callable

import torch


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--samples", type=int, default=200)
    ap.add_argument("--out")
    args = ap.parse_args()
    torch.cuda.init()
    x = torch.ones(256, device="cuda")
    src = torch.empty(2 << 20, dtype=torch.int8, device="cuda")
    dst = torch.empty_like(src)
    torch.cuda.synchronize()
    with open("/proc/self/maps") as maps:
        cudart_path = next(line.split()[-1] for line in maps if "/libcudart.so" in line)
    rt, drv = ctypes.PyDLL(cudart_path), ctypes.PyDLL("libcuda.so.1")
    vp = ctypes.c_void_p
    rt.cudaEventCreateWithFlags.argtypes = [ctypes.POINTER(vp), ctypes.c_uint]
    rt.cudaEventRecord.argtypes = [vp, vp]
    drv.cuEventRecord.argtypes = [vp, vp]
    for fn in (rt.cudaEventCreateWithFlags, rt.cudaEventRecord, drv.cuEventRecord, rt.cudaGetLastError):
        fn.restype = ctypes.c_int
    events = []
    for _ in range(4096):
        ev = vp()
        assert rt.cudaEventCreateWithFlags(ctypes.byref(ev), 0) == 0
        events.append(ev.value)
    side = torch.cuda.Stream()
    streams = {"current": torch._C._cuda_getCurrentRawStream(0), "own": side.cuda_stream}
    scrub = torch.zeros(64 << 20, dtype=torch.uint8)
    slot = iter(range(10**9))

    def before(mode: str, stream_name: str) -> None:
        if mode == "idle":
            time.sleep(0.06)
        elif mode == "scrub":
            scrub.add_(1)
        elif mode == "launches":
            with torch.cuda.stream(side if stream_name == "own" else torch.cuda.current_stream()):
                for _ in range(50):
                    x.add_(1.0)
        elif mode == "copy":
            with torch.cuda.stream(side if stream_name == "own" else torch.cuda.current_stream()):
                dst.copy_(src, non_blocking=True)

    def timed(call: Callable[[], int], mode: str, stream_name: str) -> dict[str, float]:
        us = []
        for _ in range(args.samples):
            before(mode, stream_name)
            t0 = time.perf_counter()
            rc = call()
            us.append((time.perf_counter() - t0) * 1e6)
            assert rc == 0, rc
            if mode != "loop":
                torch.cuda.synchronize()
        us.sort()
        return {"median_us": round(statistics.median(us), 2), "p90_us": round(us[int(0.9 * len(us))], 2)}

    out: dict[str, dict[str, float]] = {}
    for api, record in (("runtime", rt.cudaEventRecord), ("driver", drv.cuEventRecord)):
        for stream_name, stream in streams.items():
            for mode in ("loop", "idle", "scrub", "launches", "copy"):
                key = f"{api} {stream_name} {mode}"
                out[key] = timed(lambda r=record, s=stream: r(events[next(slot) % 4096], s), mode, stream_name)
                print(key, out[key], flush=True)
    for name, call in (
        ("stream lookup", lambda: torch._C._cuda_getCurrentRawStream(0) and 0),
        ("cudaGetLastError", rt.cudaGetLastError),
    ):
        out[f"{name} idle"] = timed(call, "idle", "current")
        print(f"{name} idle", out[f"{name} idle"], flush=True)
    current = streams["current"]

    def burst() -> int:
        for _ in range(10):
            x.add_(1.0)
        return 0

    def marked_burst() -> int:
        rc = rt.cudaEventRecord(events[next(slot) % 4096], current)
        return rc or burst()

    variants: dict[str, list[float]] = {"launches alone": [], "record + launches": []}
    for i in range(args.samples):
        for name in sorted(variants, reverse=bool(i % 2)):  # alternate which runs first
            before("idle", "current")
            t0 = time.perf_counter()
            assert (marked_burst if name == "record + launches" else burst)() == 0
            variants[name].append((time.perf_counter() - t0) * 1e6)
            torch.cuda.synchronize()
    medians = {k: statistics.median(v) for k, v in variants.items()}
    out["shared idle"] = {k: round(v, 2) for k, v in medians.items()} | {
        "record adds_us": round(medians["record + launches"] - medians["launches alone"], 2)
    }
    print("shared idle", out["shared idle"], flush=True)
    if args.out:
        with open(args.out, "w") as fh:
            json.dump(out, fh, indent=1)


if __name__ == "__main__":
    main()
