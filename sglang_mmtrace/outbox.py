"""Ship stage events from a scheduler or detokenizer process to the API process's collector.

The hot path only appends a tuple to a deque. A daemon thread drains it every 50 ms and
sends one non-blocking ZMQ message; when the collector is slow or gone, messages are dropped and
counted, never waited for. The same thread applies the runtime switch's flips, which the API
process publishes on its control socket, and confirms each with a heartbeat; while the switch is
off it blocks on that socket.
"""

from __future__ import annotations

import collections
import os
import pickle
import threading
import time
from typing import Any

from . import switch, telemetry

FLUSH_INTERVAL_S = 0.05
"""Long enough that waking this thread (and taking the GIL from the scheduler loop) is rare."""
HEARTBEAT_INTERVAL_S = 0.5

Event = tuple[Any, str, float, float, str, dict[str, Any]]
"""(rid or tuple of rids, stage, t0, t1, clock, attrs)."""


class Outbox:
    def __init__(self, address: str, process: str, control_address: str | None = None) -> None:
        self.address = address
        self.control_address = control_address
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
        poller = zmq.Poller()
        control = None
        if self.control_address:
            control = ctx.socket(zmq.SUB)
            control.setsockopt(zmq.SUBSCRIBE, b"")
            control.setsockopt(zmq.LINGER, 0)
            control.connect(self.control_address)
            poller.register(control, zmq.POLLIN)
        pid = os.getpid()
        last_hb = 0.0
        while True:
            # Switch off and nothing queued: block until the next flip (no wake-ups, no GIL).
            idle = not self._q and not any(g.on for g in switch.GATES.values())
            flipped = False
            if control is None:
                time.sleep(FLUSH_INTERVAL_S)
            elif poller.poll(None if idle else FLUSH_INTERVAL_S * 1000):
                flipped = self._apply_flips(control)
            batch: list[Event] = []
            q = self._q
            while q:
                batch.append(q.popleft())
            msgs = []
            if batch:
                msgs.append(("ev", self.process, pid, batch))
            t = time.monotonic()
            if flipped or (t - last_hb >= HEARTBEAT_INTERVAL_S and not idle):
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

    @staticmethod
    def _apply_flips(control: Any) -> bool:
        """Apply every flip waiting on the control socket (the newest wins); True if one was read."""
        import zmq

        got = False
        while True:
            try:
                gen, on, parts = pickle.loads(control.recv(zmq.NOBLOCK))
            except zmq.Again:
                return got
            except Exception as exc:
                telemetry.contained("outbox.control", exc)
                continue
            got = True
            if gen != switch.generation:
                switch.apply(switch.Setting(on, tuple(parts)), gen)

    def health(self) -> dict[str, Any]:
        return {
            "errors": dict(telemetry.errors),
            "dropped": dict(telemetry.dropped),
            "queued_events": len(self._q),
            "switch": switch.snapshot(),
            **{k: (v() if callable(v) else v) for k, v in self.pending_gauges.items()},
        }
