"""Building blocks shared by the hook modules: guarded plugin code and interval wrappers.

Every wrapper calls the wrapped SGLang function exactly once and lets its result and exceptions
pass through unchanged; plugin code around it runs under ``guarded`` and is counted, never raised.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from .. import telemetry
from ..patch import Direct
from ..sinks import nvtx as nvtx_sink
from ..telemetry import contained, maybe_inject

now = time.perf_counter

Wrapper = Callable[[Any, Any, tuple, dict], Any]
Enter = Callable[[Any, tuple, dict], Any]
Exit = Callable[[Any, float, float, Any, tuple, dict, Any, BaseException | None], None]
Nvtx = tuple[str, Callable[[Any, tuple, dict], "str | None"]]
"""(stage, detail(instance, args, kwargs)): push ``<stage> <detail>`` around the call; None = no range."""


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
        detail = nvtx[1](instance, args, kwargs)
        if detail is None:
            return None
        if nested:
            nvtx_sink.push(nvtx[0], detail)
            return True
        return nvtx_sink.start(nvtx[0], detail)
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
    """

    # The guard is inlined into the hooks (no enter/leave helper frames), and the hook is built into
    # its target's replacement (``Direct``; for a coroutine target an ``async def`` awaiting it): these
    # run on SGLang's hot threads, several times per request before its first token.
    def make(kind: str) -> Direct:
        if kind == "async":

            def build_async(func: Callable[..., Any], on: Any, bound: bool) -> Callable[..., Any]:
                async def async_hook(*args, **kwargs):
                    if not on:
                        return await func(*args, **kwargs)
                    instance, rest = (args[0], args[1:]) if bound else (None, args)
                    st = None
                    if on_enter is not None:
                        try:
                            if telemetry.armed is not False:
                                maybe_inject(component)
                            st = on_enter(instance, rest, kwargs)
                        except Exception as e:
                            contained(component, e)
                        if st is None and entered_only:
                            return await func(*args, **kwargs)
                    range_id = (
                        push_nvtx(component, nvtx, instance, rest, kwargs, nested=False)
                        if nvtx is not None and nvtx_sink.domain is not None
                        else None
                    )
                    result = exc = None
                    t0 = now()
                    try:
                        result = await func(*args, **kwargs)
                        return result
                    except BaseException as e:
                        exc = e
                        raise
                    finally:
                        t1 = now()
                        if range_id is not None:
                            guarded(component, nvtx_sink.end, range_id)
                        try:
                            if telemetry.armed is not False:
                                maybe_inject(component)
                            on_exit(st, t0, t1, instance, rest, kwargs, result, exc)
                        except Exception as e:
                            contained(component, e)

                return async_hook

            return Direct(build_async)
        if kind == "sync":

            def build(func: Callable[..., Any], on: Any, bound: bool) -> Callable[..., Any]:
                def sync_hook(*args, **kwargs):
                    if not on:
                        return func(*args, **kwargs)
                    instance, rest = (args[0], args[1:]) if bound else (None, args)
                    st = None
                    if on_enter is not None:
                        try:
                            if telemetry.armed is not False:
                                maybe_inject(component)
                            st = on_enter(instance, rest, kwargs)
                        except Exception as e:
                            contained(component, e)
                        if st is None and entered_only:
                            return func(*args, **kwargs)
                    pushed = (
                        nvtx is not None
                        and nvtx_sink.domain is not None
                        and push_nvtx(component, nvtx, instance, rest, kwargs) is not None
                    )
                    result = exc = None
                    t0 = now()
                    try:
                        result = func(*args, **kwargs)
                        return result
                    except BaseException as e:
                        exc = e
                        raise
                    finally:
                        t1 = now()
                        if pushed:
                            guarded(component, nvtx_sink.pop)
                        try:
                            if telemetry.armed is not False:
                                maybe_inject(component)
                            on_exit(st, t0, t1, instance, rest, kwargs, result, exc)
                        except Exception as e:
                            contained(component, e)

                return sync_hook

            return Direct(build)
        raise ValueError(f"{component}: no interval wrapper for kind {kind!r}")

    if entered_only and on_enter is None:
        raise ValueError(f"{component}: entered_only needs an on_enter")
    return HookSpec(component, make=make)


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

    Built into the target's replacement (``Direct``), the same function for either kind: for a
    coroutine target the enter step runs when the coroutine is created (SGLang awaits these at once)
    and the target's own coroutine is returned, so no plugin frame sits in the await chain, where every
    resume of the target would pass through it (``patch.hooked`` marks the replacement a coroutine
    function).
    """

    def build(func: Callable[..., Any], on: Any, bound: bool) -> Callable[..., Any]:
        def before_hook(*args, **kwargs):
            if on:
                try:
                    if telemetry.armed is not False:
                        maybe_inject(component)
                    if bound:
                        on_enter(args[0], args[1:], kwargs)
                    else:
                        on_enter(None, args, kwargs)
                except Exception as e:
                    contained(component, e)
            return func(*args, **kwargs)

        return before_hook

    def make(kind: str) -> Direct:
        if kind not in ("sync", "async"):
            raise ValueError(f"{component}: no wrapper for kind {kind!r}")
        return Direct(build)

    return HookSpec(component, make=make)


def push_batch_range(component: str, stage: str, rids: tuple[str, ...]) -> bool:
    """Push ``<stage> n=<batch> rids=...`` when a tool is attached (for the model-stage wrappers)."""
    if nvtx_sink.domain is None:
        return False
    try:
        nvtx_sink.push(stage, nvtx_sink.rids_detail(rids))
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
