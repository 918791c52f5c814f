"""The plugin's own health counters: contained hook errors and dropped data, per process.

These back ``sglang_mmtrace_errors_total`` / ``sglang_mmtrace_dropped_total`` and the state report.
"""

from __future__ import annotations

import logging
import sys
import time
from collections import Counter
from typing import Any

from . import config

logger = logging.getLogger("sglang_mmtrace")

errors: Counter[str] = Counter()
dropped: Counter[str] = Counter()
_logged: set[str] = set()


class InjectedError(RuntimeError):
    """Raised by the test-only switch ``SGLANG_MMTRACE_TEST_RAISE``."""


def contained(component: str, exc: BaseException) -> None:
    """Count a failure of plugin code; log the first one per component, never re-raise."""
    errors[component] += 1
    if component not in _logged:
        _logged.add(component)
        logger.warning("sglang-mmtrace: %s failed and was contained: %r", component, exc)


_inject: frozenset[str] | None = None
_stall: tuple[str, float] | None = None
armed: bool | None = None
"""False once the process is known to have neither test switch set: hooks then skip
``maybe_inject`` with one attribute test instead of a call (None: not read yet)."""


def maybe_inject(component: str) -> None:
    """The test-only switches, inside plugin code: ``SGLANG_MMTRACE_TEST_RAISE`` raises in the
    components it names, ``SGLANG_MMTRACE_TEST_STALL`` sleeps in the one it names. Hook wrappers call
    it only while ``armed`` is not False."""
    global _inject, _stall, armed
    if _inject is None:
        cfg = config.get()
        _stall = cfg.test_stall
        _inject = frozenset(cfg.test_raise | ({_stall[0]} if _stall else set()))
        armed = bool(_inject)
    if _inject:
        if _stall is not None and component == _stall[0]:
            time.sleep(_stall[1])
            return
        if "all" in _inject or component in _inject:
            raise InjectedError(f"injected failure in {component}")


def drop(sink: str, n: int = 1, why: object = None) -> None:
    """Count data a sink could not deliver; log the first drop per sink (not one line per request)."""
    dropped[sink] += n
    key = "dropped:" + sink
    if key not in _logged:
        _logged.add(key)
        logger.warning(
            "sglang-mmtrace: %s dropped %d item(s)%s; further drops are only counted",
            sink,
            n,
            f" ({why!r})" if why is not None else "",
        )


def warn(msg: str, *args: Any) -> None:
    """One line, always prefixed ``sglang-mmtrace:`` (how operators and tests tell the plugin's lines apart).

    Scheduler and detokenizer logging is not configured yet at plugin-load time: stderr then.
    """
    if logging.getLogger().handlers or logger.handlers:
        logger.warning("sglang-mmtrace: " + msg, *args)
    else:
        print("sglang-mmtrace: " + (msg % args), file=sys.stderr)
