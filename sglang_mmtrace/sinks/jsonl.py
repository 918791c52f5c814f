"""JSONL sink: one record per finished request, appended to ``SGLANG_MMTRACE_JSONL``.

One unbuffered ``write`` per record on an ``O_APPEND`` descriptor: a full disk or an unwritable file
drops that record (``sglang_mmtrace_dropped_total{sink="jsonl"}``, logged once), keeps nothing
queued in memory, and never leaves half a line behind (a short write is cut back off).
"""

from __future__ import annotations

import errno
import json
import os
import threading
from typing import Any

from .. import telemetry


class JsonlSink:
    PART = "jsonl"  # the switch part that gates this sink

    def __init__(self, path: str) -> None:
        self.path = path
        parent = os.path.dirname(os.path.abspath(path))
        os.makedirs(parent, exist_ok=True)
        self._fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
        self._lock = threading.Lock()

    def emit(self, record: dict[str, Any], ctx: Any = None) -> None:
        data = (json.dumps(record, separators=(",", ":")) + "\n").encode()
        with self._lock:
            try:
                self._write(data)
            except OSError as exc:
                telemetry.drop("jsonl", 1, exc)

    def _write(self, data: bytes) -> None:
        start = os.lseek(self._fd, 0, os.SEEK_END)
        done = os.write(self._fd, data)
        if done < len(data):  # disk full part-way: cut the partial line off again
            os.ftruncate(self._fd, start)
            raise OSError(errno.ENOSPC, f"short write ({done} of {len(data)} bytes)", self.path)

    def close(self) -> None:
        with self._lock:
            os.close(self._fd)
