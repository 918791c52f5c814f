"""patch.apply/unpatch keep what SGLang relies on: call once, results/exceptions unchanged, kinds kept."""

from __future__ import annotations

import asyncio
import inspect
import sys
import types

import pytest

from sglang_mmtrace import telemetry
from sglang_mmtrace.hooks.base import before, interval
from sglang_mmtrace.patch import apply, follow, in_place, kind_of, resolve, unpatch


def _module() -> types.ModuleType:
    mod = types.ModuleType("mmtrace_toy")

    class Toy:
        calls = 0

        def sync(self, x, *, y=1):
            Toy.calls += 1
            if x == "boom":
                raise KeyError("boom")
            return (x, y)

        async def coro(self, x):
            Toy.calls += 1
            await asyncio.sleep(0)
            if x == "boom":
                raise ValueError("boom")
            return x * 2

        @staticmethod
        def static(x):
            return x + 1

        @classmethod
        def klass(cls, x):
            return (cls.__name__, x)

    class Shapes:
        calls: list = []

        def plain(self, a, b=None, /, c=3, *, d, e="e"):
            Shapes.calls.append((a, b, c, d, e))
            return (a, b, c, d, e)

        def star(self, *args, **kwargs):
            Shapes.calls.append((args, kwargs))
            return (args, kwargs)

        def clash(self, _mt_func, x):
            Shapes.calls.append((_mt_func, x))
            return x

    def free(x):
        return x - 1

    mod.Toy = Toy
    mod.Shapes = Shapes
    mod.free = free
    sys.modules[mod.__name__] = mod
    return mod


@pytest.fixture
def toy():
    mod = _module()
    yield mod
    sys.modules.pop(mod.__name__, None)


def _recorder(seen: list):
    return interval("toy", lambda st, t0, t1, inst, args, kwargs, result, exc: seen.append((t1 >= t0, result, exc)))


def test_sync_wrapper_calls_once_and_passes_result_and_exception(toy):
    seen: list = []
    applied = apply("toy.sync", "mmtrace_toy.Toy.sync", _recorder(seen).make("sync"))
    obj = toy.Toy()
    assert obj.sync("a", y=3) == ("a", 3)
    with pytest.raises(KeyError, match="boom"):
        obj.sync("boom")
    assert toy.Toy.calls == 2
    assert seen[0] == (True, ("a", 3), None)
    assert isinstance(seen[1][2], KeyError)
    assert inspect.signature(toy.Toy.sync) == inspect.signature(applied.resolved.original)
    unpatch(applied)
    assert toy.Toy.__dict__["sync"] is applied.resolved.original


def test_a_gated_target_off_skips_the_wrapper_and_on_runs_it_once(toy):
    """The switch's gate goes to the hook as ``enabled``: off, the bound method and the module function
    are called directly (the hook never runs); on again, the hook runs once per call."""
    from sglang_mmtrace.switch import Gate

    seen: list = []
    gate = Gate("toy")
    applied = [
        apply("toy.sync", "mmtrace_toy.Toy.sync", _recorder(seen).make("sync"), gate.enabled),
        apply("toy.free", "mmtrace_toy.free", _recorder(seen).make("sync"), gate.enabled),
    ]
    gate.set(False)
    assert toy.Toy().sync("a") == ("a", 1) and toy.free(3) == 2 and seen == []
    gate.set(True)
    assert toy.Toy().sync("b") == ("b", 1) and toy.free(5) == 4
    assert [r for _, r, _ in seen] == [("b", 1), 4]
    for a in reversed(applied):
        unpatch(a)


def test_follow_takes_switched_off_hooks_out_and_puts_them_back(toy):
    """Off, ``follow`` puts SGLang's own functions back: the class attribute, the module function and
    an import of it by name hold the originals, so a call costs no frame of ours. A bound method taken
    while the hook was in place (a dispatcher's) still reaches the hook, whose gate passes it through.
    On again, every place holds the hook and it runs once per call; ``unpatch`` restores either way."""
    from sglang_mmtrace.switch import Gate

    user = types.ModuleType("mmtrace_toy_user")
    user.free = toy.free  # ``from mmtrace_toy import free``
    sys.modules[user.__name__] = user
    seen: list = []
    gate = Gate("toy")
    try:
        applied = [
            apply("toy.sync", "mmtrace_toy.Toy.sync", _recorder(seen).make("sync"), gate.enabled),
            apply("toy.coro", "mmtrace_toy.Toy.coro", _recorder(seen).make("async"), gate.enabled),
            apply("toy.free", "mmtrace_toy.free", _recorder(seen).make("sync"), gate.enabled),
        ]
        sync_orig, coro_orig, free_orig = (a.resolved.original for a in applied)
        held = toy.Toy().sync  # taken while the hook is in place
        assert user.free is toy.free is applied[2].hooked and all(in_place(a) for a in applied)

        gate.set(False)
        for a in applied:
            follow(a)
        assert toy.Toy.__dict__["sync"] is sync_orig and toy.Toy.__dict__["coro"] is coro_orig
        assert toy.free is free_orig and user.free is free_orig
        assert not any(in_place(a) for a in applied)
        assert toy.Toy().sync("a") == ("a", 1) and asyncio.run(toy.Toy().coro(2)) == 4 and user.free(3) == 2
        assert held("b") == ("b", 1) and seen == []  # the gate: straight through

        gate.set(True)
        for a in applied:
            follow(a)
            follow(a)  # idempotent
        assert all(in_place(a) for a in applied) and user.free is applied[2].hooked
        assert toy.Toy().sync("c") == ("c", 1) and asyncio.run(toy.Toy().coro(3)) == 6 and user.free(5) == 4
        assert held("d") == ("d", 1)
        assert [r for _, r, _ in seen] == [("c", 1), 6, 4, ("d", 1)]

        gate.set(False)
        for a in applied:
            follow(a)
        for a in reversed(applied):
            unpatch(a)
        assert toy.Toy.__dict__["sync"] is sync_orig and toy.free is free_orig and user.free is free_orig
    finally:
        sys.modules.pop(user.__name__, None)


def test_follow_switch_takes_stacked_hooks_out_whole_and_puts_them_back_in_order(toy, monkeypatch):
    """Two hooks on one target (0.5.18's ``process_mm_data_async``): off, the target holds the original
    again; on, both hooks are back, the second around the first, each running once per call; with only
    the outer one's part off, the inner one stays in place."""
    from sglang_mmtrace import plugin, runtime
    from sglang_mmtrace.switch import Gate

    inner_gate, outer_gate = Gate("inner"), Gate("outer")
    seen: list = []
    inner = apply("toy.inner", "mmtrace_toy.Toy.sync", _recorder(seen).make("sync"), inner_gate.enabled)
    outer = apply("toy.outer", "mmtrace_toy.Toy.sync", _recorder(seen).make("sync"), outer_gate.enabled)
    monkeypatch.setattr(runtime, "applied", [inner, outer])
    original = inner.resolved.original
    try:
        inner_gate.set(False)
        outer_gate.set(False)
        plugin.follow_switch()
        assert toy.Toy.__dict__["sync"] is original
        inner_gate.set(True)
        outer_gate.set(True)
        plugin.follow_switch()
        assert toy.Toy.__dict__["sync"] is outer.hooked and outer.resolved.original is inner.hooked
        assert in_place(inner, [inner, outer]) and not in_place(inner)  # held through the outer hook
        from sglang_mmtrace import patch

        stores: list = []
        with monkeypatch.context() as m:
            m.setattr(patch, "_put", lambda a, value: stores.append((a.hook_id, value)))
            plugin.follow_switch()  # a flip that leaves both on moves nothing (the inner hook is held)
        assert stores == []
        assert toy.Toy().sync("a") == ("a", 1) and len(seen) == 2
        outer_gate.set(False)
        plugin.follow_switch()
        assert toy.Toy.__dict__["sync"] is inner.hooked
        assert toy.Toy().sync("b") == ("b", 1) and len(seen) == 3
    finally:
        unpatch(outer)
        unpatch(inner)
    assert toy.Toy.__dict__["sync"] is original


def test_before_on_a_coroutine_returns_the_targets_own_coroutine(toy):
    """No plugin frame in the await chain: the coroutine awaited is the target's, the enter step ran
    once when it was created, and results and exceptions pass through."""
    seen: list = []
    applied = apply("toy.coro", "mmtrace_toy.Toy.coro", before("toy", lambda i, a, k: seen.append(a)).make("async"))
    obj = toy.Toy()
    coro = obj.coro(3)
    assert coro.cr_code is applied.resolved.original.__code__ and seen == [(3,)]
    assert asyncio.run(coro) == 6
    with pytest.raises(ValueError, match="boom"):
        asyncio.run(obj.coro("boom"))
    assert toy.Toy.calls == 2 and len(seen) == 2
    assert kind_of(toy.Toy.coro) == "async"
    unpatch(applied)


def test_a_classmethod_hook_sees_the_class_and_called_through_the_class_a_method_sees_self(toy):
    """0.5.17's ``_load_single_item`` is a classmethod: the hook gets the class as ``instance`` and a
    bound ``wrapped``; an instance method called as ``Class.method(obj, ...)`` still gets ``obj``."""
    seen: list = []

    def record(i, a, k):
        seen.append((i, a, k))

    applied = [
        apply("toy.klass", "mmtrace_toy.Toy.klass", before("toy", record).make("sync")),
        apply("toy.sync", "mmtrace_toy.Toy.sync", before("toy", record).make("sync")),
    ]
    obj = toy.Toy()
    assert toy.Toy.klass(4) == ("Toy", 4) and obj.klass(5) == ("Toy", 5)
    assert toy.Toy.sync(obj, "x", y=2) == ("x", 2)
    assert seen == [(toy.Toy, (4,), {}), (toy.Toy, (5,), {}), (obj, ("x",), {"y": 2})]
    assert inspect.signature(toy.Toy.klass) == inspect.signature(applied[0].resolved.original.__func__.__get__(toy.Toy))
    for a in reversed(applied):
        unpatch(a)
    assert toy.Toy.__dict__["klass"] is applied[0].resolved.original


def test_a_coroutine_targets_hooks_are_built_in_and_still_read_as_coroutine_functions(toy):
    """No wrapt proxy on a coroutine target (a proxy cost twice the hook with cold caches): an interval
    hook is an ``async def`` and the instance sees it as itself (``instance`` = the object, ``args``
    without it); a ``before`` hook is a plain function that ``inspect`` (3.12+) or ``asyncio`` (3.11)
    still calls a coroutine function, and the gate closed it goes straight to the target."""
    seen: list = []
    timed = apply("toy.coro", "mmtrace_toy.Toy.coro", interval("toy", lambda *a: seen.append(a[3:6])).make("async"))
    obj = toy.Toy()
    assert type(toy.Toy.__dict__["coro"]) is types.FunctionType and inspect.iscoroutinefunction(toy.Toy.coro)
    assert asyncio.run(obj.coro(5)) == 10 and seen == [(obj, (5,), {})]
    unpatch(timed)
    gate: list[bool] = [True]
    entered: list = []
    applied = apply(
        "toy.coro", "mmtrace_toy.Toy.coro", before("toy", lambda i, a, k: entered.append(i)).make("async"), gate
    )
    hook = toy.Toy.__dict__["coro"]
    assert type(hook) is types.FunctionType and kind_of(hook) == "async"
    if sys.version_info >= (3, 12):
        assert inspect.iscoroutinefunction(hook)
    else:
        assert getattr(hook, "_is_coroutine", None) is asyncio.coroutines._is_coroutine
    gate.clear()
    assert asyncio.run(obj.coro(2)) == 4 and entered == []
    gate.append(True)
    assert asyncio.run(obj.coro(3)) == 6 and entered == [obj]
    unpatch(applied)


def test_async_kind_preserved(toy):
    seen: list = []
    applied = apply("toy.coro", "mmtrace_toy.Toy.coro", _recorder(seen).make("async"))
    assert inspect.iscoroutinefunction(toy.Toy.coro)
    assert kind_of(toy.Toy.__dict__["coro"]) == "async"
    assert asyncio.run(toy.Toy().coro(4)) == 8
    with pytest.raises(ValueError):
        asyncio.run(toy.Toy().coro("boom"))
    assert [s[1] for s in seen] == [8, None] and toy.Toy.calls == 2
    unpatch(applied)


def test_staticmethod_descriptor_kept(toy):
    applied = apply("toy.static", "mmtrace_toy.Toy.static", before("toy", lambda i, a, k: None).make("sync"))
    assert isinstance(toy.Toy.__dict__["static"], object)
    assert toy.Toy.static(1) == 2 and toy.Toy().static(1) == 2
    unpatch(applied)
    assert isinstance(toy.Toy.__dict__["static"], staticmethod)


def test_module_function_rebound_where_imported_by_name(toy):
    importer = types.ModuleType("mmtrace_toy_importer")
    importer.free = toy.free  # `from mmtrace_toy import free`
    sys.modules[importer.__name__] = importer
    try:
        seen: list = []
        applied = apply("toy.free", "mmtrace_toy.free", _recorder(seen).make("sync"))
        assert importer.free(5) == 4 and toy.free(5) == 4
        assert len(seen) == 2
        unpatch(applied)
        assert importer.free is applied.resolved.original
    finally:
        sys.modules.pop(importer.__name__, None)


def test_failing_plugin_code_is_contained_and_counted(toy):
    def broken(st, t0, t1, inst, args, kwargs, result, exc):
        raise RuntimeError("plugin bug")

    before_count = telemetry.errors["toy.broken"]
    applied = apply("toy.sync", "mmtrace_toy.Toy.sync", interval("toy.broken", broken).make("sync"))
    assert toy.Toy().sync("a") == ("a", 1)
    assert telemetry.errors["toy.broken"] == before_count + 1
    unpatch(applied)


def test_inherited_attribute_is_refused(toy):
    class Child(toy.Toy):
        pass

    toy.Child = Child
    with pytest.raises(AttributeError, match="inherited"):
        resolve("mmtrace_toy.Child.sync")


@pytest.mark.parametrize("kind", ["sync", "async"])
def test_entered_only_passes_unentered_calls_straight_through(toy, kind):
    """``entered_only``: an ``on_enter`` of None (a decode step for a prefill hook) skips the exit step;
    the call is still made exactly once, with its result and exceptions unchanged."""
    exits: list = []
    spec = interval(
        "toy",
        lambda st, t0, t1, inst, args, kwargs, result, exc: exits.append((st, result, exc)),
        on_enter=lambda inst, args, kwargs: "entered" if args[0] == "measure" else None,
        entered_only=True,
    )
    name = "sync" if kind == "sync" else "coro"
    applied = apply(f"toy.{name}", f"mmtrace_toy.Toy.{name}", spec.make(kind))
    obj = toy.Toy()

    def call(x):
        out = getattr(obj, name)(x)
        return asyncio.run(out) if kind == "async" else out

    skipped = call("skip")
    measured = call("measure")
    with pytest.raises((KeyError, ValueError)):
        call("boom")  # not entered: the exception passes through untouched
    assert toy.Toy.calls == 3
    assert exits == [("entered", measured, None)] and skipped != measured
    unpatch(applied)


def test_entered_only_needs_an_enter_step():
    with pytest.raises(ValueError, match="entered_only"):
        interval("toy", lambda *a: None, entered_only=True)


@pytest.mark.parametrize("fails", ["names", "mark", "store", "none"])
def test_forward_marks_contain_failures_and_call_once(monkeypatch, fails):
    """``model_runner.around_forward`` (the wrappers inside the forward): a failure in any step of its
    own code is counted, the wrapped call still runs exactly once and its result or exception passes."""
    from sglang_mmtrace.hooks.scheduler import model_runner
    from sglang_mmtrace.hooks.scheduler import state as ss

    marks = iter(range(100))

    class Clock:
        def mark(self):
            if fails == "mark":
                raise RuntimeError("mark")
            return float(next(marks))

    ctx = types.SimpleNamespace(clock=Clock(), rids=("r1",))
    stored: list = []

    def names(c, args, kwargs):
        if fails == "names":
            raise RuntimeError("names")
        return c.rids

    def store(c, m0, m1, args, kwargs):
        if fails == "store":
            raise RuntimeError("store")
        stored.append((m0, m1))

    wrapper = model_runner.around_forward("toy.forward", "model.prefill", names, store, start=Clock.mark).make("sync")
    calls: list = []

    def target(x):
        calls.append(x)
        if x == "boom":
            raise KeyError("boom")
        return x * 2

    monkeypatch.setattr(ss, "current", ctx)
    before_count = telemetry.errors["toy.forward"]
    assert wrapper(target, None, (21,), {}) == 42
    with pytest.raises(KeyError, match="boom"):
        wrapper(target, None, ("boom",), {})
    assert calls == [21, "boom"]
    # per call: the names, the store or the first mark fail once (no end mark after a failed start);
    # nothing is stored then
    failures = {"none": 0, "names": 2, "store": 2, "mark": 2}[fails]
    assert telemetry.errors["toy.forward"] == before_count + failures
    assert stored == ([] if fails != "none" else [(0.0, 1.0), (2.0, 3.0)])
    monkeypatch.setattr(ss, "current", None)
    assert wrapper(target, None, (1,), {}) == 2 and len(calls) == 3  # outside a prefill: straight through


def _source(hook) -> str:
    import linecache

    return "".join(linecache.getlines(hook.__code__.co_filename))


@pytest.mark.parametrize("attr", ["plain", "star", "clash"])
def test_a_generated_hook_takes_its_targets_own_parameters_and_passes_them_on_unchanged(toy, attr):
    """``patch.call_shape``: the replacement has the target's signature (positional-only, defaults,
    keyword-only) or, for ``*args``/``**kwargs`` and names that clash with the generated code's, the
    star form; either way the target gets the values the caller gave (defaults as the target's own
    objects), once, and the hook sees the positional ones in ``args`` and the keyword-only ones in
    ``kwargs``."""
    seen: list = []
    spec = interval(
        "toy", lambda st, t0, t1, inst, args, kwargs, result, exc: seen.append((args, dict(kwargs), result))
    )
    original = toy.Shapes.__dict__[attr]
    applied = apply(f"toy.{attr}", f"mmtrace_toy.Shapes.{attr}", spec.make("sync"))
    obj = toy.Shapes()
    hook = toy.Shapes.__dict__[attr]
    assert inspect.signature(hook) == inspect.signature(original)
    if attr == "plain":
        assert _source(hook).startswith("def _mt_hook(self, a, b=_mt_d2, /, c=_mt_d3, *, d, e=_mt_k1):")
        out = obj.plain(1, d=4)
        assert out == (1, None, 3, 4, "e") and seen[-1] == ((1, None, 3), {"d": 4, "e": "e"}, out)
        out = obj.plain(1, 2, c=5, d=6, e="x")
        assert out == (1, 2, 5, 6, "x") and seen[-1] == ((1, 2, 5), {"d": 6, "e": "x"}, out)
        with pytest.raises(TypeError, match=r"plain\(\) missing 1 required keyword-only argument: 'd'"):
            obj.plain(1)  # the target's own message: nothing of the hook's runs
        assert len(toy.Shapes.calls) == 2 and len(seen) == 2
    elif attr == "star":
        assert _source(hook).startswith("def _mt_hook(*_mt_args, **_mt_kwargs):")
        out = obj.star(1, 2, k=3)
        assert out == ((1, 2), {"k": 3}) and seen[-1] == ((1, 2), {"k": 3}, out)
    else:
        assert _source(hook).startswith("def _mt_hook(*_mt_args, **_mt_kwargs):")
        assert obj.clash("f", 7) == 7 and seen[-1] == (("f", 7), {}, 7)
    unpatch(applied)
    assert toy.Shapes.__dict__[attr] is original


def test_a_generated_hook_shows_its_source_in_tracebacks_and_keeps_no_reference_cycle(toy):
    import gc
    import traceback

    spec = interval("toy.trace", lambda *a: None)
    applied = apply("toy.plain", "mmtrace_toy.Shapes.plain", spec.make("sync"))
    try:
        toy.Shapes().plain(1, d=None, e=None)
        hook = toy.Shapes.__dict__["plain"]
        assert hook.__code__.co_filename == "<mmtrace toy.trace>" and hook.__name__ == "plain"
        try:
            toy.Shapes().plain()
        except TypeError:
            text = traceback.format_exc()
        assert "Shapes.plain() missing" in text
        assert "_mt_hook" not in hook.__globals__  # no function -> globals -> function cycle
        gc.collect()
        built = spec.make("sync").build(lambda x: x, [True], False)
        del built
        assert gc.collect() == 0
    finally:
        unpatch(applied)
