"""The lab's subcommands on the base install: one line naming the extra to install, exit status 2.

The base install (the plugin, its exporters, ``report``, ``nsys``, ``doctor``) reads records on a
machine without SGLang. ``bench``, ``report --compare`` and ``doctor --matrix`` build on the lab
(``sglang_mmtrace.bench``, ``sglang_mmtrace.harness``), which draws images and bootstraps intervals:
the ``bench`` extra in ``pyproject.toml`` installs what the lab imports beyond the base. ``demo``
serves with SGLang itself, which brings those too: its extra is ``instruments`` (the supported
SGLang releases).
"""

from __future__ import annotations

import sys

BENCH = "bench"
SGLANG = "instruments"
# The top-level modules of the extra's requirements (Pillow installs PIL); a missing module outside
# this set (one the base declares) is a broken install, not a missing extra, and keeps its traceback.
MODULES = frozenset({"numpy", "PIL", "tqdm"})
EXIT_STATUS = 2  # argparse's usage-error status: the command line asked for what this install lacks


def lacks_extra(exc: ModuleNotFoundError) -> bool:
    """Whether ``exc`` is a module of the ``bench`` extra that is not installed."""
    return (exc.name or "").partition(".")[0] in MODULES


def needs_extra(what: str, extra: str = BENCH) -> int:
    """Say on stderr, in one line, that ``what`` (``sglang-mmtrace bench``) needs ``extra``; the exit status."""
    print(f"{what} needs the '{extra}' extra: pip install 'sglang-mmtrace[{extra}]'", file=sys.stderr)
    return EXIT_STATUS
