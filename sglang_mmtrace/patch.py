"""Apply and remove wrappers on SGLang targets, named by the version manifest.

Every hook has the wrapt calling convention, ``wrapper(wrapped, instance, args, kwargs)``, or is a
``Direct`` hook, built into the function that replaces its target. A sync target (function, method,
static or class method) with a wrapt-convention wrapper is replaced by a plain closure that calls its
wrapper so; anything else (a coroutine target with such a wrapper, an async generator, a target that
is not a Python function) by a ``wrapt.FunctionWrapper``. A coroutine target's replacement stays a
coroutine function to ``inspect`` (and on Python 3.11 to ``asyncio``). Why not wrapt everywhere: in a
server a hook runs with cold CPU caches (SGLang's own work runs between two of its calls), where
every frame and object costs several times its warm price, and wrapt's proxy objects cost more than
the hook's own work; the hooks' cold cost on the way to the first token is most of what the plugin
adds to TTFT. The hook modules' ``Direct`` hooks are generated for their target (``call_shape``,
``compile_replacement``): its own parameters instead of ``*args, **kwargs``, so a hooked call costs
one plain call more. The reasoning is in docs/design/hot-path.md, the figures in docs/performance.md.
All keep the signature (``__wrapped__``) and the switch's gate (``enabled``, tested before the hook runs).

Functions that SGLang re-imports by name (``from mm_utils import wrap_shm_features``) are re-bound
in every module that holds the original, as SGLang's own HookRegistry does.

While the runtime switch has a hook's part off, ``follow`` puts the original back (and the hook again
when it turns on), so a switched-off target costs no frame of ours; the gate stays the fallback for
references SGLang took while the hook was in place.
"""

from __future__ import annotations

import asyncio
import functools
import importlib
import inspect
import linecache
import logging
import sys
import types
from collections.abc import Callable, Sequence
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
    hooked: Any = None  # what replaced the original (``hooked``'s result)
    enabled: list[bool] | None = None  # the switch gate's ``enabled`` list; None: not gated (always in place)


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


_ASYNCIO_MARK = getattr(asyncio.coroutines, "_is_coroutine", None)
"""Python 3.11's mark of a plain function that returns a coroutine (``asyncio.iscoroutinefunction``);
3.12+ has ``inspect.markcoroutinefunction``."""


def kind_of(obj: Any) -> str:
    """``async``, ``asyncgen`` or ``sync`` for a function or a static/class method."""
    func = obj.__func__ if isinstance(obj, staticmethod | classmethod) else obj
    if inspect.isasyncgenfunction(func):
        return "asyncgen"
    if inspect.iscoroutinefunction(func) or (
        _ASYNCIO_MARK is not None and getattr(func, "_is_coroutine", None) is _ASYNCIO_MARK
    ):
        return "async"
    return "sync"


def _coroutine_function(func: Callable[..., Any]) -> Callable[..., Any]:
    """Mark a plain function that returns a coroutine (a ``before`` hook's replacement of a coroutine
    target) so that it still reads as a coroutine function."""
    mark = getattr(inspect, "markcoroutinefunction", None)
    if mark is not None:
        return mark(func)
    func._is_coroutine = _ASYNCIO_MARK  # type: ignore[attr-defined]
    return func


_ALWAYS = [True]
_NO_KWARGS: Any = types.MappingProxyType({})
"""The ``kwargs`` a generated replacement hands its hook for a target that takes no ``**kwargs`` and
no keyword-only parameter: every argument is then in ``rest``, by position, however it was passed."""
_PREFIX = "_mt_"  # the generated code's own names; a target whose parameters use it gets the star form


@dataclass(frozen=True)
class CallShape:
    """How a replacement generated for one target (``compile_replacement``) takes its arguments and
    passes them on: source fragments, and the defaults they refer to.

    Why generated: a replacement written as ``def hook(*args, **kwargs): ... func(*args, **kwargs)``
    packs a tuple and a dict on every call and calls its target through ``CALL_FUNCTION_EX``, which
    CPython 3.11 does not inline (a second run of the eval loop in C); with cold caches that costs
    more per hooked call than the hook's own work (see docs/design/hot-path.md). A
    replacement with the target's own parameters calls it as SGLang does, with the same values
    (a default is passed explicitly, as the object the target would have used).
    """

    params: str  # the replacement's parameter list
    call: str  # the target's arguments
    instance: str  # ``self``/``cls`` (a method or class method), else None
    rest: str  # a tuple of the other positional arguments
    kwargs: str  # a mapping of the keyword-only arguments (or the target's ``**kwargs``)
    defaults: dict[str, Any]


def call_shape(func: Callable[..., Any], bound: bool) -> CallShape:
    """The target's own parameters where its code says them plainly; the star form (``*args,
    **kwargs``) for one that takes ``*args`` or ``**kwargs`` or whose names clash with ours."""
    code = getattr(func, "__code__", None)
    names = code.co_varnames[: code.co_argcount + code.co_kwonlyargcount] if code is not None else ()
    star = (
        code is None
        or code.co_flags & (inspect.CO_VARARGS | inspect.CO_VARKEYWORDS)
        or (bound and code.co_argcount == 0)
        or any(n.startswith(_PREFIX) for n in names)
    )
    if star:
        return CallShape(
            params="*_mt_args, **_mt_kwargs",
            call="*_mt_args, **_mt_kwargs",
            instance="_mt_args[0]" if bound else "None",
            rest="_mt_args[1:]" if bound else "_mt_args",
            kwargs="_mt_kwargs",
            defaults={},
        )
    assert code is not None
    positional, keyword = names[: code.co_argcount], names[code.co_argcount :]
    pos_defaults = func.__defaults__ or ()
    first_default = len(positional) - len(pos_defaults)
    defaults: dict[str, Any] = {}
    params: list[str] = []
    for i, name in enumerate(positional):
        if i >= first_default:
            defaults[f"_mt_d{i}"] = pos_defaults[i - first_default]
            params.append(f"{name}=_mt_d{i}")
        else:
            params.append(name)
        if i + 1 == code.co_posonlyargcount:
            params.append("/")
    if keyword:
        params.append("*")
        kw_defaults = func.__kwdefaults__ or {}
        for j, name in enumerate(keyword):
            if name in kw_defaults:
                defaults[f"_mt_k{j}"] = kw_defaults[name]
                params.append(f"{name}=_mt_k{j}")
            else:
                params.append(name)
    others = positional[1:] if bound else positional
    return CallShape(
        params=", ".join(params),
        call=", ".join([*positional, *(f"{n}={n}" for n in keyword)]),
        instance=positional[0] if bound else "None",
        rest=f"({', '.join(others)}{',' if len(others) == 1 else ''})",
        kwargs="{" + ", ".join(f"{n!r}: {n}" for n in keyword) + "}" if keyword else "_mt_no_kwargs",
        defaults=defaults,
    )


@functools.lru_cache(maxsize=256)
def _compiled(source: str, filename: str) -> types.CodeType:
    """One compile per distinct source: ``Direct.__call__`` (a target wrapt holds, a test calling a hook
    alone) builds its replacement on every call, and compiling costs far more than the call."""
    return compile(source, filename, "exec")


def compile_replacement(source: str, namespace: dict[str, Any], func: Callable[..., Any], label: str) -> Any:
    """Compile ``source``, which defines ``_mt_hook``, in ``namespace`` (with ``_mt_no_kwargs``), named
    as ``func`` is (so a call with wrong arguments fails with the message the target's own would
    give), its source kept in ``linecache`` for tracebacks under the file name ``<mmtrace LABEL>``."""
    filename = f"<mmtrace {label}>"
    namespace["_mt_no_kwargs"] = _NO_KWARGS
    exec(_compiled(source, filename), namespace)
    hook = namespace.pop("_mt_hook")  # not left in its own globals: no function <-> namespace cycle
    name = getattr(func, "__name__", "_mt_hook")
    hook.__code__ = hook.__code__.replace(co_name=name, co_qualname=getattr(func, "__qualname__", name))
    linecache.cache[filename] = (len(source), None, source.splitlines(True), filename)
    return hook


@dataclass(frozen=True)
class Direct:
    """A hook built into its target's replacement: ``build(func, enabled, bound)`` returns the
    function that replaces ``func`` (for a coroutine target, one that returns a coroutine), called as
    ``func`` is (``bound``: its first argument is ``self`` or ``cls``, which the hook sees as
    ``instance``, not among ``args``); while ``enabled`` is false it calls ``func`` directly.

    Why: in a server a hook runs with cold CPU caches, where every Python frame costs microseconds,
    and the closure ``hooked`` puts around a wrapt-convention wrapper is a second frame per call and
    a bound method built per call; built in, the hook is one frame, with its gate closed too (see
    docs/design/hot-path.md). Called with wrapt's ``(wrapped, instance, args, kwargs)``
    it still works (a target ``hooked`` cannot replace by a function, a test calling the hook alone):
    ``build`` then gets a function of ``*args, **kwargs``, and a generated hook takes the star form.
    """

    build: Callable[[Callable[..., Any], Any, bool], Callable[..., Any]]

    def __call__(self, wrapped: Callable[..., Any], instance: Any, args: tuple, kwargs: dict) -> Any:
        return self.build(lambda _instance, *a, **k: wrapped(*a, **k), _ALWAYS, True)(instance, *args, **kwargs)


def hooked(owner: Any, original: Any, wrapper: Callable[..., Any], enabled: Any = None) -> Any:
    """What replaces ``original`` (an attribute of ``owner``): ``wrapper`` is called instead of it
    while ``enabled`` (a switch gate's ``enabled`` list) is true, ``original`` directly otherwise."""
    on = _ALWAYS if enabled is None else enabled
    raw = original.__func__ if isinstance(original, staticmethod | classmethod) else original
    kind = kind_of(original)
    direct = wrapper if isinstance(wrapper, Direct) else _closure(wrapper) if kind == "sync" else None
    if direct is None or kind == "asyncgen" or not isinstance(raw, types.FunctionType):
        return wrapt.FunctionWrapper(original, wrapper, enabled)
    bound = isinstance(owner, type) and not isinstance(original, staticmethod)
    hook = functools.update_wrapper(direct.build(raw, on, bound), raw)
    if kind == "async" and not inspect.iscoroutinefunction(hook):
        hook = _coroutine_function(hook)
    if isinstance(original, staticmethod):
        return staticmethod(hook)
    return classmethod(hook) if isinstance(original, classmethod) else hook


def _closure(wrapper: Callable[..., Any]) -> Direct:
    """A wrapt-convention sync wrapper as the replacement's body: a closure that calls it with the
    target (bound to ``self``/``cls`` for a method or class method), one frame more than a ``Direct`` hook."""

    def build(func: Callable[..., Any], on: Any, bound: bool) -> Callable[..., Any]:
        if bound:

            def call_bound(first: Any, *args: Any, **kwargs: Any) -> Any:
                if not on:
                    return func(first, *args, **kwargs)
                return wrapper(types.MethodType(func, first), first, args, kwargs)

            return call_bound

        def call(*args: Any, **kwargs: Any) -> Any:
            if not on:
                return func(*args, **kwargs)
            return wrapper(func, None, args, kwargs)

        return call

    return Direct(build)


def apply(hook_id: str, target: str, wrapper: Callable[..., Any], enabled: Any = None) -> Applied:
    """Wrap one target; module-level functions are also re-bound where they were imported by name.

    ``enabled``: a switch gate's ``enabled`` list; while it is false the target is called directly."""
    res = resolve(target)
    new = hooked(res.owner, res.original, wrapper, enabled)
    setattr(res.owner, res.attr, new)
    applied = Applied(hook_id, target, res, hooked=new, enabled=enabled)
    if isinstance(res.owner, types.ModuleType):
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
    _put(applied, applied.resolved.original)


def follow(applied: Applied, among: Sequence[Applied] = ()) -> None:
    """Put a gated hook in place while its gate is on, the original SGLang function while it is off
    (``among``: the process's hooks, so that a hook held inside another on its target counts as in place).

    Why: off by the switch, a hook left in place still costs its frame on every call (with cold
    caches, microseconds), a cost the switch's same-instance comparison could not see (its "off" arm
    would pay it too). Taken out, a switched-off target costs what an uninstrumented one does.
    A reference SGLang took while the hook was in place (a dispatcher's bound method, an import made
    later) still reaches the hook, whose gate then calls the original directly."""
    if applied.enabled is not None and in_place(applied, among) != bool(applied.enabled):
        _put(applied, applied.hooked if applied.enabled else applied.resolved.original)


def in_place(applied: Applied, among: Sequence[Applied] = ()) -> bool:
    """Whether the target's owner holds the hook now: itself, or (``among``: the process's other hooks)
    the hook stacked around it on the same target."""
    res = applied.resolved
    held = res.owner.__dict__.get(res.attr) if isinstance(res.owner, type) else getattr(res.owner, res.attr, None)
    return held is applied.hooked or any(o.hooked is held and o.resolved.original is applied.hooked for o in among)


def _put(applied: Applied, value: Any) -> None:
    res = applied.resolved
    setattr(res.owner, res.attr, value)
    for mod, name in applied.rebound:
        setattr(mod, name, value)
