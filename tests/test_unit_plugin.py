"""Lifecycle, with no server: ``install()`` twice is one install; ``uninstall()`` undoes all of it.

Runs the API-process install in this process (the real SGLang 0.5.23 targets, the real collector
process), then checks what is left behind.
"""

from __future__ import annotations

import os

import pytest

from sglang_mmtrace import config, plugin, runtime, switch, telemetry
from sglang_mmtrace.join.context import ApiTrace
from sglang_mmtrace.sinks import nvtx


def _raw(res):
    """The attribute as its owner holds it (the hook while hooked, the original when not)."""
    return vars(res.owner)[res.attr]


@pytest.fixture
def api_install(monkeypatch):
    monkeypatch.setenv("SGLANG_MMTRACE", "1")
    for name in plugin._COLLECTOR_ENV:
        monkeypatch.delenv(name, raising=False)
    config.reset()
    assert runtime.role is None and runtime.collector is None
    try:
        yield
    finally:
        plugin.uninstall()
        config.reset()


def test_install_twice_is_one_install(api_install):
    assert plugin.install(role=plugin.API) == plugin.API
    collector, applied, undo = runtime.collector, list(runtime.applied), list(runtime.uninstallers)
    assert collector is not None and collector.process.poll() is None
    assert applied and undo  # wrapped functions, and the HTTP middleware
    assert all(_raw(a.resolved) is not a.resolved.original for a in applied)
    address = os.environ[plugin.ev.SGLANG_MMTRACE_COLLECTOR]

    assert plugin.install(role=plugin.API) == plugin.API
    assert runtime.collector is collector and os.environ[plugin.ev.SGLANG_MMTRACE_COLLECTOR] == address
    assert runtime.applied == applied and runtime.uninstallers == undo
    assert len({a.target for a in runtime.applied}) == len(runtime.applied)  # each target wrapped once


def test_uninstall_restores_the_originals_and_stops_the_collector(api_install):
    plugin.install(role=plugin.API)
    applied, collector = list(runtime.applied), runtime.collector
    app = next(a for a in plugin.load_manifest("0.5.23").for_process(plugin.API) if a.hook_id == "http_server.app")
    app_obj = plugin.resolve(app.target).original
    middleware_before = len(app_obj.user_middleware)

    plugin.uninstall()
    assert all(_raw(a.resolved) is a.resolved.original for a in applied)
    assert all(getattr(mod, name) is a.resolved.original for a in applied for mod, name in a.rebound)
    assert len(app_obj.user_middleware) == middleware_before - 1
    assert collector.process.poll() is not None, "the collector process is still running"
    assert not any(name in os.environ for name in plugin._COLLECTOR_ENV)
    assert nvtx._follow_switch not in switch.LISTENERS
    assert (runtime.role, runtime.collector, runtime.applied, runtime.uninstallers) == (None, None, [], [])
    dropped = telemetry.dropped["collector"]
    collector.finish(ApiTrace("in-flight", None, "m", 0.0))  # a request finishing after uninstall: no error
    assert telemetry.dropped["collector"] == dropped + 1

    assert plugin.install(role=plugin.API) == plugin.API  # and it can be installed again
    assert runtime.collector is not None and runtime.collector is not collector
    assert all(_raw(a.resolved) is not a.resolved.original for a in runtime.applied)


def test_a_scheduler_outbox_stops_with_uninstall_and_a_reinstall_starts_one(api_install, monkeypatch, tmp_path):
    """uninstall() ends the outbox's control thread (also while it is blocked on the control socket
    with the switch off) and closes its sockets; install() again starts exactly one new outbox."""
    import threading

    monkeypatch.setenv(plugin.ev.SGLANG_MMTRACE_COLLECTOR, f"ipc://{tmp_path}/events")
    monkeypatch.setenv(plugin.ev.SGLANG_MMTRACE_CONTROL, f"ipc://{tmp_path}/control")
    monkeypatch.setattr(runtime, "outbox", None)  # this process's outbox is the test's, not later tests'

    def outbox_threads():
        return [t for t in threading.enumerate() if t.name == "mmtrace-outbox"]

    before = len(outbox_threads())
    assert plugin.install(role=plugin.SCHEDULER) == plugin.SCHEDULER
    outbox = runtime.outbox
    assert outbox is not None and runtime.applied and runtime.collector is None
    plugin.install(role=plugin.SCHEDULER)  # a no-op: the same outbox, one thread
    assert runtime.outbox is outbox and len(outbox_threads()) == before + 1
    applied = list(runtime.applied)
    switch.apply(switch.Setting(False, ()), switch.generation)  # idle: the thread blocks on its sockets
    try:
        plugin.uninstall()
    finally:
        switch.apply(switch.Setting(True, tuple(switch.PARTS)), switch.generation)
    assert all(_raw(a.resolved) is a.resolved.original for a in applied)
    assert runtime.outbox is None and len(outbox_threads()) == before and outbox._sock is None
    plugin.install(role=plugin.SCHEDULER)
    assert runtime.outbox is not None and runtime.outbox is not outbox and len(outbox_threads()) == before + 1
    plugin.uninstall()
    assert len(outbox_threads()) == before


def test_a_tokenizer_worker_joins_its_parents_collector_and_leaves_it_running(api_install, monkeypatch, tmp_path):
    """``install(API, join=True)`` (the launcher, in a uvicorn worker) with a live owner: no collector of
    its own, an outbox for the switch; uninstall leaves the owner's addresses. Without ``join`` (SGLang's
    loader, e.g. a server started from a process that holds a collector) it starts its own."""
    addresses = {
        plugin.ev.SGLANG_MMTRACE_COLLECTOR: f"ipc://{tmp_path}/events",
        plugin.ev.SGLANG_MMTRACE_CONTROL: f"ipc://{tmp_path}/control",
        plugin.ev.SGLANG_MMTRACE_ADMIN: f"ipc://{tmp_path}/admin",
        plugin.ev.SGLANG_MMTRACE_COLLECTOR_OWNER: str(os.getppid()),
    }
    for name, value in addresses.items():
        monkeypatch.setenv(name, value)
    monkeypatch.setattr(runtime, "outbox", None)
    assert plugin.install(role=plugin.API, join=True) == plugin.API
    assert (
        runtime.collector.process is None and runtime.collector.address == addresses[plugin.ev.SGLANG_MMTRACE_COLLECTOR]
    )
    assert runtime.outbox is not None and runtime.outbox.control_address == addresses[plugin.ev.SGLANG_MMTRACE_CONTROL]
    plugin.uninstall()
    assert runtime.outbox is None and all(os.environ[k] == v for k, v in addresses.items())

    assert plugin.install(role=plugin.API) == plugin.API
    assert runtime.collector.process is not None and os.environ[plugin.ev.SGLANG_MMTRACE_COLLECTOR_OWNER] == str(
        os.getpid()
    )


def test_a_range_only_hook_is_applied_only_where_an_nvtx_tool_is_attached(api_install, monkeypatch):
    """``tokenizer_manager.dispatch`` only brackets ``_send_one_request`` with its NVTX range (the
    stage's times are SGLang's own): with no tool attached SGLang's function stays as it is, with one
    the hook is in place."""
    from sglang.srt.managers.tokenizer_manager import TokenizerManager

    original = vars(TokenizerManager)["_send_one_request"]
    plugin.install("api")
    hook_ids = {a.hook_id for a in runtime.applied}
    assert nvtx.domain is None and "tokenizer_manager.init_req_state" in hook_ids
    assert "tokenizer_manager.dispatch" not in hook_ids
    assert vars(TokenizerManager)["_send_one_request"] is original
    assert all(m[0] != "tokenizer_manager.dispatch" for m in runtime.missing)  # not applied, not missing
    plugin.uninstall()

    monkeypatch.setattr(nvtx, "setup", lambda: setattr(nvtx, "domain", object()) or True)  # a tool attached
    monkeypatch.setattr(nvtx, "teardown", lambda: setattr(nvtx, "domain", None))
    plugin.install("api")
    assert "tokenizer_manager.dispatch" in {a.hook_id for a in runtime.applied}
    assert vars(TokenizerManager)["_send_one_request"] is not original
