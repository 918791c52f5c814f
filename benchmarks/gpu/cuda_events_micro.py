"""What a CUDA event costs the host thread, per operation, in the ways the plugin could use one.

    python3 benchmarks/gpu/cuda_events_micro.py [--n 2000]

Each variant runs ``--n`` times between small kernel launches (a live stream, as in a forward) and
prints host microseconds per operation (median of 5 repeats). Written to choose how the scheduler
and multimodal hooks take their GPU marks (issue 11): creating an event per mark, reusing pooled
events, passing the stream or letting torch look it up, reading with ``query``/``elapsed_time``.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time

import torch


def per_op_us(fn, n: int, setup=None) -> float:
    """Host µs per ``fn(state, i)`` call, median of 5 runs of ``n`` calls (``setup()`` makes the state)."""
    runs = []
    for _ in range(5):
        state = setup() if setup else None
        x = torch.empty(256, device="cuda")
        torch.cuda.synchronize()
        t = 0.0
        for i in range(n):
            x.add_(1.0)  # keep the stream busy, as in a forward
            t0 = time.perf_counter()
            fn(state, i)
            t += time.perf_counter() - t0
        torch.cuda.synchronize()
        runs.append(t / n * 1e6)
    return round(statistics.median(runs), 3)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--n", type=int, default=2000)
    n = ap.parse_args().n
    torch.cuda.init()
    stream = torch.cuda.current_stream()
    out: dict[str, float] = {}
    keep: list = []

    out["perf_counter"] = per_op_us(lambda s, i: time.perf_counter(), n)
    out["current_stream()"] = per_op_us(lambda s, i: torch.cuda.current_stream(), n)
    out["is_current_stream_capturing()"] = per_op_us(lambda s, i: torch.cuda.is_current_stream_capturing(), n)
    out["Event() + record() [new event, dropped]"] = per_op_us(
        lambda s, i: keep.append(torch.cuda.Event(enable_timing=True).record()), n
    )
    keep.clear()

    def new_record_stream(s, i):
        ev = torch.cuda.Event(enable_timing=True)
        ev.record(stream)
        keep.append(ev)

    out["Event() + record(stream) [new event, kept]"] = per_op_us(new_record_stream, n)
    t0 = time.perf_counter()
    keep.clear()
    out["destroy (del) per event"] = round((time.perf_counter() - t0) / (5 * n) * 1e6, 3)

    def pool(size: int = n):
        evs = [torch.cuda.Event(enable_timing=True) for _ in range(size)]
        for ev in evs:
            ev.record(stream)
        torch.cuda.synchronize()
        return evs

    out["pooled record(stream) [reuse]"] = per_op_us(lambda evs, i: evs[i].record(stream), n, pool)
    out["pooled record() [reuse, torch looks up the stream]"] = per_op_us(lambda evs, i: evs[i].record(), n, pool)

    def recorded():
        evs = pool()
        for ev in evs:
            ev.record(stream)
        torch.cuda.synchronize()
        return evs

    out["query() [completed]"] = per_op_us(lambda evs, i: evs[i].query(), n, recorded)
    out["elapsed_time() [completed]"] = per_op_us(lambda evs, i: evs[0].elapsed_time(evs[i]), n, recorded)
    # The same with a second Python thread that wants the GIL (as an event loop or worker thread does):
    # torch releases the GIL around each CUDA event call, and the other thread may keep it till the
    # switch interval; a call made with the GIL held (ctypes.PyDLL) does not hand it over.
    import threading

    from sglang_mmtrace.hooks import cuda_marks

    rt = cuda_marks.runtime()
    assert rt is not None, "no shared CUDA runtime in this process"
    raw = torch._C._cuda_getCurrentRawStream(torch.cuda.current_device())
    out["getCurrentRawStream()"] = per_op_us(lambda s, i: torch._C._cuda_getCurrentRawStream(0), n)
    out["pooled cudaEventRecord via ctypes.PyDLL (GIL held)"] = per_op_us(
        lambda evs, i: rt.record(evs[i].cuda_event, raw), n, pool
    )
    # The plugin's marks agree with torch's events around the same GPU work.
    marks = cuda_marks.device_marks()
    assert marks is not None, "no CUDA runtime found for the marks"
    a = torch.randn(2048, 2048, device="cuda")
    agree = []
    for _ in range(20):
        t0, m0 = torch.cuda.Event(enable_timing=True), marks.mark()
        t0.record()
        for _ in range(5):
            a = (a @ a).tanh_()
        m1, t1 = marks.mark(), torch.cuda.Event(enable_timing=True)
        t1.record()
        torch.cuda.synchronize()
        agree.append((marks.elapsed_s(m0, m1) * 1e3, t0.elapsed_time(t1)))
    out["marks vs torch events: max |diff| ms"] = round(max(abs(x - y) for x, y in agree), 4)
    out["marks vs torch events: median ms"] = round(statistics.median(x for x, _ in agree), 4)
    out["marks mark()"] = per_op_us(lambda s, i: marks.mark(), n)
    stop = threading.Event()

    def spin() -> None:
        x = 0
        while not stop.is_set():
            x += 1

    m = 40
    pools = [pool(m) for _ in range(10)]  # made before the spinner starts (each record would wait)
    th = threading.Thread(target=spin, daemon=True)
    th.start()
    out["contended: pooled record(stream)"] = per_op_us(lambda evs, i: evs[i].record(stream), m, pools.pop)
    out["contended: Event() + record()"] = per_op_us(
        lambda s, i: keep.append(torch.cuda.Event(enable_timing=True).record()), m
    )
    out["contended: pooled cudaEventRecord via ctypes.PyDLL"] = per_op_us(
        lambda evs, i: rt.record(evs[i].cuda_event, raw), m, pools.pop
    )
    out["contended: perf_counter"] = per_op_us(lambda s, i: time.perf_counter(), m)
    out["contended: cuda_marks mark()"] = per_op_us(lambda s, i: marks.mark(), m)
    stop.set()
    print(json.dumps(out, indent=1))


if __name__ == "__main__":
    main()
