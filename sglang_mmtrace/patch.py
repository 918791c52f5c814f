"""Apply and remove wrappers on SGLang targets (wrapt), named by the version manifest.

wrapt keeps signatures, descriptors (staticmethod/classmethod) and the async kind of what it wraps.
Functions that SGLang re-imports by name (``from mm_utils import wrap_shm_features``) are re-bound
in every module that holds the original, as SGLang's own HookRegistry does.
"""

from __future__ import annotations

import importlib
import inspect
import logging
import sys
import types
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import wrapt

logger = logging.getLogger("sglang_mmtrace")


@dataclass
class Resolved:
    module: types.ModuleType
    owner: Any  # the module or class that holds the attribute
    attr: str
    original: Any  # the raw attribute (function, staticmethod, ...)


@dataclass
class Applied:
    hook_id: str
    target: str
    resolved: Resolved
    rebound: list[tuple[types.ModuleType, str]] = field(default_factory=list)


def resolve(target: str) -> Resolved:
    """Resolve ``pkg.module.Class.method`` by importing the longest importable module prefix."""
    parts = target.split(".")
    module = None
    idx = len(parts)
    while idx > 0:
        try:
            module = importlib.import_module(".".join(parts[:idx]))
            break
        except ModuleNotFoundError as exc:
            if exc.name is None or not ".".join(parts[:idx]).startswith(exc.name):
                raise
            idx -= 1
    if module is None or idx == len(parts):
        raise AttributeError(f"{target}: no attribute path after the module")
    owner: Any = module
    for name in parts[idx:-1]:
        owner = getattr(owner, name)
    attr = parts[-1]
    original = owner.__dict__[attr] if isinstance(owner, type) and attr in owner.__dict__ else getattr(owner, attr)
    if isinstance(owner, type) and attr not in owner.__dict__:
        raise AttributeError(f"{target}: {attr} is inherited, hook the class that defines it")
    return Resolved(module, owner, attr, original)


def kind_of(obj: Any) -> str:
    """``async``, ``asyncgen`` or ``sync`` for a function or a static/class method."""
    func = obj.__func__ if isinstance(obj, staticmethod | classmethod) else obj
    if inspect.isasyncgenfunction(func):
        return "asyncgen"
    if inspect.iscoroutinefunction(func):
        return "async"
    return "sync"


def apply(hook_id: str, target: str, wrapper: Callable[..., Any], enabled: Any = None) -> Applied:
    """Wrap one target; module-level functions are also re-bound where they were imported by name.

    ``enabled``: wrapt's switch (a switch gate's ``enabled`` list); while it is false the target is
    called directly."""
    res = resolve(target)
    wrapt.wrap_object(res.owner, res.attr, wrapt.FunctionWrapper, (wrapper, enabled))
    applied = Applied(hook_id, target, res)
    if isinstance(res.owner, types.ModuleType):
        new = getattr(res.owner, res.attr)
        for mod in list(sys.modules.values()):
            if mod is None or mod is res.owner or not isinstance(mod, types.ModuleType):
                continue
            try:
                items = list(vars(mod).items())
            except TypeError:
                continue
            for name, value in items:
                if value is res.original:
                    setattr(mod, name, new)
                    applied.rebound.append((mod, name))
    return applied


def unpatch(applied: Applied) -> None:
    """Restore the original attribute (and every re-bound import of it)."""
    res = applied.resolved
    setattr(res.owner, res.attr, res.original)
    for mod, name in applied.rebound:
        setattr(mod, name, res.original)
