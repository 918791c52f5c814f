"""Ship stage events from a scheduler or detokenizer process to the API process's collector.

The hot path only appends a tuple to a deque. A daemon thread drains it every 50 ms and
sends one non-blocking ZMQ message; when the collector is slow or gone, messages are dropped and
counted, never waited for.
"""

from __future__ import annotations

import collections
import os
import pickle
import threading
import time
from typing import Any

from . import telemetry

FLUSH_INTERVAL_S = 0.05
"""Long enough that waking this thread (and taking the GIL from the scheduler loop) is rare."""
HEARTBEAT_INTERVAL_S = 0.5

Event = tuple[Any, str, float, float, str, dict[str, Any]]
"""(rid or tuple of rids, stage, t0, t1, clock, attrs)."""


class Outbox:
    def __init__(self, address: str, process: str) -> None:
        self.address = address
        self.process = process
        self._q: collections.deque[Event] = collections.deque()
        self._thread: threading.Thread | None = None
        self._lock = threading.Lock()
        self.pending_gauges: dict[str, Any] = {}

    def add(
        self, rids: Any, stage: str, t0: float, t1: float, clock: str = "host", attrs: dict[str, Any] | None = None
    ) -> None:
        self._q.append((rids, stage, t0, t1, clock, attrs or {}))
        if self._thread is None:
            self.start()

    def start(self) -> None:
        with self._lock:
            if self._thread is None:
                self._thread = threading.Thread(target=self._run, name="mmtrace-outbox", daemon=True)
                self._thread.start()

    def _run(self) -> None:
        import zmq

        ctx = zmq.Context.instance()
        sock = ctx.socket(zmq.PUSH)
        sock.setsockopt(zmq.SNDHWM, 10000)
        sock.setsockopt(zmq.LINGER, 0)
        sock.connect(self.address)
        pid = os.getpid()
        last_hb = 0.0
        while True:
            time.sleep(FLUSH_INTERVAL_S)
            batch: list[Event] = []
            q = self._q
            while q:
                batch.append(q.popleft())
            msgs = []
            if batch:
                msgs.append(("ev", self.process, pid, batch))
            t = time.monotonic()
            if t - last_hb >= HEARTBEAT_INTERVAL_S:
                last_hb = t
                msgs.append(("hb", self.process, pid, self.health()))
            for msg in msgs:
                try:
                    sock.send(pickle.dumps(msg, protocol=pickle.HIGHEST_PROTOCOL), zmq.NOBLOCK)
                except zmq.Again:
                    if msg[0] == "ev":
                        telemetry.drop("outbox", len(msg[3]))
                except Exception as exc:  # never let the shipping thread die
                    telemetry.contained("outbox", exc)

    def health(self) -> dict[str, Any]:
        return {
            "errors": dict(telemetry.errors),
            "dropped": dict(telemetry.dropped),
            "queued_events": len(self._q),
            **{k: (v() if callable(v) else v) for k, v in self.pending_gauges.items()},
        }
