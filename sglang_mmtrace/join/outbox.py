"""Ship stage events from a scheduler or detokenizer process to the collector process.

The hot path appends a tuple to a deque. In a scheduler, ``scheduler.output`` (emitted after SGLang
has handed the first token to the detokenizer) also sends the queued events, on the scheduler's own
thread, as one non-blocking ZMQ message: a pickle of a few tuples and a copy into ZMQ's queue, no
wake-up of another Python thread. The detokenizer's ``detokenize`` is emitted *before* SGLang sends
the text on, so it does not send there: its events go at the start of the detokenizer's next batch
(``flush_pending``; the next decode step, milliseconds later), or with the next heartbeat when no
batch follows. When the collector is slow or gone, messages are dropped and counted, never waited for.

Every message carries its send time (``perf_counter``, one clock for every process of the machine):
the collector's watermark of this process, which tells it when no event for a finished request can
still be on its way from here (``collector.Collector._caught_up``).

A daemon thread applies the runtime switch's flips, which the collector publishes on its control
socket, and confirms each at once with a heartbeat. While the switch is on it also wakes every
``HEARTBEAT_INTERVAL_S`` to send the process's health and any straggling events; while it is off it
blocks on the control socket (no wake-ups, no GIL). ``stop()`` (the plugin's ``uninstall()``) wakes
it through an in-process socket, and it closes its sockets and ends.
"""

from __future__ import annotations

import collections
import contextlib
import os
import pickle
import threading
import time
from typing import Any

from .. import switch, telemetry
from ..stages import SCHEDULER_OUTPUT

HEARTBEAT_INTERVAL_S = 0.5
FLUSH_STAGES = frozenset({SCHEDULER_OUTPUT})
"""Emitted last for its requests, after SGLang handed their output on: sends the queue right away."""

Event = tuple[Any, str, float, float, str, dict[str, Any]]
"""(rid or tuple of rids, stage, t0, t1, clock, attrs)."""


class Outbox:
    def __init__(self, address: str, process: str, control_address: str | None = None) -> None:
        self.address = address
        self.process = process
        self.control_address = control_address
        self._q: collections.deque[Event] = collections.deque()
        self._thread: threading.Thread | None = None
        self._lock = threading.Lock()  # the socket: the emitting thread and the control thread
        self._sock: Any = None
        self._wake_address = f"inproc://mmtrace-outbox-wake-{id(self)}"  # stop() -> the control thread
        self._stopping = False
        self._pid = os.getpid()
        self.pending_gauges: dict[str, Any] = {}

    def add(
        self, rids: Any, stage: str, t0: float, t1: float, clock: str = "host", attrs: dict[str, Any] | None = None
    ) -> None:
        self._q.append((rids, stage, t0, t1, clock, attrs or {}))
        if stage in FLUSH_STAGES:
            self.flush()

    def flush_pending(self) -> None:
        """Send what earlier calls queued, if anything (one truth test when nothing is)."""
        if self._q:
            self.flush()

    def start(self) -> None:
        """Connect, then start the control thread (once)."""
        with self._lock:
            if self._thread is not None:
                return
            import zmq

            sock = zmq.Context.instance().socket(zmq.PUSH)
            sock.setsockopt(zmq.SNDHWM, 10000)
            sock.setsockopt(zmq.LINGER, 0)
            sock.connect(self.address)
            self._sock = sock
            wake = zmq.Context.instance().socket(zmq.PULL)
            wake.setsockopt(zmq.LINGER, 0)
            wake.bind(self._wake_address)  # bound before the thread starts: stop() can always connect
            self._thread = threading.Thread(target=self._run, args=(wake,), name="mmtrace-outbox", daemon=True)
            self._thread.start()

    def stop(self, timeout: float = 2.0) -> None:
        """End the control thread and close the sockets; events still queued are dropped and counted."""
        import zmq

        with self._lock:
            thread, self._stopping = self._thread, True
            if thread is None:
                return
            wake = zmq.Context.instance().socket(zmq.PUSH)
            wake.setsockopt(zmq.LINGER, 0)
            wake.connect(self._wake_address)
            with contextlib.suppress(zmq.Again):
                wake.send(b"stop", zmq.NOBLOCK)
        thread.join(timeout)
        wake.close()
        with self._lock:
            if self._q:
                telemetry.drop("outbox", len(self._q))
                self._q.clear()
            if self._sock is not None:
                self._sock.close()
                self._sock = None
            self._thread = None

    def flush(self, heartbeat: bool = False) -> None:
        """Send the queued events (and the health, if asked) now, on the calling thread; never blocks."""
        t_sent = time.perf_counter()  # before emptying the queue: every event emitted earlier goes now
        batch: list[Event] = []
        pop = self._q.popleft
        try:  # the emitting thread and the control thread may both flush: a truth test then pop could lose
            while True:  # the race for the last event, and an IndexError would drop the events taken so far
                batch.append(pop())
        except IndexError:
            pass
        msgs = [("ev", self.process, self._pid, batch, t_sent)] if batch else []
        if heartbeat:
            msgs.append(("hb", self.process, self._pid, self.health(), t_sent))
        if not msgs:
            return
        import zmq

        with self._lock:
            sock = self._sock
            for msg in msgs:
                try:
                    if sock is None:
                        raise zmq.Again
                    sock.send(pickle.dumps(msg, protocol=pickle.HIGHEST_PROTOCOL), zmq.NOBLOCK)
                except zmq.Again:
                    if msg[0] == "ev":
                        telemetry.drop("outbox", len(msg[3]))
                except Exception as exc:  # never let shipping fail the hook or the thread
                    telemetry.contained("outbox", exc)

    def _run(self, wake: Any) -> None:
        import zmq

        poller = zmq.Poller()
        poller.register(wake, zmq.POLLIN)
        control = None
        if self.control_address:
            control = zmq.Context.instance().socket(zmq.SUB)
            control.setsockopt(zmq.SUBSCRIBE, b"")
            control.setsockopt(zmq.LINGER, 0)
            control.connect(self.control_address)
            poller.register(control, zmq.POLLIN)
        self.flush(heartbeat=True)  # hello: the collector learns this process exists
        while not self._stopping:
            try:
                idle = not self._q and not any(g.on for g in switch.GATES.values())
                timeout = None if idle and control is not None else HEARTBEAT_INTERVAL_S * 1000
                ready = dict(poller.poll(timeout))
                if self._stopping:
                    break
                if control is not None and control in ready:
                    self._apply_flips(control)
                self.flush(heartbeat=True)
            except Exception as exc:  # the control thread must outlive any bad message
                telemetry.contained("outbox.control", exc)
        wake.close()
        if control is not None:
            control.close()

    @staticmethod
    def _apply_flips(control: Any) -> None:
        """Apply every flip waiting on the control socket (the newest wins)."""
        import zmq

        while True:
            try:
                gen, on, parts = pickle.loads(control.recv(zmq.NOBLOCK))
            except zmq.Again:
                return
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
