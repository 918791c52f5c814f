"""What one hooked call costs with cold CPU caches: wrapt's FunctionWrapper, ``patch.hooked``'s closure, a ``Direct`` hook.

    python -m benchmarks.cold_wrappers [--reps 400] [--json OUT]

In a server a hook never runs twice in a row: SGLang's own work runs between two of its calls and
evicts what the call touched, so what a hook costs there is its cost with cold caches, not the warm
loop of a microbenchmark (``benchmarks/hotpath.py --cold`` shows the same for whole requests). Per
variant, a method of a stand-in class is called once per repetition (a coroutine method: created and
run to its end), all variants interleaved, each call after ``hotpath.evict_caches()`` (cold) or right
after the previous one (warm); reported is the median extra over the unhooked method of the same
kind, in µs. Variants:

- ``sync interval``: an interval hook (enter and exit steps that do nothing) on a sync method, on and
  off by the switch's gate, installed three ways: its wrapt-convention form by wrapt
  (``FunctionWrapper`` with ``enabled``, as before issue 11) and by ``patch.hooked``'s closure (what
  sync targets got until ``Direct``), and ``base.interval``'s own hook, which ``patch.hooked`` builds
  into the target's replacement (``patch.Direct``: one frame).
- ``async interval`` / ``async before``: the same interval hook, and a ``before`` hook, on a coroutine
  method: their wrapt-convention forms by wrapt (what coroutine targets got until ``Direct`` covered
  them) and ``base.interval``'s / ``base.before``'s own hooks installed by ``patch.hooked`` (now).
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from pathlib import Path
from typing import Any

import wrapt

from sglang_mmtrace.hooks.base import before, interval
from sglang_mmtrace.patch import hooked
from sglang_mmtrace.telemetry import contained

from .hotpath import evict_caches


def _target_class() -> type:
    class Target:
        def method(self, a: int, b: int = 1) -> int:
            return a + b

        async def amethod(self, a: int, b: int = 1) -> int:
            return a + b

    return Target


def _enter(instance: Any, args: tuple, kwargs: dict) -> int:
    return 1


def _exit(*args: Any) -> None:
    return None


def _convention(wrapped: Any, instance: Any, args: tuple, kwargs: dict) -> Any:
    """The interval hook in wrapt's convention: guarded enter step, timed call, guarded exit step."""
    st = None
    try:
        st = _enter(instance, args, kwargs)
    except Exception as e:
        contained("bench", e)
    result = exc = None
    t0 = time.perf_counter()
    try:
        result = wrapped(*args, **kwargs)
        return result
    except BaseException as e:
        exc = e
        raise
    finally:
        try:
            _exit(st, t0, time.perf_counter(), instance, args, kwargs, result, exc)
        except Exception as e:
            contained("bench", e)


async def _async_convention(wrapped: Any, instance: Any, args: tuple, kwargs: dict) -> Any:
    """The interval hook on a coroutine target in wrapt's convention (``base.interval``'s until ``Direct``)."""
    st = None
    try:
        st = _enter(instance, args, kwargs)
    except Exception as e:
        contained("bench", e)
    result = exc = None
    t0 = time.perf_counter()
    try:
        result = await wrapped(*args, **kwargs)
        return result
    except BaseException as e:
        exc = e
        raise
    finally:
        try:
            _exit(st, t0, time.perf_counter(), instance, args, kwargs, result, exc)
        except Exception as e:
            contained("bench", e)


def _before_convention(wrapped: Any, instance: Any, args: tuple, kwargs: dict) -> Any:
    """The before hook in wrapt's convention (``base.before``'s on a coroutine target until ``Direct``)."""
    try:
        _enter(instance, args, kwargs)
    except Exception as e:
        contained("bench", e)
    return wrapped(*args, **kwargs)


def _installed(attr: str, install: Any) -> Any:
    """An instance of a fresh stand-in class whose ``attr`` is replaced by ``install(cls)``."""
    cls = _target_class()
    setattr(cls, attr, install(cls))
    return cls()


def variants() -> dict[str, tuple[str, Any]]:
    """Variant name -> (the method to call, the object), ``plain``/``plain async`` unhooked."""
    direct = interval("bench", _exit, _enter).make("sync")
    out: dict[str, tuple[str, Any]] = {
        "plain": ("method", _target_class()()),
        "plain async": ("amethod", _target_class()()),
    }
    for name, on in (("on", [True]), ("off", [])):
        for label, install in (
            ("wrapt", lambda cls, on=on: wrapt.FunctionWrapper(cls.__dict__["method"], _convention, on)),
            ("closure", lambda cls, on=on: hooked(cls, cls.__dict__["method"], _convention, on)),
            ("Direct", lambda cls, on=on: hooked(cls, cls.__dict__["method"], direct, on)),
        ):
            out[f"sync interval, {label}, switch {name}"] = ("method", _installed("method", install))
    for label, convention, built in (
        ("async interval", _async_convention, interval("bench", _exit, _enter).make("async")),
        ("async before", _before_convention, before("bench", _enter).make("async")),
    ):
        out[f"{label}, wrapt"] = (
            "amethod",
            _installed("amethod", lambda cls, c=convention: wrapt.FunctionWrapper(cls.__dict__["amethod"], c, [True])),
        )
        out[f"{label}, Direct"] = (
            "amethod",
            _installed("amethod", lambda cls, d=built: hooked(cls, cls.__dict__["amethod"], d, [True])),
        )
    return out


def _run(coro: Any) -> Any:
    """Run a coroutine that never suspends to its end, as an event loop's step would."""
    try:
        coro.send(None)
    except StopIteration as stop:
        return stop.value
    raise RuntimeError("the stand-in coroutine suspended")


def measure(reps: int, cold: bool) -> dict[str, float]:
    objs = variants()
    samples: dict[str, list[int]] = {k: [] for k in objs}
    for _ in range(reps):
        for name, (attr, obj) in objs.items():
            coroutine = attr == "amethod"
            if cold:
                evict_caches()
            t0 = time.perf_counter_ns()
            if coroutine:
                _run(obj.amethod(1, b=2))
            else:
                obj.method(1, b=2)
            samples[name].append(time.perf_counter_ns() - t0)
    base = {k: statistics.median(samples[k]) for k in ("plain", "plain async")}
    return {"plain_us": round(base["plain"] / 1e3, 2), "plain_async_us": round(base["plain async"] / 1e3, 2)} | {
        k: round((statistics.median(v) - base["plain async" if objs[k][0] == "amethod" else "plain"]) / 1e3, 2)
        for k, v in samples.items()
        if not k.startswith("plain")
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--reps", type=int, default=400)
    ap.add_argument("--json", help="also write the result here")
    args = ap.parse_args()
    result = {"warm_extra_us": measure(args.reps, False), "cold_extra_us": measure(args.reps, True)}
    print(json.dumps(result, indent=1))
    if args.json:
        Path(args.json).parent.mkdir(parents=True, exist_ok=True)
        Path(args.json).write_text(json.dumps(result, indent=1) + "\n")


if __name__ == "__main__":
    main()
