"""Building blocks shared by the hook modules: guarded plugin code and interval wrappers.

Every wrapper calls the wrapped SGLang function exactly once and lets its result and exceptions
pass through unchanged; plugin code around it runs under ``guarded`` and is counted, never raised.
"""

from __future__ import annotations

import functools
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from .. import telemetry
from ..patch import CallShape, Direct, call_shape, compile_replacement
from ..sinks import nvtx as nvtx_sink
from ..telemetry import contained, maybe_inject

now = time.perf_counter

Wrapper = Callable[[Any, Any, tuple, dict], Any]
Enter = Callable[[Any, tuple, dict], Any]
Exit = Callable[[Any, float, float, Any, tuple, dict, Any, BaseException | None], None]
Nvtx = tuple[str, Callable[[Any, tuple, dict], "nvtx_sink.Requests | None"]]
"""(stage, requests(instance, args, kwargs)): a range named ``stage`` for those requests around the
call (``sinks.nvtx``); None = no range."""


@dataclass(frozen=True)
class HookSpec:
    """What a hook module offers for one manifest hook id.

    ``make(kind)`` returns a wrapper in wrapt's convention ``(wrapped, instance, args, kwargs)`` for a
    target of that kind, or a ``patch.Direct`` (built into the target's replacement, still callable in
    wrapt's convention); ``patch.hooked`` installs either; ``install(obj)`` is for
    targets that are objects rather than callables (the ASGI app). ``gated=False`` for hooks that
    set the plugin up rather than measure (they keep working while the switch is off).
    ``nvtx_only=True`` for a hook that only brackets the call with its NVTX range (``ranged``): it is
    applied only in a process with an NVTX tool attached, and elsewhere costs nothing.
    """

    component: str
    make: Callable[[str], Wrapper | Direct] | None = None
    install: Callable[[Any], Callable[[], None]] | None = None
    gated: bool = True
    nvtx_only: bool = False


def guarded(component: str, fn: Callable[..., Any], *args: Any) -> Any:
    """``fn(*args)``, its exception contained and counted (None then)."""
    try:
        if telemetry.armed is not False:
            maybe_inject(component)
        return fn(*args)
    except Exception as exc:
        contained(component, exc)
        return None


def push_nvtx(component: str, nvtx: Nvtx | None, instance: Any, args: tuple, kwargs: dict, nested: bool = True) -> Any:
    """Open the hook's NVTX range when a tool is attached: pushed (nested=True), else a start/end range.

    Returns True / the range id when one was opened, None otherwise.
    """
    if nvtx is None or nvtx_sink.domain is None:
        return None
    try:
        requests = nvtx[1](instance, args, kwargs)
        if requests is None:
            return None
        if nested:
            nvtx_sink.push(nvtx[0], requests)
            return True
        return nvtx_sink.start(nvtx[0], requests)
    except Exception as exc:
        contained(component + ".nvtx", exc)
        return None


def interval(
    component: str,
    on_exit: Exit,
    on_enter: Enter | None = None,
    nvtx: Nvtx | None = None,
    entered_only: bool = False,
) -> HookSpec:
    """A hook that times the wrapped call and hands ``(state, t0, t1, ...)`` to ``on_exit``.

    ``entered_only``: when ``on_enter`` returns None the call has nothing to measure (a decode batch
    for a prefill hook) and goes straight through: no NVTX check, no timing, no ``on_exit``. For
    targets called on every decode step, where most calls are of that kind.

    The replacement is generated for its target (``patch.call_shape``: its own parameters, no
    ``*args``/``**kwargs`` packing) with the guards inlined (no enter/leave helper frames): these
    run on SGLang's hot threads, several times per request before its first token, with cold caches.
    """
    if entered_only and on_enter is None:
        raise ValueError(f"{component}: entered_only needs an on_enter")

    def make(kind: str) -> Direct:
        if kind not in ("sync", "async"):
            raise ValueError(f"{component}: no interval wrapper for kind {kind!r}")
        is_async = kind == "async"
        close = _range_end if is_async else _range_pop

        def build(func: Callable[..., Any], on: Any, bound: bool) -> Callable[..., Any]:
            shape = call_shape(func, bound)
            source = _interval_source(shape, is_async, on_enter is not None, entered_only, nvtx is not None)
            namespace = {
                **_guard_names(component, on, func, shape),
                "_mt_enter": on_enter,
                "_mt_exit": on_exit,
                "_mt_exit_guarded": functools.partial(guarded, component, on_exit),
                "_mt_now": now,
                "_mt_nvtx": nvtx_sink,
                "_mt_push": functools.partial(push_nvtx, component, nvtx, nested=not is_async),
                "_mt_close": functools.partial(close, component),
            }
            return compile_replacement(source, namespace, func, component)

        return Direct(build)

    return HookSpec(component, make=make)


def _guard_names(component: str, on: Any, func: Callable[..., Any], shape: CallShape) -> dict[str, Any]:
    """What every generated hook's source refers to: its gate, its target, the fault-injection check
    and the counter of contained errors, and the target's defaults."""
    return {
        "_mt_on": on,
        "_mt_func": func,
        "_mt_component": component,
        "_mt_telemetry": telemetry,
        "_mt_inject": maybe_inject,
        "_mt_contained": contained,
        **shape.defaults,
    }


_ENTER = """\
    try:
        if _mt_telemetry.armed is not False:
            _mt_inject(_mt_component)
        _mt_st = _mt_enter({instance}, _mt_rest, _mt_kw)
    except Exception as _mt_e:
        _mt_contained(_mt_component, _mt_e)
"""


def _interval_source(shape: CallShape, is_async: bool, enter: bool, entered_only: bool, ranged: bool) -> str:
    """``interval``'s replacement: gate, enter step, NVTX range, the timed call, exit step (on an
    exception through a ``guarded`` call, then re-raised), each plugin step contained."""
    aw = "await " if is_async else ""
    call = f"{aw}_mt_func({shape.call})"
    lines = [
        f"{'async ' if is_async else ''}def _mt_hook({shape.params}):",
        "    if not _mt_on:",
        f"        return {call}",
        f"    _mt_rest = {shape.rest}",
        f"    _mt_kw = {shape.kwargs}",
        "    _mt_st = None",
    ]
    if enter:
        lines.append(_ENTER.format(instance=shape.instance).rstrip("\n"))
        if entered_only:
            lines += ["    if _mt_st is None:", f"        return {call}"]
    if ranged:
        lines.append(
            f"    _mt_range = _mt_push({shape.instance}, _mt_rest, _mt_kw) if _mt_nvtx.domain is not None else None"
        )
    close = ["    if _mt_range is not None:", "        _mt_close(_mt_range)"] if ranged else []
    lines += [
        "    _mt_t0 = _mt_now()",
        "    try:",
        f"        _mt_result = {call}",
        "    except BaseException as _mt_exc:",
        "        _mt_t1 = _mt_now()",
        *("    " + line for line in close),
        f"        _mt_exit_guarded(_mt_st, _mt_t0, _mt_t1, {shape.instance}, _mt_rest, _mt_kw, None, _mt_exc)",
        "        raise",
        "    _mt_t1 = _mt_now()",
        *close,
        "    try:",
        "        if _mt_telemetry.armed is not False:",
        "            _mt_inject(_mt_component)",
        f"        _mt_exit(_mt_st, _mt_t0, _mt_t1, {shape.instance}, _mt_rest, _mt_kw, _mt_result, None)",
        "    except Exception as _mt_e:",
        "        _mt_contained(_mt_component, _mt_e)",
        "    return _mt_result",
    ]
    return "\n".join(lines) + "\n"


def _range_pop(component: str, range_id: Any) -> None:
    guarded(component, nvtx_sink.pop)


def _range_end(component: str, range_id: Any) -> None:
    guarded(component, nvtx_sink.end, range_id)


def _no_stage(st, t0, t1, instance, args, kwargs, result, exc) -> None:
    """The exit step of a ``ranged`` hook: its stage's times are not this call's to file."""


def ranged(component: str, nvtx: Nvtx) -> HookSpec:
    """A hook that only brackets the call with its NVTX range, for a stage whose times SGLang notes
    itself (read when the request is handed over): applied only where a tool is attached, so without
    one the call has no frame of ours (``HookSpec.nvtx_only``)."""
    spec = interval(component, _no_stage, nvtx=nvtx)
    return HookSpec(component, make=spec.make, nvtx_only=True)


def before(component: str, on_enter: Callable[[Any, tuple, dict], None]) -> HookSpec:
    """A hook that only looks at the arguments before the call (no timing around it).

    Generated for its target as ``interval``'s, the same plain function for either kind: for a
    coroutine target the enter step runs when the coroutine is created (SGLang awaits these at once)
    and the target's own coroutine is returned, so no plugin frame sits in the await chain, where every
    resume of the target would pass through it (``patch.hooked`` marks the replacement a coroutine
    function).
    """

    def build(func: Callable[..., Any], on: Any, bound: bool) -> Callable[..., Any]:
        shape = call_shape(func, bound)
        source = "\n".join(
            [
                f"def _mt_hook({shape.params}):",
                "    if _mt_on:",
                f"        _mt_rest = {shape.rest}",
                f"        _mt_kw = {shape.kwargs}",
                "    " + _ENTER.format(instance=shape.instance).rstrip("\n").replace("\n", "\n    "),
                f"    return _mt_func({shape.call})",
                "",
            ]
        )
        namespace = {**_guard_names(component, on, func, shape), "_mt_enter": on_enter}
        return compile_replacement(source, namespace, func, component)

    def make(kind: str) -> Direct:
        if kind not in ("sync", "async"):
            raise ValueError(f"{component}: no wrapper for kind {kind!r}")
        return Direct(build)

    return HookSpec(component, make=make)


def push_batch_range(component: str, stage: str, rids: tuple[str, ...]) -> bool:
    """Push the batch range of ``stage`` for ``rids`` when a tool is attached (for the model-stage wrappers)."""
    if nvtx_sink.domain is None:
        return False
    try:
        nvtx_sink.push(stage, tuple(rids))
        return True
    except Exception as exc:
        contained(component + ".nvtx", exc)
        return False


def error_class(exc: BaseException) -> str:
    """The class of an exception a request failed with, as records name it: ``ValueError`` for builtins,
    ``module.Class`` otherwise (the class name only, never the message: it may quote the prompt)."""
    cls = type(exc)
    return cls.__qualname__ if cls.__module__ == "builtins" else f"{cls.__module__}.{cls.__qualname__}"


def arg(args: tuple, kwargs: dict, index: int, name: str) -> Any:
    """A wrapped call's argument by position or keyword (positions exclude ``self``)."""
    if len(args) > index:
        return args[index]
    return kwargs.get(name)
