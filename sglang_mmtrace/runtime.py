"""Process-wide plugin state: the role of this process and its links to the collector (set by ``plugin``).

A leaf below ``join`` and ``patch``: hooks read it, ``plugin`` fills it, and it imports neither, not even
for its annotations, so the objects it holds are typed ``Any`` and named in their docstrings.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

role: str | None = None
collector: Any = None
"""The API process's ``join.client.CollectorClient`` (None elsewhere, and before ``plugin.install``)."""
outbox: Any = None
"""This process's ``join.outbox.Outbox``: its events' way to the collector (None before ``plugin.install``)."""
applied: list[Any] = []
"""The ``patch.Applied`` of every hook in place."""
uninstallers: list = []
missing: list[tuple[str, str, str]] = []  # (hook id, target, why)
late: dict[str, list] = {}
"""``applies_to`` (``processor``, ``model``) -> the manifest's hooks waiting for the class SGLang builds:
(entry, wrapper, gate's enabled list) each (``plugin._apply_hooks``)."""


def _not_installed(applies_to: str, cls: type, instance: object = None) -> None:
    """``apply_late`` before ``plugin`` is imported: nothing to apply."""


apply_late: Callable[..., None] = _not_installed
"""Set by ``plugin``: hooks ``late[applies_to]`` onto ``cls``. Set-up hooks call it when SGLang has
built its processor or loaded its model (hooks do not import ``plugin``: it imports them)."""


def _no_plugin(role: str | None = None, join: bool = False) -> str | None:
    """``install`` before ``plugin`` is imported: nothing to install."""
    return None


install: Callable[..., str | None] = _no_plugin
"""Set by ``plugin``: ``plugin.install``. The detokenizer bootstrap (``hooks.api.detokenizer_legacy``)
hands it to the process it spawns; pickled by reference, it imports ``plugin`` there."""
