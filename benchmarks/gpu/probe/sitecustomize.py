"""Benchmark-only probe (``probe_017.py`` puts this folder on the server's PYTHONPATH): what the
plugin costs each SGLang process, measured inside it.

In every Python process that has ``MMTRACE_PROBE_DIR`` set, it:

- wraps each hook the plugin applies (``sglang_mmtrace.plugin.apply``) with a timer of the hook's
  *own* time: its whole duration minus the wrapped SGLang call's (for coroutine hooks, the same
  around the await). A hook built into its target's replacement (``patch.Direct``, every sync and
  coroutine hook since 2026-12-03) stays built in: the probe builds it around a timed target and
  times the result, so its figures are the real path's plus the probe's two timers. Per hook id:
  calls, own seconds, and the wrapped SGLang call's seconds (in both arms: SGLang's own code taking
  longer with the plugin on is a cost no hook timer sees);
- times the CUDA-mark helpers (``hooks/cuda_marks.py``: each runtime call, ``mark``, ``elapsed_s``,
  ``device_marks``) per thread kind (``@main``: the process's main thread, ``@worker``: any other),
  wall and thread CPU time (in the slot of the wrapped call's time), and the calls over 20 µs;
- times the garbage collector (``gc.callbacks``): collections, seconds and objects collected (garbage
  in reference cycles) per generation;
- writes those, with the process's CPU times and thread count, to ``MMTRACE_PROBE_DIR/<pid>.json``
  every second from a daemon thread (the probe's own cost, not the plugin's);
- on SIGUSR1, counts the plugin's per-request objects still alive (``ApiTrace``, ``HttpCtx``,
  ``ReqTrace``, ``FwdCtx``), runs a full collection and counts again, appending a line to
  ``MMTRACE_PROBE_DIR/<pid>.live.txt``.

With ``MMTRACE_PROBE_SEGMENTS=1`` it times SGLang's own functions instead (each hook's target, under
the plugin's hook, in both arms of the switch: ``_segment_timer``), keeps every call's start and end,
and writes them to ``<pid>.calls.json`` when the driver touches ``MMTRACE_PROBE_DIR/dump-calls``
(``probe_017.py --paired``); the hooks and the CUDA helpers are then left untimed, so that the
plugin-on arm carries no probe cost the off arm does not.

The driver reads the files before and after a block of requests and divides the differences by the
requests. Never fails the host: any error leaves the process unprobed. A ``sitecustomize`` further
along ``sys.path`` (the CPU harness's shims) still runs, after the probe.
"""

from __future__ import annotations

import os

if os.environ.get("MMTRACE_PROBE_DIR") and os.environ.get("MMTRACE_PROBE_PID") != str(os.getpid()):
    os.environ["MMTRACE_PROBE_PID"] = str(os.getpid())  # once per process, however often this runs
    try:
        import contextlib
        import gc
        import json
        import sys
        import threading
        import time

        _dir = os.environ["MMTRACE_PROBE_DIR"]
        _now = time.perf_counter
        _own: dict[str, list[float]] = {}
        _gc: dict[str, list[float]] = {}
        _gc_t0 = [0.0]

        def _on_gc(phase: str, info: dict) -> None:
            if phase == "start":
                _gc_t0[0] = _now()
            else:
                slot = _gc.setdefault(str(info.get("generation")), [0, 0.0, 0])
                slot[0] += 1
                slot[1] += _now() - _gc_t0[0]
                slot[2] += info.get("collected", 0)  # unreachable objects: garbage only a collection frees

        gc.callbacks.append(_on_gc)

        import contextvars

        _inner = contextvars.ContextVar("mmtrace_probe_inner")  # this call's [wrapped SGLang call's seconds]

        def _count(slot: list, whole: float, inner: float) -> None:
            """One timed hook call into its slot: calls, own seconds (``whole`` minus the wrapped
            call's ``inner``), the wrapped call's seconds. Called after the clock was read."""
            slot[0] += 1
            slot[1] += whole - inner
            slot[2] += inner

        def _timed_direct(hook_id: str, kind: str, direct):
            """A ``Direct`` hook timed as it runs (built into its target's replacement): the target it is
            built around is timed as the wrapped call, per call in a context variable (a coroutine hook's
            task, a sync hook's thread)."""
            slot = _own.setdefault(hook_id, [0, 0.0, 0.0])

            def build(func, on, bound):
                if kind == "async":

                    async def inner_async(*a, **k):
                        t = _now()
                        try:
                            return await func(*a, **k)
                        finally:
                            _inner.get()[0] += _now() - t

                    hook = direct.build(inner_async, on, bound)

                    async def probed_async(*a, **k):
                        cell = [0.0]
                        token = _inner.set(cell)
                        t0 = _now()
                        try:
                            return await hook(*a, **k)
                        finally:
                            _count(slot, _now() - t0, cell[0])
                            _inner.reset(token)

                    return probed_async

                def inner(*a, **k):
                    t = _now()
                    try:
                        return func(*a, **k)
                    finally:
                        _inner.get()[0] += _now() - t

                hook = direct.build(inner, on, bound)

                def probed(*a, **k):
                    cell = [0.0]
                    token = _inner.set(cell)
                    t0 = _now()
                    try:
                        return hook(*a, **k)
                    finally:
                        _count(slot, _now() - t0, cell[0])
                        _inner.reset(token)

                return probed

            return _patch.Direct(build)

        def _timed(hook_id: str, kind: str, wrapper):
            if isinstance(wrapper, _patch.Direct) and kind in ("sync", "async"):
                return _timed_direct(hook_id, kind, wrapper)
            slot = _own.setdefault(hook_id, [0, 0.0, 0.0])
            if kind == "async":

                async def timed_async(wrapped, instance, args, kwargs):
                    inner = [0.0]

                    async def call(*a, **k):
                        t = _now()
                        try:
                            return await wrapped(*a, **k)
                        finally:
                            inner[0] += _now() - t

                    t0 = _now()
                    try:
                        return await wrapper(call, instance, args, kwargs)
                    finally:
                        _count(slot, _now() - t0, inner[0])

                return timed_async
            if kind != "sync":
                return wrapper

            def timed_sync(wrapped, instance, args, kwargs):
                inner = [0.0]

                def call(*a, **k):
                    t = _now()
                    try:
                        return wrapped(*a, **k)
                    finally:
                        inner[0] += _now() - t

                t0 = _now()
                try:
                    return wrapper(call, instance, args, kwargs)
                finally:
                    _count(slot, _now() - t0, inner[0])

            return timed_sync

        import sglang_mmtrace.patch as _patch
        import sglang_mmtrace.plugin as _plugin  # imports ``apply`` by name: replace it there

        _apply = _patch.apply
        _segments = os.environ.get("MMTRACE_PROBE_SEGMENTS") == "1"
        _calls: dict[str, list[float]] = {}  # target's hook id -> [start, end, start, end, ...]
        _CALLS_MAX = 400_000

        def _segment_timer(hook_id, target, res) -> None:
            """Time SGLang's own function under the plugin's hook, in both arms: the timer replaces
            the target before the plugin hooks it (``patch.apply``'s own replacement and re-binding,
            as a ``Direct`` hook), so the plugin's hook wraps the timer and the switch puts the timer
            (the hook's "original") back while off. Each call's start and end (``perf_counter``) go
            into a flat list. The scheduler's receive poll (thousands of calls per request, idle
            time) is left untimed; a target already timed (a second hook on it, whose original is the
            first hook, carrying the mark by ``update_wrapper``) is not timed twice."""
            import types

            original = res.original
            raw = original.__func__ if isinstance(original, staticmethod | classmethod) else original
            kind = _patch.kind_of(original)
            if hook_id == "scheduler.recv_requests" or not isinstance(raw, types.FunctionType):
                return
            if getattr(raw, "_mmtrace_probe_seg", False) or kind not in ("sync", "async"):
                return
            buf = _calls.setdefault(hook_id, [])

            def build(func, on, bound):
                if kind == "async":

                    async def timer(*a, **k):
                        t0 = _now()
                        try:
                            return await func(*a, **k)
                        finally:
                            if len(buf) < _CALLS_MAX:
                                buf.extend((t0, _now()))

                else:

                    def timer(*a, **k):
                        t0 = _now()
                        try:
                            return func(*a, **k)
                        finally:
                            if len(buf) < _CALLS_MAX:
                                buf.extend((t0, _now()))

                timer._mmtrace_probe_seg = True
                return timer

            _apply(f"probe:{hook_id}", target, _patch.Direct(build))

        def _probed_apply(hook_id, target, wrapper, enabled=None):
            res = _patch.resolve(target)
            if _segments:  # SGLang's own calls timed, the plugin's hooks as they are
                _segment_timer(hook_id, target, res)
                return _apply(hook_id, target, wrapper, enabled)
            return _apply(hook_id, target, _timed(hook_id, _patch.kind_of(res.original), wrapper), enabled)

        _patch.apply = _plugin.apply = _probed_apply

        _thread_cpu = time.thread_time
        _main = threading.main_thread()

        def _timed_call(key: str, fn, by_caller: bool = False):
            """Time a CUDA-mark helper: wall and the thread's CPU time, per thread kind (and, with
            ``by_caller``, per calling function: which mark of a stage costs what), and the calls over
            20 µs (wall much above CPU = the call waited: for the GIL, a driver lock or the GPU)."""

            def timed(*a, **k):
                c0, t0 = _thread_cpu(), _now()
                try:
                    return fn(*a, **k)
                finally:
                    dt = _now() - t0
                    where = "main" if threading.current_thread() is _main else "worker"
                    if by_caller:  # the calling function and its caller (start or end mark, of which stage)
                        f1 = sys._getframe(1)
                        where += f":{f1.f_code.co_name}<{f1.f_back.f_code.co_name if f1.f_back else '?'}"
                    slot = _own.setdefault(f"{key}@{where}", [0, 0.0, 0.0])
                    slot[0] += 1
                    slot[1] += dt
                    slot[2] += _thread_cpu() - c0
                    if dt > 20e-6:
                        slow = _own.setdefault(f"{key}@{where}>20us", [0, 0.0, 0.0])
                        slow[0] += 1
                        slow[1] += dt

            return timed

        import sglang_mmtrace.hooks.cuda_marks as _cm

        # (the current stream is torch's binding, called directly: an instance attribute, not timed)
        if not _segments:
            for _name in ("capturing", "create", "record", "elapsed_ms", "current_device"):
                setattr(_cm.Runtime, _name, _timed_call(f"cuda.rt.{_name}", getattr(_cm.Runtime, _name)))
            for _name in ("mark", "elapsed_s"):
                setattr(
                    _cm.Marks, _name, _timed_call(f"cuda.marks.{_name}", getattr(_cm.Marks, _name), _name == "mark")
                )
            _cm.device_marks = _timed_call("cuda.device_marks", _cm.device_marks)

        def _dump_calls(seen: list[float]) -> None:
            """When the driver touches ``dump-calls`` (again), write the timed calls to ``<pid>.calls.json``."""
            trigger = os.path.join(_dir, "dump-calls")
            try:
                stamp = os.stat(trigger).st_mtime
            except OSError:
                return
            if stamp == seen[0]:
                return
            seen[0] = stamp
            path = os.path.join(_dir, f"{os.getpid()}.calls.json")
            with open(f"{path}.tmp", "w") as f:
                json.dump({"pid": os.getpid(), "trigger": stamp, "calls": {k: list(v) for k, v in _calls.items()}}, f)
            os.replace(f"{path}.tmp", path)

        def _dump() -> None:
            path = os.path.join(_dir, f"{os.getpid()}.json")
            seen = [0.0]
            while True:
                with contextlib.suppress(Exception):
                    _dump_calls(seen)
                try:
                    t = os.times()
                    state = {
                        "pid": os.getpid(),
                        "argv": sys.argv[:3],
                        "wall": time.time(),
                        "cpu_s": t.user + t.system,
                        "threads": threading.active_count(),
                        "own": _own,
                        "gc": _gc,
                    }
                    tmp = f"{path}.{threading.get_ident()}.tmp"
                    with open(tmp, "w") as f:
                        json.dump(state, f)
                    os.replace(tmp, path)
                except Exception:
                    pass
                time.sleep(1.0)

        threading.Thread(target=_dump, name="mmtrace-probe", daemon=True).start()

        def _live_check(sig, frame) -> None:
            """SIGUSR1: the plugin's per-request objects still alive, a full collection, the same again."""

            def count() -> dict[str, int]:
                n: dict[str, int] = {}
                for o in gc.get_objects():
                    if (t := type(o).__name__) in ("ApiTrace", "HttpCtx", "ReqTrace", "FwdCtx"):
                        n[t] = n.get(t, 0) + 1
                return n

            before = count()
            freed = gc.collect()
            with open(os.path.join(_dir, f"{os.getpid()}.live.txt"), "a") as f:
                f.write(f"{before} -> full collection freed {freed} -> {count()}\n")

        if threading.current_thread() is threading.main_thread():
            import signal

            signal.signal(signal.SIGUSR1, _live_check)
    except Exception:
        pass


def _chain() -> None:
    import sys

    if getattr(sys, "_mmtrace_probe_chained", False):  # the next one may chain back to this one
        return
    sys._mmtrace_probe_chained = True  # type: ignore[attr-defined]
    here = os.path.dirname(os.path.abspath(__file__))
    for entry in sys.path:
        path = os.path.join(os.path.abspath(entry or "."), "sitecustomize.py")
        if os.path.dirname(path) != here and os.path.exists(path):
            with open(path) as f:
                exec(compile(f.read(), path, "exec"), {"__name__": "sitecustomize", "__file__": path})
            return


_chain()
