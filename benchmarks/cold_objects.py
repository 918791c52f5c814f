"""What making one of the plugin's per-request objects costs with cold CPU caches, against a list.

    python -m benchmarks.cold_objects [--reps 4000] [--json OUT]

A request makes a few objects of the plugin's on its way to the first token: in the API process its
HTTP exchange's ``HttpCtx`` (the ASGI middleware) and its ``ApiTrace`` (``_init_req_state``), in the
scheduler its ``ReqTrace`` (first radix match) and, per prefill forward, a ``FwdCtx`` with its
``Clock``. ``benchmarks/hotpath.py --cold`` prices whole requests; this prices the objects, to tell
what a request's cold cost is made of (issue 11: the cost that remains is spread over the hooks'
frames and these objects, and trimming helper calls inside the hooks moved nothing measurable).

Each variant is a function that makes one object (the real classes with a request's arguments, or a
stand-in of the same size), all interleaved in random order per repetition, each call after
``hotpath.evict_caches()``; reported is the median in µs and its extra over ``noop`` (a function
returning None: the call itself). The stand-ins: ``list5`` and ``dict5`` (a literal of five fields,
built by bytecode with no type call), ``slots5`` (a ``__slots__`` class with an ``__init__`` setting
five fields), ``slots5_no_init`` (the same class without ``__init__``, fields set by the caller) and
``empty`` (an instance of an empty class: the type call alone).
"""

from __future__ import annotations

import argparse
import json
import random
import statistics
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from sglang_mmtrace.hooks.scheduler import state as ss
from sglang_mmtrace.join.context import ApiTrace, HttpCtx

from ._common import machine
from .hotpath import evict_caches


class _Slots5:
    __slots__ = ("rid", "http", "model", "t_created", "events")

    def __init__(self, rid: str, http: Any, model: str, t: float) -> None:
        self.rid, self.http, self.model, self.t_created, self.events = rid, http, model, t, []


class _Slots5NoInit:
    __slots__ = ("rid", "http", "model", "t_created", "events")


class _Empty:
    pass


def _slots5_no_init() -> Any:
    o = _Slots5NoInit()
    o.rid, o.http, o.model, o.t_created, o.events = "rid", None, "m", 1.0, []
    return o


VARIANTS: dict[str, Callable[[], Any]] = {
    "noop": lambda: None,
    "list5": lambda: ["rid", None, "m", 1.0, []],
    "dict5": lambda: {"rid": "rid", "http": None, "model": "m", "t_created": 1.0, "events": []},
    "slots5": lambda: _Slots5("rid", None, "m", 1.0),
    "slots5_no_init": _slots5_no_init,
    "empty": _Empty,
    "HttpCtx": lambda: HttpCtx(1.0, "/v1/chat/completions"),
    "ApiTrace": lambda: ApiTrace("rid", None, "m", 1.0),
    "ReqTrace": lambda: ss.ReqTrace(1.0, 1.0, "rid"),
    "FwdCtx": lambda: ss.FwdCtx([], 1.0, 1),  # with its Clock (host-timed: no CUDA here)
}


def measure(reps: int, seed: int = 5) -> dict[str, dict[str, float]]:
    rng = random.Random(seed)
    order = list(VARIANTS)
    samples: dict[str, list[int]] = {k: [] for k in order}
    for _ in range(reps):
        rng.shuffle(order)
        for name in order:
            make = VARIANTS[name]
            evict_caches()
            t0 = time.perf_counter_ns()
            make()
            samples[name].append(time.perf_counter_ns() - t0)
    noop = statistics.median(samples["noop"])
    return {
        k: {
            "median_us": round(statistics.median(v) / 1e3, 2),
            "extra_us": round((statistics.median(v) - noop) / 1e3, 2),
        }
        for k, v in samples.items()
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--reps", type=int, default=4000)
    ap.add_argument("--json", help="also write the result here")
    args = ap.parse_args()
    result = {"machine": machine(), "reps": args.reps, "cold": measure(args.reps)}
    for name, r in result["cold"].items():
        print(f"{name:15s} {r['median_us']:7.2f} µs cold  (+{r['extra_us']:.2f} over noop)")
    if args.json:
        Path(args.json).parent.mkdir(parents=True, exist_ok=True)
        Path(args.json).write_text(json.dumps(result, indent=1) + "\n")


if __name__ == "__main__":
    main()
