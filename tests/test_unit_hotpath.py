"""``benchmarks/hotpath.py`` stays in step with the hooks: every hook id it applies or leaves out is a
registry hook, and every stand-in it hooks takes the arguments that hook reads (``registry.READS_OF``)
at the position and name the hook reads them, as the manifest check asks of SGLang's own targets."""

from __future__ import annotations

import inspect
from typing import Any

import pytest

from benchmarks import hotpath
from sglang_mmtrace.hooks.registry import HOOKS, READS_OF


@pytest.fixture
def applied(monkeypatch: pytest.MonkeyPatch) -> dict[str, list[Any]]:
    """hook id -> the stand-in functions the benchmark's traced arms hook with it."""
    seen: dict[str, list[Any]] = {}
    wrap_method, wrap_function = hotpath.wrap_method, hotpath.wrap_function

    def method(cls: type, attr: str, hook_id: str, kind: str) -> None:
        seen.setdefault(hook_id, []).append((cls.__dict__[attr], True))
        wrap_method(cls, attr, hook_id, kind)

    def function(fn: Any, hook_id: str, kind: str) -> Any:
        seen.setdefault(hook_id, []).append((fn, False))
        return wrap_function(fn, hook_id, kind)

    monkeypatch.setattr(hotpath, "wrap_method", method)
    monkeypatch.setattr(hotpath, "wrap_function", function)
    hotpath.build_api(True, 2)
    hotpath.build_scheduler(True)
    hotpath.build_detokenizer(True)
    return seen


def test_every_hook_id_is_a_registry_hook(applied: dict[str, list[Any]]) -> None:
    named = {*applied, *hotpath.API_HOOKS, *hotpath.SCHEDULER_HOOKS}
    assert named - set(HOOKS) == set()
    # the leave-out lists name hooks the traced arms apply (the middleware is built in, not wrapped)
    assert set(hotpath.API_HOOKS) - set(applied) == {"http_server.app"}
    assert set(hotpath.SCHEDULER_HOOKS) <= set(applied)
    assert set(hotpath.API_TEXT_HOOKS) < set(hotpath.API_HOOKS)
    assert set(hotpath.SCHEDULER_TEXT_HOOKS) < set(hotpath.SCHEDULER_HOOKS)


def _problem(fn: Any, bound: bool, reads: tuple[tuple[int | None, str | None], ...]) -> str | None:
    params = list(inspect.signature(fn).parameters.values())[1 if bound else 0 :]
    positional = [p.name for p in params if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)]
    names = {p.name for p in params if p.kind is not p.VAR_POSITIONAL}
    for pos, name in reads:
        if pos is not None and name is not None and (pos >= len(positional) or positional[pos] != name):
            return f"argument {pos} is not {name!r} ({positional})"
        if pos is None and name not in names:
            return f"no parameter {name!r} ({sorted(names)})"
    return None


def test_every_stand_in_takes_what_its_hook_reads(applied: dict[str, list[Any]]) -> None:
    problems = {
        (hook_id, fn.__qualname__): why
        for hook_id, targets in applied.items()
        for fn, bound in targets
        if (why := _problem(fn, bound, READS_OF.get(hook_id, ()))) is not None
    }
    assert problems == {}
    assert "mm_processor_generic.request" in applied  # the request scope reads request_obj by name
