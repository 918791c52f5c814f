"""The API process's end of the collector process (``collector.py``): start it, hand it requests.

Nothing here runs a thread in SGLang's API process but the tracing windows' driver (``windows.py``,
only with windows set), which sleeps between window edges. ``finish_http`` runs on the event loop once a
response is complete: it pickles the exchange's traces (as plain tuples, ``context.to_wire``) and
copies them into a non-blocking ZMQ socket (a full queue drops and counts them, it never waits). A timer
of the same loop sends the occupancy of the process's caches once a second when it changed
(``occupancy.api_sample``). The admin calls (``/mmtrace/state``,
``/mmtrace/enabled``, starting the metrics) are request/reply round trips to the collector, run on
the default executor so the event loop does not wait on them; flips, the user's and the windows',
are applied one at a time.
"""

from __future__ import annotations

import asyncio
import os
import pickle
import subprocess
import sys
import threading
import time
from typing import Any

from .. import switch, telemetry
from ..windows import Driver, Schedule
from . import ipc
from .context import LIVE, ApiTrace, EngineCall, HttpCtx, to_wire

HEALTH_EVERY_S = 0.5
"""How often the API process's own counters ride along with a finished request."""
ADMIN_TIMEOUT_S = 10.0
FLIP_WAIT_S = 8.0
"""Longer than the collector's own wait for confirmations (5 s), so its answer always arrives."""

_ship = switch.gate("ship")
_metrics = switch.gate("prometheus")


class CollectorClient:
    """``CollectorClient(version)`` starts the collector process; ``attach`` joins one that another
    API process started (SGLang's tokenizer workers), which it then neither owns nor stops."""

    def __init__(self, sglang_version: str | None, addresses: tuple[str, str, str] | None = None) -> None:
        import zmq

        self.folder: str | None = None  # the sockets' folder, when this client made it
        if addresses is None:
            self.folder = ipc.new_folder()
            addresses = ipc.addresses(self.folder)
        self.address, self.control_address, self.admin_address = addresses
        self.process: subprocess.Popen[bytes] | None = None
        if sglang_version is not None and self.folder is not None:
            self.process = subprocess.Popen(
                [
                    sys.executable, "-m", "sglang_mmtrace.join.collector",
                    "--ipc-dir", self.folder, "--sglang-version", sglang_version, "--parent", str(os.getpid()),
                ],
                stdin=subprocess.DEVNULL,
            )  # fmt: skip
        self._sock: Any = zmq.Context.instance().socket(zmq.PUSH)
        self._sock.setsockopt(zmq.SNDHWM, 10000)
        self._sock.setsockopt(zmq.LINGER, 0)
        self._sock.connect(self.address)
        self._lock = threading.Lock()
        self._pid = os.getpid()
        self._last_health = 0.0
        self.metrics_started = False
        self._tokenizer_manager: Any = None  # whose caches the occupancy timer reads (set with the metrics)
        self._occupancy_timer: asyncio.TimerHandle | None = None
        self._occupancy_sent: Any = None
        self._flip_lock = threading.RLock()  # one flip at a time: the event loop's and the windows'
        self.windows: Driver | None = None
        """The tracing windows' driver (``windows.py``): the last one started, running or overridden."""

    @classmethod
    def attach(cls, address: str, control_address: str, admin_address: str) -> CollectorClient:
        client = cls(None, (address, control_address, admin_address))
        client._last_health = float("inf")  # its outbox's heartbeats carry this process's health
        return client

    # -- request path (event loop) ---------------------------------------------------------------
    def finish(self, trace: ApiTrace) -> None:
        self._ship([trace])

    def finish_http(self, http: HttpCtx) -> None:
        self._ship(http.traces)

    def finish_call(self, call: EngineCall) -> None:
        """The offline Engine's ``generate`` returned: its requests are complete (or failed)."""
        self._ship(call.traces)

    def _ship(self, traces: list[ApiTrace]) -> None:
        """Hand finished requests over; they leave ``LIVE`` now, whatever their status.

        A request that did not start and end (its last body byte, not the app's return, which SGLang
        delays) in the same switch generation is marked for discard (the collector then also drops
        the other processes' events for it).

        Each handed-over trace lets go of its HTTP exchange (``trace.http``), which lists it
        (``http.traces``): without that cycle a request's objects are freed as soon as SGLang drops
        them, instead of waiting as garbage for a collection (a request's objects left as garbage make
        the API process's garbage collector run more often, on SGLang's event loop)."""
        out = []
        closed = []
        for trace in traces:
            if trace.closed:
                continue
            trace.closed = True
            closed.append(trace)
            LIVE.pop(trace.rid, None)
            http = trace.http
            if http is not None and http.gen != (switch.generation if http.gen_end is None else http.gen_end):
                trace.discard = True
            elif not (http.ship if http is not None else _ship.on):
                continue
            else:
                trace.read_sglang_notes()
                if trace.gpu_pending:
                    trace.resolve_gpu()
            out.append(trace)
        if self._tokenizer_manager is not None and self._occupancy_timer is None:
            self._occupancy_tick()  # the first finished request runs on the serving loop: the timer starts there
        if out:
            t = time.monotonic()
            health = None
            if t - self._last_health >= HEALTH_EVERY_S:
                self._last_health = t
                health = self._health()
            if not self._send(([to_wire(tr) for tr in out], health)):
                telemetry.drop("collector", len(out))
        for trace in closed:
            trace.http = trace.sglang_state = None

    def _health(self) -> dict[str, Any]:
        return {"errors": dict(telemetry.errors), "dropped": dict(telemetry.dropped)}

    def _send(self, body: tuple[list[Any], dict[str, Any] | None]) -> bool:
        """One non-blocking message to the collector; False when its queue is full or the socket closed."""
        import zmq

        with self._lock:
            if self._sock is None:  # closed by uninstall() while this request was in flight
                return False
            try:
                msg = ("api", "api", self._pid, body)
                self._sock.send(pickle.dumps(msg, pickle.HIGHEST_PROTOCOL), zmq.NOBLOCK)
            except zmq.Again:
                return False
        return True

    def _occupancy_tick(self) -> None:
        """Every ``occupancy.API_INTERVAL_S`` on the event loop: read this process's caches and pool, and
        send them (with the health counters) when they changed. A few attribute reads; no thread."""
        from .. import occupancy

        try:
            if _metrics.on:
                sample = occupancy.api_sample(self._tokenizer_manager)
                if sample != self._occupancy_sent and self._send(([], {**self._health(), "occupancy": sample})):
                    self._occupancy_sent = sample
            if self._sock is not None:
                loop = asyncio.get_running_loop()
                self._occupancy_timer = loop.call_later(occupancy.API_INTERVAL_S, self._occupancy_tick)
        except Exception as exc:
            telemetry.contained("occupancy", exc)
            if self._occupancy_timer is None:  # never started (no running loop): do not try on every request
                self._tokenizer_manager = None

    def close(self, timeout_s: float = 5.0) -> None:
        """Stop the collector process if this client started it (its sinks and metrics server with it),
        close the socket and remove the sockets' folder (the collector's own removal misses it when it
        had to be killed).

        SIGTERM, as when the API process dies (``collector._die_with_parent``): requests still inside
        their grace window are not exported."""
        with self._lock:
            if self._sock is not None:
                self._sock.close(0)
                self._sock = None
        if self._occupancy_timer is not None:
            self._occupancy_timer.cancel()
        if self.windows is not None:
            self.windows.stop()
        if self.process is not None and self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(timeout_s)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait(timeout_s)
        if self.folder is not None:
            ipc.remove(self.folder)

    # -- admin (executor threads) ----------------------------------------------------------------
    def request(self, msg: tuple[Any, ...], timeout_s: float = ADMIN_TIMEOUT_S) -> Any:
        return admin_request(self.admin_address, msg, timeout_s)

    async def _request(self, msg: tuple[Any, ...], timeout_s: float = ADMIN_TIMEOUT_S) -> Any:
        return await asyncio.get_running_loop().run_in_executor(None, self.request, msg, timeout_s)

    async def state(self) -> dict[str, Any]:
        st = await self._request(("state",))
        st["api"].update(
            {"pid": self._pid, "live_requests": len(LIVE), "switch": switch.snapshot(), "windows": self.windows_state()}
        )
        for kind in ("errors", "dropped"):
            merged = dict(st["api"][kind])
            for key, value in getattr(telemetry, kind).items():
                merged[key] = max(merged.get(key, 0), value)  # the collector may not have the latest yet
            st["api"][kind] = merged
        return st

    async def flip(self, setting: switch.Setting) -> tuple[bool, dict[str, Any]]:
        """``POST /mmtrace/enabled {"on": ...}``: the user's setting, which also stops the tracing windows
        (``flip_now`` on an executor thread, so the event loop does not wait for the confirmations)."""
        return await asyncio.get_running_loop().run_in_executor(None, self.flip_now, setting)

    def flip_now(
        self, setting: switch.Setting, window: Schedule | None = None, driver: Driver | None = None
    ) -> tuple[bool, dict[str, Any]] | None:
        """Apply a setting here and in the collector; the collector publishes it and waits until every
        other process confirmed. Returns ``(all confirmed, the answer of POST /mmtrace/enabled)``.

        ``driver``: the flip is a window edge of that driver's ``window`` schedule (opening when
        ``setting.on``: the collector puts the schedule on the records served in it); it is skipped
        (None) when that driver no longer drives the switch. Without one it is the user's: the windows
        stop."""
        with self._flip_lock:
            if driver is not None and (driver is not self.windows or not driver.running):
                return None
            if driver is None and self.windows is not None:
                self.windows.stop()
            gen = switch.generation + 1
            switch.apply(setting, gen)
            field = {**window.field, "open": setting.on} if window is not None else None
            confirmed, processes, missing = self.request(("flip", gen, setting.on, setting.parts, field), FLIP_WAIT_S)
        processes = {f"api:{self._pid}": switch.snapshot(), **processes}
        answer = {**switch.snapshot(), "processes": processes, **({"missing": missing} if missing else {})}
        return confirmed, answer

    def start_windows(
        self, schedule: Schedule, parts: tuple[str, ...] = switch.PARTS, wait: bool = True
    ) -> dict[str, Any]:
        """Drive the switch by ``schedule`` from now on (replacing earlier windows): ``parts`` on in each
        window, everything off between. ``wait``: the current window's state is applied before this
        returns (else on the driver's thread: the plugin's start-up does not wait for the collector)."""

        def flip(open_: bool) -> bool:
            return self.flip_now(switch.Setting(open_, parts), schedule, driver) is not None

        with self._flip_lock:
            if self.windows is not None:
                self.windows.stop()
            driver = Driver(schedule, flip, telemetry.contained)
            self.windows = driver
            driver.start(wait)
        return self.windows_state()

    async def set_windows(self, schedule: Schedule, parts: tuple[str, ...]) -> dict[str, Any]:
        """``POST /mmtrace/enabled {"windows": ...}`` (on an executor thread, as ``flip``)."""
        return await asyncio.get_running_loop().run_in_executor(None, self.start_windows, schedule, parts)

    def windows_state(self) -> dict[str, Any] | None:
        return self.windows.state() if self.windows is not None else None

    def start_metrics(self, enable_metrics: bool, port: int, tokenizer_manager: Any = None) -> None:
        """Called once SGLang's server args are known (TokenizerManager built): pick where metrics go.

        ``enable_metrics`` (SGLang's ``--enable-metrics``, unless ``SGLANG_MMTRACE_EXEMPLARS`` asks for the
        plugin's own port): SGLang has set ``PROMETHEUS_MULTIPROC_DIR`` by now and our metrics join its
        ``/metrics``. Otherwise the collector serves its own registry on ``port``. The occupancy
        of ``tokenizer_manager``'s caches is then sampled on a timer of the serving loop."""
        if self.metrics_started:
            return
        self.metrics_started = True
        self._tokenizer_manager = tokenizer_manager
        multiproc = os.environ.get("PROMETHEUS_MULTIPROC_DIR") if enable_metrics else None
        why = self.request(("metrics", multiproc or None, None if multiproc else port))
        if why:
            telemetry.warn("metrics disabled: %s", why)


def admin_request(address: str, msg: tuple[Any, ...], timeout_s: float = ADMIN_TIMEOUT_S) -> Any:
    """One request/reply with the collector's admin socket; raises TimeoutError when it does not answer."""
    import zmq

    sock = zmq.Context.instance().socket(zmq.REQ)
    sock.setsockopt(zmq.LINGER, 0)
    try:
        sock.connect(address)
        sock.send(pickle.dumps(msg))
        if not sock.poll(int(timeout_s * 1000)):
            raise TimeoutError(f"the collector process did not answer {msg[0]!r} in {timeout_s:.0f} s")
        return pickle.loads(sock.recv())
    finally:
        sock.close()
