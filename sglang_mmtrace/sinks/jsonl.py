"""JSONL sink: one record per finished request, appended to ``SGLANG_MMTRACE_JSONL``."""

from __future__ import annotations

import json
import os
import threading
from typing import Any


class JsonlSink:
    def __init__(self, path: str) -> None:
        self.path = path
        parent = os.path.dirname(os.path.abspath(path))
        os.makedirs(parent, exist_ok=True)
        self._fh = open(path, "a", encoding="utf-8")  # noqa: SIM115 - kept open for the process
        self._lock = threading.Lock()

    def emit(self, record: dict[str, Any], ctx: Any = None) -> None:
        line = json.dumps(record, separators=(",", ":")) + "\n"
        with self._lock:
            self._fh.write(line)
            self._fh.flush()

    def close(self) -> None:
        with self._lock:
            self._fh.close()
