"""``sglang-mmtrace run``: this folder goes first on ``PYTHONPATH``, so every Python process of the server
runs this file at start-up (SGLang's children are spawned and inherit the environment).

It only wraps ``multiprocessing``'s child start (stdlib, no plugin import): in a child whose target is
SGLang's, ``sglang_mmtrace.launcher.adopt`` decides whether the plugin must be installed there. Then
the ``sitecustomize`` this file shadows, if any, runs too. Never fails the host process.
"""

import functools
import os
import sys


def _bootstrap() -> None:
    import multiprocessing.process as mpp

    original = mpp.BaseProcess._bootstrap

    def _bootstrap(self, *args, **kwargs):  # runs only in a child, before its target
        try:
            target = self._target
            while isinstance(target, functools.partial):
                target = target.func
            config = (self._kwargs or {}).get("config")
            if str(getattr(target, "__module__", "")).startswith("sglang.") or isinstance(
                getattr(config, "app", None), str
            ):
                from sglang_mmtrace.launcher import adopt

                adopt(self)
        except Exception as exc:
            print(f"[sglang-mmtrace] launcher: not installed in pid {os.getpid()}: {exc!r}", file=sys.stderr)
        return original(self, *args, **kwargs)

    mpp.BaseProcess._bootstrap = _bootstrap


def _chain() -> None:
    """Run the next ``sitecustomize`` on ``sys.path`` after this folder (a user's, or the CPU harness's)."""
    import importlib.util

    here = os.path.dirname(os.path.abspath(__file__))
    folders = [os.path.abspath(p or os.getcwd()) for p in sys.path]
    for folder in folders[folders.index(here) + 1 :] if here in folders else ():
        candidate = os.path.join(folder, "sitecustomize.py")
        if os.path.isfile(candidate):
            spec = importlib.util.spec_from_file_location("_mmtrace_launcher_chained_sitecustomize", candidate)
            if spec is not None and spec.loader is not None:
                spec.loader.exec_module(importlib.util.module_from_spec(spec))
            return


if not getattr(sys, "_mmtrace_launcher", False):  # once, even when another sitecustomize chains back here
    sys._mmtrace_launcher = True
    try:
        _bootstrap()
    except Exception as exc:
        print(f"[sglang-mmtrace] launcher: {exc!r}", file=sys.stderr)
    try:
        _chain()
    except Exception as exc:
        print(f"[sglang-mmtrace] launcher: the next sitecustomize failed: {exc!r}", file=sys.stderr)
