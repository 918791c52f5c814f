"""Process-wide plugin state: the role of this process and its links to the collector (set by ``plugin``)."""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from .join.client import CollectorClient
    from .join.outbox import Outbox
    from .patch import Applied

role: str | None = None
collector: CollectorClient | None = None
outbox: Outbox | None = None
applied: list[Applied] = []
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
