"""How late a request's record arrives: response end -> its JSONL line, at fixed request rates.

One real CPU SGLang server (the demo configuration, plugin on, JSONL sink). For each rate, an
open-loop client sends streamed text chat requests (8 output tokens) at that many requests per
second for ``--seconds`` seconds, each on its own thread, and notes the wall time its response ended
(the last byte read). A tail thread reads the JSONL every 5 ms and notes when each rid's line
appears. The delay is line-seen minus response-end: what a ``tail -f`` of the records, or a
dashboard fed by the same collector step, lags behind the client. Spans and metric observations
are made in the same collector step as the JSONL line (``collector.Collector._emit``), so their
delay is this one plus the exporter's own batching.

Per rate: requests sent / answered / with a record, delay p50 / p90 / p99 / max (ms), and the record
coverage p1 / p50. The server saturates above roughly 15-20 text requests/s on 2 cores; past that,
the queue grows and the delay is reported as it is.

    python -m benchmarks.record_delay --rates 1,10,50 --seconds 20 --out benchmarks/results/<folder>
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

from sglang_mmtrace.bench.client import timed_chat
from sglang_mmtrace.bench.records import RecordsTail, rid_keys
from sglang_mmtrace.bench.stats import quantile
from sglang_mmtrace.bench.targets import default_config, launched

from ._common import machine


class LineClock:
    """Wall time at which each rid's JSONL line was first seen (polled every ``every_s``)."""

    def __init__(self, path: Path, every_s: float = 0.005) -> None:
        self.tail = RecordsTail(path)
        self.seen: dict[str, float] = {}
        self._stop = threading.Event()
        self._every = every_s
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not self._stop.is_set():
            self.tail.poll()
            now = time.time()
            for rid in self.tail.by_rid:
                self.seen.setdefault(rid, now)
            time.sleep(self._every)

    def stop(self) -> None:
        self._stop.set()
        self._thread.join()


def run_rate(base_url: str, clock: LineClock, rate: float, seconds: float, tag: str) -> dict[str, Any]:
    ended: dict[str, float] = {}
    failures: list[str] = []
    lock = threading.Lock()

    def one(i: int) -> None:
        msgs = [{"role": "user", "content": f"{tag} {rate} {i}: name one colour and one shape."}]
        t_send = time.time()
        try:
            r = timed_chat(base_url, msgs, max_tokens=8)
        except Exception as exc:  # counted, not raised: a saturated server may time out
            with lock:
                failures.append(type(exc).__name__)
            return
        with lock:
            ended[r["id"]] = t_send + r["e2e_s"]

    threads = []
    n = max(1, int(rate * seconds))
    t0 = time.monotonic()
    for i in range(n):
        delay = t0 + i / rate - time.monotonic()
        if delay > 0:
            time.sleep(delay)
        th = threading.Thread(target=one, args=(i,), daemon=True)
        th.start()
        threads.append(th)
    for th in threads:
        th.join(timeout=300)
    deadline = time.time() + 30
    while time.time() < deadline and any(_rid_seen(clock, rid) is None for rid in ended):
        time.sleep(0.05)
    delays, coverage = [], []
    for rid, t_end in ended.items():
        seen = _rid_seen(clock, rid)
        if seen is not None:
            delays.append((seen - t_end) * 1000)
            rec = clock.tail.find(rid)
            if rec is not None and rec.get("coverage") is not None:
                coverage.append(rec["coverage"])

    def q(values: list[float], p: float, digits: int = 1) -> float | None:
        return round(quantile(values, p), digits) if values else None

    return {
        "rate_rps": rate,
        "sent": n,
        "answered": len(ended),
        "failed": len(failures),
        "with_record": len(delays),
        "achieved_rps": round(len(ended) / max(1e-9, time.monotonic() - t0), 2),
        "delay_ms": {"p50": q(delays, 0.5), "p90": q(delays, 0.9), "p99": q(delays, 0.99), "max": q(delays, 1.0)},
        "coverage": {"p1": q(coverage, 0.01, 4), "p50": q(coverage, 0.5, 4)} if coverage else None,
    }


def _rid_seen(clock: LineClock, rid: str) -> float | None:
    return next((clock.seen[k] for k in rid_keys(rid) if k in clock.seen), None)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rates", default="1,10,50")
    ap.add_argument("--seconds", type=float, default=20.0)
    ap.add_argument("--out", help="results folder (record_delay.json)")
    args = ap.parse_args()
    info = machine()
    work = Path(tempfile.mkdtemp(prefix="record-delay-"))
    results = []
    with launched(default_config(False), work, False) as target:
        assert target.records is not None
        for i in range(3):  # warm-up, not measured
            timed_chat(target.base_url, [{"role": "user", "content": f"warm-up {i}"}])
        clock = LineClock(Path(target.records))
        tag = f"rd{int(time.time())}"
        for rate in (float(r) for r in args.rates.split(",")):
            res = run_rate(target.base_url, clock, rate, args.seconds, tag)
            results.append(res)
            print(json.dumps(res), file=sys.stderr, flush=True)
            time.sleep(2.0)
        clock.stop()
    out = {"machine": info, "seconds_per_rate": args.seconds, "results": results}
    if args.out:
        Path(args.out).mkdir(parents=True, exist_ok=True)
        (Path(args.out) / "record_delay.json").write_text(json.dumps(out, indent=1))
    print(json.dumps(out, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
