"""The switch's pieces without a server: parsing a setting, the gate wrapper, the NVTX and sink gates."""

from __future__ import annotations

import asyncio

import pytest
import wrapt

from sglang_mmtrace import switch
from sglang_mmtrace.hooks.registry import HOOKS, PART_OF


@pytest.fixture(autouse=True)
def all_on():
    yield
    switch.apply(switch.Setting(True, switch.PARTS), switch.generation + 1)


def test_parse_accepts_on_off_and_known_parts_in_stack_order():
    assert switch.Setting.parse({"on": False}) == switch.Setting(False, switch.PARTS)
    assert switch.Setting.parse({"on": True, "parts": ["mm", "http"]}).parts == ("http", "mm")
    for bad in (None, [], {"on": 1}, {"on": "true"}, {"on": True, "parts": "http"}, {"on": True, "parts": ["x"]}):
        with pytest.raises(ValueError):
            switch.Setting.parse(bad)


def test_apply_sets_every_gate_and_the_generation():
    switch.apply(switch.Setting(True, ("http", "ship")), 41)
    assert switch.snapshot() == {"on": True, "parts": ["http", "ship"], "generation": 41, "hooks": [0, 0]}
    switch.apply(switch.Setting(False, switch.PARTS), 42)
    assert switch.snapshot() == {"on": False, "parts": [], "generation": 42, "hooks": [0, 0]}
    assert not any(g.on for g in switch.GATES.values())


def test_every_measuring_hook_has_a_part_and_set_up_hooks_have_none():
    assert set(PART_OF) == set(HOOKS)
    assert {h for h, p in PART_OF.items() if p is None} == {
        "tokenizer_manager.init",
        "mm_processor.init",
        "detokenizer_legacy.bootstrap",
        "embedding_cache.init",  # counts evictions for the occupancy metrics, on or off
        "cuda_ipc_pool.fallback",
        "model_runner.load_model",  # hooks the loaded model's encoders (applies_to = "model")
        "profiler_manager.start",  # the NVTX sink follows SGLang's torch profiler, on or off
        "profiler_manager.stop",
    }
    assert {p for p in PART_OF.values() if p is not None} <= set(switch.PARTS)


def _counting_wrapper(log: list[str]):
    def wrapper(wrapped, instance, args, kwargs):
        log.append("plugin")
        return wrapped(*args, **kwargs)

    return wrapper


def test_gate_off_is_a_pass_through_and_on_runs_the_wrapper_once():
    log: list[str] = []
    gate = switch.Gate("t")

    def target(x):
        log.append("target")
        if x < 0:
            raise KeyError(x)
        return [x]

    fn = wrapt.FunctionWrapper(target, _counting_wrapper(log), enabled=gate.enabled)
    assert fn(1) == [1] and log == ["plugin", "target"]
    gate.set(False)
    log.clear()
    assert fn(2) == [2] and log == ["target"]
    with pytest.raises(KeyError):
        fn(-1)
    assert log == ["target", "target"]


def test_gate_on_a_coroutine_adds_no_frame_and_passes_results_through():
    log: list[str] = []
    gate = switch.Gate("t")

    async def target(x):
        log.append("target")
        return x * 2

    async def wrapper(wrapped, instance, args, kwargs):
        log.append("plugin")
        return await wrapped(*args, **kwargs)

    fn = wrapt.FunctionWrapper(target, wrapper, enabled=gate.enabled)
    assert asyncio.run(fn(3)) == 6 and log == ["plugin", "target"]
    gate.set(False)
    log.clear()
    coro = fn(4)
    assert coro.cr_code is target.__code__  # the target's own coroutine: nothing between
    assert asyncio.run(coro) == 8 and log == ["target"]


def test_nvtx_part_hides_the_domain_but_open_ranges_still_close(monkeypatch):
    from sglang_mmtrace.sinks import nvtx

    calls: list[str] = []

    class Domain:
        def push_range(self, **kw):
            calls.append("push")

        def pop_range(self):
            calls.append("pop")

    d = Domain()
    monkeypatch.setattr(nvtx, "_attached", d)
    monkeypatch.setattr(nvtx, "domain", d)
    monkeypatch.setattr(switch, "LISTENERS", [nvtx._follow_switch])
    nvtx.push("tokenize", "a")
    switch.apply(switch.Setting(True, tuple(p for p in switch.PARTS if p != "nvtx")), 7)
    assert nvtx.domain is None
    nvtx.pop()  # the range opened before the flip
    switch.apply(switch.Setting(True, switch.PARTS), 8)
    assert nvtx.domain is d and calls == ["push", "pop"]
