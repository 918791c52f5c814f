"""When a CUDA event record is expensive for the host thread, and whether the driver API is cheaper.

    python3 benchmarks/gpu/record_cost.py [--samples 200] [--out FILE.json] [--forward-only]
        [--plugin-before OLD_cuda_marks.py]

Inside SGLang on the H200 a mark's ``cudaEventRecord`` costs 12-60 µs of CPU (2 µs in a loop), and
the two around the HF processor cost 4-5x those around the pool copy, on the same thread and stream
(``probe_017.py``'s per-caller mark times). This times one record, the way ``hooks/cuda_marks``
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
the same launches right after a record, alternating, ``--samples`` each; the median of their paired
differences (one per round, with a bootstrap 95% interval) is what a mark taken before a forward
adds to it. The forward's variants below are reported the same way, each against no marks.

And what a prefill's three marks add to it as a whole (``forward``): after 60 ms idle, on a stream of
its own, a forward-like sequence (3 small launches of preparation, 40 of forward, 8 of sampling)
without marks and with the scheduler's three (before the forward, between forward and sampling,
after sampling), alternating, ``--samples`` each: the host time to issue it (the scheduler thread's
cost) and the time until the stream has finished it (what a synchronizing reader waits). A
difference well above three records' cost amid work (``launches``) would mean a mark also slows
what follows it. Its variants say where a mark's cost goes: the first mark alone, the last two alone,
three records of events made without timing (``cudaEventDisableTiming``), three through the driver
(``cuEventRecord``), and three through the plugin's own path (``hooks/cuda_marks.Marks.mark``: the
current stream's lookup, the ring, the record), also of an older copy of that file
(``--plugin-before``), to compare a change in one run. ``--forward-only`` runs just these.
"""

from __future__ import annotations

import argparse
import ctypes
import json
import statistics
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--samples", type=int, default=200)
    ap.add_argument("--out")
    ap.add_argument("--forward-only", action="store_true", help="only the forward scenario and its variants")
    ap.add_argument(
        "--plugin-before", help="another copy of hooks/cuda_marks.py: its marks as one more forward variant"
    )
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

    def created(flags: int) -> list[int]:
        out = []
        for _ in range(4096):
            ev = vp()
            assert rt.cudaEventCreateWithFlags(ctypes.byref(ev), flags) == 0
            out.append(ev.value)
        return out

    events, untimed = created(0), created(2)  # 2: cudaEventDisableTiming
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
    for api, record in () if args.forward_only else (("runtime", rt.cudaEventRecord), ("driver", drv.cuEventRecord)):
        for stream_name, stream in streams.items():
            for mode in ("loop", "idle", "scrub", "launches", "copy"):
                key = f"{api} {stream_name} {mode}"
                out[key] = timed(lambda r=record, s=stream: r(events[next(slot) % 4096], s), mode, stream_name)
                print(key, out[key], flush=True)
    for name, call in (
        ()
        if args.forward_only
        else (
            ("stream lookup", lambda: torch._C._cuda_getCurrentRawStream(0) and 0),
            ("cudaGetLastError", rt.cudaGetLastError),
        )
    ):
        out[f"{name} idle"] = timed(call, "idle", "current")
        print(f"{name} idle", out[f"{name} idle"], flush=True)
    current, own = streams["current"], streams["own"]

    def alternated(
        variants: dict[str, Callable[[], int]], finish: bool = False, baseline: str | None = None
    ) -> dict[str, Any]:
        """Each variant after 60 ms idle, ``--samples`` times, which runs first alternating; the median
        µs to issue it (and with ``finish`` until the GPU has finished it) per variant; with
        ``baseline``, each other variant's paired difference to it (same round), median and bootstrap
        95% interval: ``<variant> add <issue|done>_us``, ``..._ci95``."""
        us: dict[str, list[float]] = {k: [] for k in variants}
        done: dict[str, list[float]] = {k: [] for k in variants}
        for i in range(args.samples):
            for name in sorted(variants, reverse=bool(i % 2)):
                before("idle", "current")
                t0 = time.perf_counter()
                assert variants[name]() == 0
                us[name].append((time.perf_counter() - t0) * 1e6)
                torch.cuda.synchronize()
                done[name].append((time.perf_counter() - t0) * 1e6)
        series = {"issue": us} | ({"done": done} if finish else {})
        out: dict[str, Any] = {}
        for what, by in series.items():
            out |= {f"{k} {what}_us": round(statistics.median(v), 2) for k, v in by.items()}
            for k in by if baseline is not None else ():
                if k != baseline:
                    d = [a - b for a, b in zip(by[k], by[baseline], strict=True)]
                    out[f"{k} add {what}_us"] = round(statistics.median(d), 2)
                    out[f"{k} add {what}_ci95"] = [round(x, 2) for x in stats.bootstrap_median_ci(d)]
        return out

    def burst(n: int = 10) -> int:
        for _ in range(n):
            x.add_(1.0)
        return 0

    def marked_burst() -> int:
        rc = rt.cudaEventRecord(events[next(slot) % 4096], current)
        return rc or burst()

    if not args.forward_only:
        out["shared idle"] = alternated(
            {"launches alone": burst, "record + launches": marked_burst}, baseline="launches alone"
        )
        print("shared idle", out["shared idle"], flush=True)

    def forward(mark: Callable[[], int] | None, at: tuple[bool, bool, bool] = (True, True, True)) -> int:
        with torch.cuda.stream(side):
            rc = burst(3)
            for n, marked in zip((40, 8, 0), at, strict=True):
                if mark is not None and marked:
                    rc = rc or mark()
                rc = rc or burst(n)
        return rc

    def runtime_mark(pool: list[int] = events) -> int:
        return rt.cudaEventRecord(pool[next(slot) % 4096], own)

    def plugin_forward(path: str) -> Callable[[], int]:
        """A forward marked by the plugin's path (stream lookup, capture check, ring, record) of ``path``."""
        marks = plugin_marks(path)
        return lambda: forward(lambda: 0 if marks.mark() is not None else 1)

    variants: dict[str, Callable[[], int]] = {
        "no marks": lambda: forward(None),
        "three marks": lambda: forward(runtime_mark),
        "first mark only": lambda: forward(runtime_mark, (True, False, False)),
        "last two marks": lambda: forward(runtime_mark, (False, True, True)),
        "three untimed marks": lambda: forward(lambda: runtime_mark(untimed)),
        "three driver marks": lambda: forward(lambda: drv.cuEventRecord(events[next(slot) % 4096], own)),
        "three plugin marks": plugin_forward(PLUGIN_MARKS),
    }
    if args.plugin_before:
        variants["three plugin marks (before)"] = plugin_forward(args.plugin_before)
    out["forward"] = alternated(variants, finish=True, baseline="no marks")
    for name in variants:
        print(f"forward {name}", {k: v for k, v in out["forward"].items() if k.startswith(name)}, flush=True)
    if args.out:
        with open(args.out, "w") as fh:
            json.dump(out, fh, indent=1)


PACKAGE = Path(__file__).resolve().parents[2] / "sglang_mmtrace"
PLUGIN_MARKS = str(PACKAGE / "hooks" / "cuda_marks.py")


def load(path: str) -> Any:
    """A module of the package loaded from its file alone, as a module of its own: ``hooks/cuda_marks``
    needs only the standard library and torch, ``bench/stats`` numpy; the device's first install call
    has neither the package nor its other dependencies."""
    import importlib.util

    spec = importlib.util.spec_from_file_location(f"loaded_{abs(hash(path))}", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


stats = load(str(PACKAGE / "bench" / "stats.py"))


def plugin_marks(path: str) -> Any:
    """The plugin's marks (``hooks/cuda_marks`` loaded from ``path``: each file its own module, with its
    own ring) on the current device, taken inside ``torch.cuda.stream(side)`` as the scheduler's are
    inside SGLang's forward stream."""
    marks = load(path).device_marks()
    assert marks is not None, "no CUDA runtime found for the plugin's marks"
    marks.mark()  # creates the ring, as a scheduler's first (warm-up) mark does
    return marks


if __name__ == "__main__":
    main()
