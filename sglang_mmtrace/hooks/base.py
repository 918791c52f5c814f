"""Building blocks shared by the hook modules: guarded plugin code and interval wrappers.

Every wrapper calls the wrapped SGLang function exactly once and lets its result and exceptions
pass through unchanged; plugin code around it runs under ``guarded`` and is counted, never raised.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from ..telemetry import contained, maybe_inject

now = time.perf_counter

Wrapper = Callable[[Any, Any, tuple, dict], Any]
Enter = Callable[[Any, tuple, dict], Any]
Exit = Callable[[Any, float, float, Any, tuple, dict, Any, BaseException | None], None]


@dataclass(frozen=True)
class HookSpec:
    """What a hook module offers for one manifest hook id.

    ``make(kind)`` returns a wrapt wrapper for a target of that kind; ``install(obj)`` is for
    targets that are objects rather than callables (the ASGI app).
    """

    component: str
    make: Callable[[str], Wrapper] | None = None
    install: Callable[[Any], Callable[[], None]] | None = None


def guarded(component: str, fn: Callable[..., Any], *args: Any) -> Any:
    try:
        maybe_inject(component)
        return fn(*args)
    except Exception as exc:
        contained(component, exc)
        return None


def interval(component: str, on_exit: Exit, on_enter: Enter | None = None) -> HookSpec:
    """A hook that times the wrapped call and hands ``(state, t0, t1, ...)`` to ``on_exit``."""

    def make(kind: str) -> Wrapper:
        if kind == "async":

            async def async_wrapper(wrapped, instance, args, kwargs):
                st = guarded(component, on_enter, instance, args, kwargs) if on_enter else None
                result = exc = None
                t0 = now()
                try:
                    result = await wrapped(*args, **kwargs)
                    return result
                except BaseException as e:
                    exc = e
                    raise
                finally:
                    guarded(component, on_exit, st, t0, now(), instance, args, kwargs, result, exc)

            return async_wrapper
        if kind == "sync":

            def sync_wrapper(wrapped, instance, args, kwargs):
                st = guarded(component, on_enter, instance, args, kwargs) if on_enter else None
                result = exc = None
                t0 = now()
                try:
                    result = wrapped(*args, **kwargs)
                    return result
                except BaseException as e:
                    exc = e
                    raise
                finally:
                    guarded(component, on_exit, st, t0, now(), instance, args, kwargs, result, exc)

            return sync_wrapper
        raise ValueError(f"{component}: no interval wrapper for kind {kind!r}")

    return HookSpec(component, make=make)


def before(component: str, on_enter: Callable[[Any, tuple, dict], None]) -> HookSpec:
    """A hook that only looks at the arguments before the call (no timing around it)."""

    def make(kind: str) -> Wrapper:
        if kind == "async":

            async def async_wrapper(wrapped, instance, args, kwargs):
                guarded(component, on_enter, instance, args, kwargs)
                return await wrapped(*args, **kwargs)

            return async_wrapper

        def sync_wrapper(wrapped, instance, args, kwargs):
            guarded(component, on_enter, instance, args, kwargs)
            return wrapped(*args, **kwargs)

        if kind != "sync":
            raise ValueError(f"{component}: no wrapper for kind {kind!r}")
        return sync_wrapper

    return HookSpec(component, make=make)


def arg(args: tuple, kwargs: dict, index: int, name: str) -> Any:
    """A wrapped call's argument by position or keyword (positions exclude ``self``)."""
    if len(args) > index:
        return args[index]
    return kwargs.get(name)
