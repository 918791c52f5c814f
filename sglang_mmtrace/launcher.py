"""``sglang-mmtrace run -- <command>``: run an SGLang server so that every process of it has the plugin.

SGLang's ``load_plugins()`` runs only in some of its processes (0.5.23: not in the tokenizer workers of
``--tokenizer-worker-num`` > 1; 0.5.17: not in the detokenizer or the DP controller either). Like
``opentelemetry-instrument``, the launcher puts a folder holding a ``sitecustomize.py`` first on
``PYTHONPATH`` and execs the command; every Python process started from it runs that file, which hands
each ``multiprocessing`` child with an SGLang target to ``adopt`` before the target runs. ``adopt``
installs the plugin in the child's role only where SGLang will not (the target calls no
``load_plugins``); ``install()`` is idempotent anyway. Other processes (compile workers, the collector)
pay one attribute check.
"""

from __future__ import annotations

import functools
import os
import shutil
from pathlib import Path
from typing import Any

from . import environment_variables as ev

SITE_DIR = Path(__file__).resolve().parent / "autoinstall"
"""The folder with the launcher's ``sitecustomize.py``, first on the server's ``PYTHONPATH``."""


def role_of(target: Any, kwargs: dict[str, Any]) -> str | None:
    """The plugin role a child must install itself in, or None (not SGLang's, or SGLang loads the plugin).

    A uvicorn worker (``uvicorn._subprocess.subprocess_started`` with an app path; SGLang starts them for
    ``--tokenizer-worker-num`` > 1) is an API process that joins the existing collector."""
    from . import plugin

    func = target
    while isinstance(func, functools.partial):
        func = func.func
    if str(getattr(func, "__module__", "")).startswith("uvicorn") and isinstance(
        getattr(kwargs.get("config"), "app", None), str
    ):
        return plugin.API
    role = plugin.ROLE_BY_CALLER.get(getattr(func, "__name__", ""))
    code = getattr(func, "__code__", None)
    if role is None or code is None or "load_plugins" in code.co_names:
        return None
    return role


def adopt(process: Any) -> None:
    """In a starting ``multiprocessing`` child: install the plugin before its target runs, if needed.

    In a uvicorn worker the install waits for the app's import (``Config.load``): by then the worker
    answers its supervisor's health pings, which it would miss while the install imports SGLang (the
    supervisor kills a worker silent for ``SGLANG_UVICORN_WORKER_HEALTHCHECK_TIMEOUT``, 10 s)."""
    kwargs = process._kwargs or {}
    role = role_of(process._target, kwargs)
    config = kwargs.get("config")
    if role is None:
        return
    if isinstance(getattr(config, "app", None), str) and callable(getattr(config, "load", None)):
        config.load = functools.partial(_installed, role, True, config.load)  # a worker joins the collector
    else:
        process._target = functools.partial(_installed, role, False, process._target)


def _installed(role: str, join: bool, target: Any, /, *args: Any, **kwargs: Any) -> Any:
    from . import plugin, telemetry

    try:
        plugin.install(role, join)
    except Exception as exc:  # never keep SGLang's process from starting
        telemetry.contained("launcher.install", exc)
    return target(*args, **kwargs)


def environment(env: dict[str, str]) -> dict[str, str]:
    """``env`` with the launcher's folder first on ``PYTHONPATH`` and the launcher flag set."""
    path = env.get("PYTHONPATH")
    out = dict(env)
    out["PYTHONPATH"] = str(SITE_DIR) if not path else f"{SITE_DIR}{os.pathsep}{path}"
    out[ev.SGLANG_MMTRACE_LAUNCHER] = "1"
    return out


def run(command: list[str]) -> int:
    """Exec ``command`` under the launcher (does not return unless the command cannot be found)."""
    if command and command[0] == "--":
        command = command[1:]
    if not command:
        print("usage: sglang-mmtrace run -- python -m sglang.launch_server ... (or: sglang serve ...)")
        return 2
    exe = shutil.which(command[0])
    if exe is None:
        print(f"sglang-mmtrace run: {command[0]}: command not found")
        return 127
    os.execve(exe, command, environment(dict(os.environ)))
