"""Read the plugin's records for the requests a client sent, from the server's JSONL.

``RecordsTail.wait`` is the one "wait for these requests' records" used by the bench, the demo,
the GPU driver and the tests. The file may be long-lived and shared (a dev server), so reading
starts at the size the file had when the tail was made (``from_start`` reads it all), and only
complete lines are parsed (the sink may be mid-write).
"""

from __future__ import annotations

import json
import time
from collections import Counter
from collections.abc import Iterable
from pathlib import Path
from typing import Any


def rid_keys(rid: str) -> tuple[str, ...]:
    """The response id is SGLang's rid; some versions prefix it with ``chatcmpl-``."""
    return (rid, rid.removeprefix("chatcmpl-")) if rid.startswith("chatcmpl-") else (rid,)


class RecordsTail:
    """Records appended to ``path`` after construction, by rid."""

    def __init__(self, path: str | Path | None, from_start: bool = False) -> None:
        self.path: Path | None = Path(path) if path else None
        start_at_end = not from_start and self.path is not None and self.path.exists()
        self.offset: int = self.path.stat().st_size if start_at_end and self.path is not None else 0
        self.by_rid: dict[str, dict[str, Any]] = {}
        self.seen: Counter[str] = Counter()
        """Records read per rid: more than one breaks the contract's one record per request."""

    def poll(self) -> None:
        if self.path is None or not self.path.exists():
            return
        with self.path.open("rb") as fh:
            fh.seek(self.offset)
            data = fh.read()
        end = data.rfind(b"\n")
        if end < 0:
            return
        self.offset += end + 1
        for line in data[: end + 1].splitlines():
            if line.strip():
                try:
                    rec = json.loads(line)
                except json.JSONDecodeError:
                    continue
                if isinstance(rec, dict) and rec.get("rid"):
                    self.by_rid[str(rec["rid"])] = rec
                    self.seen[str(rec["rid"])] += 1

    def find(self, rid: str) -> dict[str, Any] | None:
        return next((self.by_rid[k] for k in rid_keys(rid) if k in self.by_rid), None)

    def wait(self, rids: Iterable[str], timeout: float = 30.0) -> dict[str, dict[str, Any]]:
        """rid -> record for every rid that has one within ``timeout`` (missing rids are left out)."""
        wanted = [r for r in rids if r]
        deadline = time.monotonic() + timeout
        while True:
            self.poll()
            found = {r: rec for r in wanted if (rec := self.find(r)) is not None}
            if len(found) == len(wanted) or self.path is None or time.monotonic() > deadline:
                return found
            time.sleep(0.2)
