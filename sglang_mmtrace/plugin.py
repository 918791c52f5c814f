"""Entry point (``sglang.srt.plugins``: ``mmtrace = sglang_mmtrace.plugin:load``) and installer.

SGLang calls ``load()`` once in each of its processes before it builds the TokenizerManager,
Scheduler or DetokenizerManager, so class-level wrappers are seen by every instance.
"""

from __future__ import annotations

import inspect
import logging
import os
import sys
import types
from collections.abc import Mapping
from dataclasses import replace
from typing import Any

from . import config, runtime, switch, telemetry
from . import environment_variables as ev
from .hooks import registry
from .hooks.base import guarded
from .manifest import HookEntry, Manifest
from .manifest import load as load_manifest
from .package import sglang_version
from .patch import apply, follow, in_place, kind_of, resolve, unpatch
from .sinks import nvtx

logger = logging.getLogger("sglang_mmtrace")

API, SCHEDULER, DETOKENIZER = "api", "scheduler", "detokenizer"
ROLE_BY_CALLER = {
    "run_scheduler_process": SCHEDULER,
    "run_detokenizer_process": DETOKENIZER,
    "run_data_parallel_controller_process": "dp_controller",
}


MULTI_TOKENIZER_LIMIT = (
    "--tokenizer-worker-num %d: SGLang loads no plugin in the HTTP/tokenizer workers, so their requests get "
    "no records or traces; start the server under `sglang-mmtrace run -- ...` to trace them"
)


def tokenizer_workers(argv: list[str]) -> int:
    """``--tokenizer-worker-num N`` on the launch command line (1 when absent or unreadable)."""
    for i, arg in enumerate(argv):
        value = None
        if arg == "--tokenizer-worker-num" and i + 1 < len(argv):
            value = argv[i + 1]
        elif arg.startswith("--tokenizer-worker-num="):
            value = arg.split("=", 1)[1]
        if value is not None:
            try:
                return int(value)
            except ValueError:
                return 1
    return 1


def multi_tokenizer_warning(argv: list[str], env: Mapping[str, str]) -> str | None:
    """The start-up warning for ``--tokenizer-worker-num`` > 1 outside the launcher, else None."""
    workers = tokenizer_workers(argv)
    return MULTI_TOKENIZER_LIMIT % workers if workers > 1 and not env.get(ev.SGLANG_MMTRACE_LAUNCHER) else None


def detect_role() -> str:
    """Which SGLang process this is, from the function that called ``load_plugins()``."""
    frame = inspect.currentframe()
    try:
        while frame is not None:
            role = ROLE_BY_CALLER.get(frame.f_code.co_name)
            if role is not None:
                return role
            frame = frame.f_back
    finally:
        del frame
    return API


def load() -> None:
    """The plugin entry point: never raises into SGLang."""
    try:
        install()
    except Exception as exc:  # pragma: no cover - last line of defence
        telemetry.warn("not installed: %r", exc)


def install(role: str | None = None, join: bool = False) -> str | None:
    """Install the plugin in this process. Returns the role, or None when off.

    ``join``: an API process started by one that holds the collector (SGLang's tokenizer workers, adopted
    by ``launcher``) joins that collector instead of starting its own.

    A second call is a no-op (SGLang's loader and a user's ``sglang_mmtrace.install()`` may both run
    in one process): one set of wrappers, one collector. If installing fails half-way, what was started
    is stopped again, so a later call starts from scratch instead of starting a second collector."""
    if runtime.role is not None:
        return runtime.role
    try:
        return _install(role, join)
    except BaseException:
        uninstall()
        raise


def _install(role: str | None, join: bool) -> str | None:
    cfg = config.get()
    if not cfg.enabled:
        return None
    role = role or detect_role()
    if role not in (API, SCHEDULER, DETOKENIZER):
        runtime.role = role
        return role
    version = sglang_version() or "unknown"
    manifest = load_manifest(version)
    if manifest.override:
        telemetry.warn("manifest override %s=%s", ev.SGLANG_MMTRACE_MANIFEST, manifest.override)
    elif not manifest.exact:
        telemetry.warn("SGLang %s has no manifest; using the %s targets that resolve", version, manifest.version)
    if role == API and join and _collector_of_another_process() is not None:
        _attach_collector()
    elif role == API:
        warning = multi_tokenizer_warning(sys.argv, os.environ)
        if warning:
            telemetry.warn("%s", warning)
        _start_collector(version)
    else:
        address = os.environ.get(ev.SGLANG_MMTRACE_COLLECTOR)
        if not address:
            telemetry.warn("%s process: no collector address (was the API process started without the plugin?)", role)
            runtime.role = role
            return role
        from .join.outbox import Outbox

        runtime.outbox = Outbox(address, role, os.environ.get(ev.SGLANG_MMTRACE_CONTROL))
        if role == SCHEDULER and cfg.metrics:
            from . import occupancy
            from .hooks.base import guarded

            runtime.outbox.pending_gauges["occupancy"] = lambda: guarded("occupancy", occupancy.scheduler_sample)
            runtime.outbox.pending_gauges["ranks"] = lambda: guarded("occupancy", occupancy.scheduler_ranks)
        runtime.outbox.start()
    nvtx.setup()
    _apply_hooks(manifest, role)
    switch.LISTENERS.append(follow_switch)
    follow_switch()
    runtime.role = role
    if role == API and runtime.outbox is None:
        _start_windows(cfg)
    return role


def _start_windows(cfg: config.Config) -> None:
    """The API process that owns the collector drives the tracing windows (``windows.py``) of every
    process. A value that does not parse is warned about once and leaves tracing always on: a typo
    should not silently stop the tracing the user meant to sample."""
    raw = os.environ.get(ev.SGLANG_MMTRACE_WINDOW, "").strip()
    if cfg.window is None and raw:
        telemetry.warn(
            "%s=%r is not <window>/<period> (e.g. 10s/60s); tracing stays always on", ev.SGLANG_MMTRACE_WINDOW, raw
        )
    if cfg.window is not None and runtime.collector is not None:
        runtime.collector.start_windows(cfg.window, wait=False)


def follow_switch() -> None:
    """After every flip: each gated hook in place while its part is on, the original while it is off
    (``patch.follow``). Runs on the thread that applies the flip; each swap is one atomic store.

    Hooks stacked on one target (two hook ids, one attribute) come out outermost first and go back
    innermost first, so a target whose hooks are all off holds SGLang's own function again."""
    applied = list(runtime.applied)
    for a in reversed(applied):
        if a.enabled is not None and not a.enabled:
            guarded("switch.follow", follow, a, applied)
    for a in applied:
        if a.enabled:
            guarded("switch.follow", follow, a, applied)


def hook_count() -> tuple[int, int]:
    """[in place, applied] of this process's gated hooks (``switch.snapshot``'s ``hooks``)."""
    gated = [a for a in runtime.applied if a.enabled is not None]
    return sum(1 for a in gated if in_place(a, gated)), len(gated)


switch.hook_count = hook_count


def _start_collector(version: str) -> None:
    from .join.client import CollectorClient

    client = CollectorClient(version)
    runtime.collector = client
    os.environ[ev.SGLANG_MMTRACE_COLLECTOR] = client.address
    os.environ[ev.SGLANG_MMTRACE_CONTROL] = client.control_address
    os.environ[ev.SGLANG_MMTRACE_ADMIN] = client.admin_address
    os.environ[ev.SGLANG_MMTRACE_COLLECTOR_OWNER] = str(os.getpid())


def _collector_of_another_process() -> str | None:
    """The admin address of a live collector that an ancestor API process started, if any.

    SGLang's tokenizer workers (``--tokenizer-worker-num`` > 1) are API processes spawned by the API
    process that already holds the collector: they inherit its addresses and join it, so every
    request, whichever worker serves it, is joined in one place (and recorded once)."""
    owner, admin = os.environ.get(ev.SGLANG_MMTRACE_COLLECTOR_OWNER), os.environ.get(ev.SGLANG_MMTRACE_ADMIN)
    if not owner or not admin or not os.environ.get(ev.SGLANG_MMTRACE_COLLECTOR) or owner == str(os.getpid()):
        return None
    try:
        os.kill(int(owner), 0)
    except (OSError, ValueError):
        return None  # the owner is gone: this process starts its own
    return admin


def _attach_collector() -> None:
    """Join the collector as one more API process: traces go to its event socket, and an outbox's
    control thread applies the runtime switch's flips here and confirms them (so a flip sent to one
    worker reaches the others) and reports this process's health."""
    from .join.client import CollectorClient
    from .join.outbox import Outbox

    runtime.collector = CollectorClient.attach(
        os.environ[ev.SGLANG_MMTRACE_COLLECTOR],
        os.environ[ev.SGLANG_MMTRACE_CONTROL],
        os.environ[ev.SGLANG_MMTRACE_ADMIN],
    )
    runtime.outbox = Outbox(runtime.collector.address, API, runtime.collector.control_address)
    runtime.outbox.start()


def check(entry: HookEntry) -> tuple[Any, str | None]:
    """Resolve one manifest entry: ``(resolved, None)`` or ``(None, why it cannot be hooked)``."""
    try:
        res = resolve(entry.target)
    except Exception as exc:
        return None, f"unresolved ({type(exc).__name__}: {exc})"
    if entry.kind != "asgi":
        actual = kind_of(res.original)
        if actual != entry.kind:
            return None, f"kind is {actual}, manifest says {entry.kind}"
    return res, None


def _apply_hooks(manifest: Manifest, role: str) -> None:
    for entry in manifest.for_process(role):
        spec = registry.HOOKS.get(entry.hook_id)
        if spec is None:
            runtime.missing.append((entry.hook_id, entry.target, "no hook implementation"))
            continue
        if spec.nvtx_only and nvtx.domain is None:
            continue  # a range only, and no tool to see it
        part = registry.PART_OF[entry.hook_id]
        enabled = switch.gate(part).enabled if part is not None else None
        if entry.applies_to is not None:
            runtime.late.setdefault(entry.applies_to, []).append((entry, spec.make(entry.kind), enabled))
            continue
        res, why = check(entry)
        if why is not None:
            runtime.missing.append((entry.hook_id, entry.target, why))
            stages = ", ".join(entry.stages) or "none"
            telemetry.warn(
                "hook %s -> %s not applied (stages absent: %s): %s", entry.hook_id, entry.target, stages, why
            )
            continue
        try:
            if spec.install is not None:
                runtime.uninstallers.append(spec.install(getattr(res.owner, res.attr)))
            else:
                runtime.applied.append(apply(entry.hook_id, entry.target, spec.make(entry.kind), enabled))
        except Exception as exc:
            runtime.missing.append((entry.hook_id, entry.target, f"apply failed: {exc!r}"))
            telemetry.warn("hook %s -> %s failed to apply: %r", entry.hook_id, entry.target, exc)


def _rebind_captured(instance: Any, original: Any, hooked: Any) -> None:
    """Point the bound methods of ``original`` that ``instance`` captured before it was hooked (a model
    that keeps ``{Modality.IMAGE: self.get_image_feature}`` from its ``__init__``, e.g. InternVL) at
    ``hooked``: one level deep, in its attributes and the dicts it holds. Else the encoder runs unseen."""
    for name, value in list(vars(instance).items()):
        holders = [(vars(instance), name, value)]
        if isinstance(value, dict):
            holders = [(value, k, v) for k, v in list(value.items())]
        for holder, key, bound in holders:
            if getattr(bound, "__func__", None) is original and getattr(bound, "__self__", None) is instance:
                holder[key] = types.MethodType(hooked, instance)


def apply_late(applies_to: str, cls: type, instance: Any = None) -> None:
    """Hook the manifest's ``applies_to`` entries onto ``cls`` (the processor SGLang built, the model it
    loaded): each on the class of ``cls``'s MRO that defines the method, once. A class that lacks the
    method (a model with no ``get_video_feature``) is noted in ``runtime.missing``, as a target that
    does not resolve is; its requests' records list what that costs them as ``unobserved``."""
    for entry, wrapper, enabled in runtime.late.get(applies_to, ()):
        owner = next((c for c in cls.__mro__ if entry.target in c.__dict__), None)
        if owner is None or getattr(owner.__dict__[entry.target], "__isabstractmethod__", False):
            missing = f"{cls.__module__}.{cls.__qualname__}.{entry.target}"
            runtime.missing.append((entry.hook_id, missing, f"{cls.__qualname__} has no {entry.target}"))
            continue
        target = f"{owner.__module__}.{owner.__qualname__}.{entry.target}"
        if any(a.target == target for a in runtime.applied):
            continue
        _, why = check(replace(entry, target=target))
        if why is not None:
            runtime.missing.append((entry.hook_id, target, why))
            telemetry.warn("hook %s -> %s not applied: %s", entry.hook_id, target, why)
            continue
        applied = apply(entry.hook_id, target, wrapper, enabled)
        runtime.applied.append(applied)
        if instance is not None:
            _rebind_captured(instance, applied.resolved.original, applied.hooked)
        follow(applied, runtime.applied)  # out again at once while its part is switched off


runtime.apply_late = apply_late
runtime.install = install


_COLLECTOR_ENV = (
    ev.SGLANG_MMTRACE_COLLECTOR,
    ev.SGLANG_MMTRACE_CONTROL,
    ev.SGLANG_MMTRACE_ADMIN,
    ev.SGLANG_MMTRACE_COLLECTOR_OWNER,
)


def uninstall() -> None:
    """Undo ``install()`` in this process (tests, and users who want it gone at run time).

    The original functions go back (torch's graph-capture methods too, see ``cuda_marks.CaptureWatch``),
    the HTTP middleware comes out, NVTX stops following the switch,
    and in the API process the collector process (which holds the sinks and any metrics server) is
    stopped and its addresses leave the environment, so processes started later do not look for it.
    In a scheduler or the detokenizer the outbox's thread ends and its sockets close."""
    if follow_switch in switch.LISTENERS:
        switch.LISTENERS.remove(follow_switch)
    for applied in reversed(runtime.applied):
        unpatch(applied)
    for undo in reversed(runtime.uninstallers):
        undo()
    runtime.applied.clear()
    runtime.uninstallers.clear()
    runtime.late.clear()
    runtime.missing.clear()
    from .hooks import cuda_marks

    nvtx.teardown()
    cuda_marks.watch.stop()
    if runtime.collector is not None:
        if runtime.collector.process is not None:  # this process started it
            for name in _COLLECTOR_ENV:
                os.environ.pop(name, None)
        runtime.collector.close()
        runtime.collector = None
    if runtime.outbox is not None:
        runtime.outbox.stop()
        runtime.outbox = None
    runtime.role = None
