"""Process-wide plugin state: the role of this process and its links to the collector (set by ``plugin``)."""

from __future__ import annotations

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
