"""Detokenizer bootstrap (api process; SGLang 0.5.17, which loads no plugins in the detokenizer).

0.5.17's ``run_detokenizer_process`` never calls ``load_plugins()``, so without help the
``detokenize`` hook is never applied there. In the main process the function handed to the
detokenizer's ``mp.Process`` is replaced by ``functools.partial(detok_entry, install, original)``
(``install``: ``plugin.install``, from ``runtime``; hooks do not import ``plugin``, it imports them).
Both are module-level functions, so spawn pickles them by reference; in the child ``detok_entry``
installs the plugin in the detokenizer role (its hooks are then in place before the
``DetokenizerManager`` binds its handlers) and runs the original unchanged.

Not hooked: ``run_detokenizer_process`` itself (``http_server.launch_server`` captured it as a
default argument, and pickling refuses a function whose module attribute was replaced).
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any

from ... import runtime
from ...stages import DETOKENIZER
from ...telemetry import contained
from ..base import HookSpec, Wrapper, guarded

_ARG = "run_detokenizer_process_func"
_POS = 2  # (server_args, port_args, run_detokenizer_process_func)


def detok_entry(install: Callable[..., Any], original: Any, *args: Any, **kwargs: Any) -> Any:
    """Runs in the spawned detokenizer: install the plugin there, then the original entry."""
    try:
        install(role=DETOKENIZER)
    except Exception as exc:  # never keep the detokenizer from starting
        contained("detokenizer_legacy.bootstrap", exc)
    return original(*args, **kwargs)


def _bootstrapped(func: Any) -> Any:
    if isinstance(func, functools.partial) and func.func is detok_entry:
        return func
    return functools.partial(detok_entry, runtime.install, func)


def _swap(args: tuple, kwargs: dict) -> tuple[tuple, dict]:
    if _ARG in kwargs and callable(kwargs[_ARG]):
        return args, {**kwargs, _ARG: _bootstrapped(kwargs[_ARG])}
    if len(args) > _POS and callable(args[_POS]):
        return (*args[:_POS], _bootstrapped(args[_POS]), *args[_POS + 1 :]), kwargs
    return args, kwargs


def _make(kind: str) -> Wrapper:
    component = "detokenizer_legacy.bootstrap"
    if kind != "sync":
        raise ValueError(f"{component}: expected a sync target, got {kind}")

    def wrapper(wrapped, instance, args, kwargs):
        swapped = guarded(component, _swap, args, kwargs)
        if swapped is not None:
            args, kwargs = swapped
        return wrapped(*args, **kwargs)

    return wrapper


PART = "detokenizer"  # the switch part that gates these hooks

HOOKS: dict[str, HookSpec] = {
    "detokenizer_legacy.bootstrap": HookSpec("detokenizer_legacy.bootstrap", make=_make, gated=False),
}

# the arguments each hook reads from its target (registry.READS_OF)
READS: dict[str, tuple[tuple[int | None, str | None], ...]] = {
    "detokenizer_legacy.bootstrap": ((2, "run_detokenizer_process_func"),),
}
