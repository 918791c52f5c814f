"""The collector process: one record per request, joined from the API, scheduler and detokenizer.

It runs beside SGLang, not inside it (``python -m sglang_mmtrace.join.collector``, started by the plugin
in the API process): joining, building records and exporting them (JSONL, Prometheus, OTLP) take
no GIL time from SGLang's event loop or scheduler loop. The API process sends each finished
request's ``ApiTrace`` (pickled, once the response is complete); the schedulers' and detokenizer's
outboxes send their stage events, keyed by rid, and heartbeats. An admin socket serves the API
process's ``/mmtrace/state`` and ``/mmtrace/enabled`` and starts the metrics once SGLang's server
arguments are known. The collector publishes switch flips to the other processes and waits for their
confirmations. It exits when the API process is gone, and takes its sockets' folder with it
(``ipc.py``).
"""

from __future__ import annotations

import argparse
import logging
import os
import pickle
import sys
import threading
import time
from typing import Any, Protocol

from .. import occupancy, switch, telemetry
from ..config import Config
from ..stages import (
    API,
    DETOKENIZE,
    DETOKENIZE_INBOX_WAIT,
    DETOKENIZER,
    DISPATCH,
    HTTP_PARSE,
    MODEL_AUDIO_ENCODER,
    MODEL_EMBED,
    MODEL_VISION_ENCODER,
    OPENAI_CONVERT,
    RESPONSE_FIRST_CHUNK,
    RESPONSE_INBOX_WAIT,
    ROOT,
    SCHEDULER,
    SCHEDULER_ENCODER_WAIT,
    SCHEDULER_INBOX_WAIT,
    SCHEDULER_OUTPUT,
    SCHEDULER_PREFIX_MATCH,
    SCHEDULER_RECV,
    TRANSPORT_PREPARE,
    unobserved,
)
from ..windows import Schedule
from . import ipc
from .context import ApiTrace, HttpCtx, from_wire
from .outcomes import Embedding, Evidence, Placement, decide
from .record import EmitContext, HttpFacts, StageEvent, coverage, merge_chunks, stage_dicts

logger = logging.getLogger("sglang_mmtrace")

POLL_MS = 50
"""While a finished request waits for its other processes' stages, or a flip for its confirmations:
how often the collector looks at the clock (their deadlines and the peers' silence are timed)."""
IDLE_POLL_MS = 1000
"""Otherwise: every record is completed by a message (the API's hand-over or the last remote stage),
which wakes the collector at once, so it sleeps until the next message or the health interval. A
collector waking 20 times a second for nothing takes a core from SGLang on a small machine."""
HEALTH_INTERVAL_S = 1.0
ORPHAN_TTL_S = 60.0
"""Events of a rid whose last remote stage (``scheduler.output``) has arrived but whose API side has
not: kept this long, then dropped and counted. The clock starts at that last stage, not at the
first event: a request's first events ride a heartbeat while its forward may still run for minutes
(a cold first request waits for JIT compilation on a GPU), and the API hands a request over at its
last body byte, right after its last remote stage."""
ORPHAN_MAX = 100_000
"""Rids with pending events, finished or not: beyond this the oldest are dropped (a memory bound)."""
DONE_MEMORY = 4096
LAST_REMOTE_STAGES = (SCHEDULER_OUTPUT, DETOKENIZE)
MAX_WAIT_S = 60.0
"""A finished request's record waits for its last remote stages, or until the collector has read
every live peer's messages sent after the request ended, and never longer than this."""
SETTINGS_MEMORY = 64
"""Switch settings remembered by generation (a request is exported under the one it ran in)."""
FLIP_TIMEOUT_S = 5.0
FLIP_RESEND_S = 0.2


class Sink(Protocol):
    PART: str  # the switch part that gates it

    def emit(self, record: dict[str, Any], ctx: EmitContext) -> None: ...


class Collector:
    """Binds ``address`` (events in), ``control_address`` (flips out) and ``admin_address`` (requests in):
    ``addresses``, or a new socket folder's (``ipc.new_folder``)."""

    def __init__(
        self, cfg: Config, sinks: list[Sink], sglang_version: str, addresses: tuple[str, str, str] | None = None
    ) -> None:
        self.cfg = cfg
        self.sinks = sinks
        self.sglang_version = sglang_version
        self.address, self.control_address, self.admin_address = addresses or ipc.addresses(ipc.new_folder())
        self._waiting: list[tuple[float, ApiTrace, int]] = []  # (deadline, trace, pid of its API process)
        self._remote: dict[str, list[StageEvent]] = {}
        self._remote_seen: dict[str, float] = {}
        self._done: dict[str, None] = {}
        self._peers: dict[str, dict[str, Any]] = {}
        self._watermarks: dict[str, tuple[float, float]] = {}  # peer -> (latest send time, when read here)
        self._api: dict[str, Any] = {}  # the API process's last health report
        self._worker_occupancy: dict[int, Any] = {}  # tokenizer worker pid -> its last occupancy sample
        self.api_pid: int | None = None
        self._records = 0
        self._discarded = 0  # requests that crossed a switch flip: no record
        self.last_flip = float("-inf")  # perf_counter time of the last flip
        self._settings: dict[int, switch.Setting] = {0: switch.Setting(True, switch.PARTS)}  # generation -> setting
        self._flip: tuple[Any, int, float, float, switch.Setting] | None = (
            None  # (client, gen, deadline, sent, setting)
        )
        self._windows: dict[int, dict[str, float] | None] = {}  # generation -> its window (Schedule.field)
        self.window: tuple[str, bool] | None = None
        """``(schedule, open)`` while tracing windows drive the switch (the Prometheus gauge), else None."""
        self._resent = 0.0  # when the latest setting was last published again for a late peer
        self._unix_offset = time.time() - time.perf_counter()
        self._last_health = 0.0
        self.metrics_started = False
        self.occupancy: dict[str, dict[str, int]] = {}  # every process's occupancy, summed (occupancy.totals)
        self._thread: threading.Thread | None = None
        self._ready = threading.Event()
        self.parent_pid: int | None = None

    def start(self) -> None:
        """Run the loop on a daemon thread (unit tests and benchmarks; the plugin runs ``main``)."""
        self._thread = threading.Thread(target=self.run, name="mmtrace-collector", daemon=True)
        self._thread.start()
        self._ready.wait(5.0)

    def add_sink(self, sink: Sink) -> None:
        self.sinks = [*self.sinks, sink]

    # -- the loop ------------------------------------------------------------------------------
    def run(self) -> None:
        import zmq

        ctx = zmq.Context.instance()
        sock = ctx.socket(zmq.PULL)
        sock.setsockopt(zmq.RCVHWM, 100000)
        sock.bind(self.address)
        self._pub = ctx.socket(zmq.PUB)
        self._pub.setsockopt(zmq.LINGER, 0)
        self._pub.bind(self.control_address)
        admin = ctx.socket(zmq.ROUTER)
        admin.setsockopt(zmq.LINGER, 0)
        admin.bind(self.admin_address)
        self._admin = admin
        self._ready.set()
        poller = zmq.Poller()
        poller.register(sock, zmq.POLLIN)
        poller.register(admin, zmq.POLLIN)
        while True:
            try:
                idle = not self._waiting and self._flip is None
                ready = dict(poller.poll(IDLE_POLL_MS if idle else POLL_MS))
                if sock in ready:
                    while True:
                        try:
                            raw = sock.recv(zmq.NOBLOCK)
                        except zmq.Again:
                            break
                        self._on_message(pickle.loads(raw))
                if admin in ready:
                    while True:
                        try:
                            client, _, raw = admin.recv_multipart(zmq.NOBLOCK)
                        except zmq.Again:
                            break
                        self._on_admin(client, pickle.loads(raw))
                t = time.perf_counter()
                self._check_flip()
                self._flush_ready(t)
                if t - self._last_health >= HEALTH_INTERVAL_S:
                    self._last_health = t
                    self._sync_health()
                    if self.parent_pid is not None and os.getppid() != self.parent_pid:
                        return  # the API process is gone
            except Exception as exc:  # the collector must outlive any bad message
                telemetry.contained("collector", exc)

    def _reply(self, client: bytes, payload: Any) -> None:
        self._admin.send_multipart([client, b"", pickle.dumps(payload)])

    def _on_admin(self, client: bytes, msg: tuple[Any, ...]) -> None:
        kind = msg[0]
        if kind == "state":
            self._reply(client, self.state())
        elif kind == "flip":
            _, gen, on, parts, window = msg
            setting = switch.Setting(on, tuple(parts))
            switch.apply(setting, gen)
            self._settings[gen] = setting
            # a window's records carry its schedule (``Schedule.field``); a user's flip has no window
            self._windows[gen] = {k: window[k] for k in ("window_s", "period_s")} if window and window["open"] else None
            while len(self._settings) > SETTINGS_MEMORY:
                oldest = min(self._settings)
                del self._settings[oldest]
                self._windows.pop(oldest, None)
            self.window = None
            if window is not None:
                self.window = (Schedule(window["window_s"], window["period_s"]).spec, bool(window["open"]))
            self._sync_window()
            self.last_flip = time.perf_counter()
            if self._flip is not None:  # superseded: its requester gets an answer now, unconfirmed
                self._answer_flip(self._flip[0], self._flip[1])
            self._flip = (client, gen, time.monotonic() + FLIP_TIMEOUT_S, 0.0, setting)
            self._check_flip()
        elif kind == "metrics":
            self._reply(client, self.start_metrics(*msg[1:]))
        else:
            self._reply(client, {"error": f"unknown admin request {kind!r}"})

    def _check_flip(self) -> None:
        """Publish the pending flip (again every ``FLIP_RESEND_S``: a late subscriber misses the first)
        and answer its requester once every peer confirmed it, or at the deadline."""
        if self._flip is None:
            self._catch_up_peers()
            return
        client, gen, deadline, sent, setting = self._flip
        t = time.monotonic()
        if self._unconfirmed(gen) and t < deadline:
            if t - sent >= FLIP_RESEND_S:
                self._pub.send(pickle.dumps((gen, setting.on, setting.parts)))
                self._flip = (client, gen, deadline, t, setting)
            return
        self._flip = None
        self._answer_flip(client, gen)

    def _sync_window(self) -> None:
        for sink in self.sinks:
            sync = getattr(sink, "sync_window", None)
            if sync is not None:
                try:
                    sync(self.window)
                except Exception as exc:
                    telemetry.contained(f"sink.{type(sink).__name__}", exc)

    def _catch_up_peers(self) -> None:
        """Publish the latest setting again, at most every ``FLIP_RESEND_S``, while a peer's heartbeat
        shows an older one: a process that started after the last flip (SGLang spawns its schedulers
        after the API process's tracing windows made their first) starts with every part on."""
        gen = switch.generation
        t = time.monotonic()
        if gen and t - self._resent >= FLIP_RESEND_S and self._unconfirmed(gen):
            self._resent = t
            setting = self._settings.get(gen) or switch.current()
            self._pub.send(pickle.dumps((gen, setting.on, setting.parts)))

    def _unconfirmed(self, gen: int) -> list[str]:
        return [key for key, hb in self._peers.items() if (hb.get("switch") or {}).get("generation") != gen]

    def _answer_flip(self, client: bytes, gen: int) -> None:
        """``(all confirmed, per-process setting, the processes that did not confirm)``."""
        missing = self._unconfirmed(gen)
        processes = {f"collector:{os.getpid()}": switch.snapshot()}
        processes.update({key: hb.get("switch") for key, hb in self._peers.items()})
        self._reply(client, (not missing, processes, missing))

    def start_metrics(self, multiproc_dir: str | None, port: int | None) -> str | None:
        """Start the Prometheus sink: in SGLang's multiprocess directory (its ``/metrics`` serves it) or
        on our own port. Returns why not, or None."""
        if self.metrics_started:
            return None
        self.metrics_started = True
        if multiproc_dir:
            os.environ["PROMETHEUS_MULTIPROC_DIR"] = multiproc_dir  # before prometheus_client is imported
        else:  # our own registry (exemplars need it), even where the user's environment names a directory
            os.environ.pop("PROMETHEUS_MULTIPROC_DIR", None)
        try:
            from ..sinks.prometheus import PrometheusSink

            self.add_sink(PrometheusSink(port=None if multiproc_dir else port))
        except Exception as exc:
            return repr(exc)
        self._sync_window()  # the windows may have started before SGLang's server arguments were known
        return None

    def _on_message(self, msg: tuple[Any, ...]) -> None:
        kind, process, pid, body = msg[:4]
        if kind in ("hb", "ev") and len(msg) > 4:
            peer = f"{process}:{pid}"
            self._watermarks[peer] = (max(msg[4], self._watermarks.get(peer, (msg[4], 0.0))[0]), time.perf_counter())
        if kind == "hb":
            self._peers[f"{process}:{pid}"] = body
            return
        if kind == "api":
            traces, health = body
            if f"api:{pid}" in self._peers:  # a tokenizer worker (launcher): its outbox's heartbeats carry its counters
                if health is not None and health.get("occupancy"):
                    self._worker_occupancy[pid] = health["occupancy"]
            else:
                self.api_pid = pid
                if health is not None:
                    self._api.update(health)
            self._on_traces([from_wire(w) for w in traces], pid)
            return
        t = time.perf_counter()
        for rids, name, t0, t1, clock, attrs in body:
            for rid in rids if isinstance(rids, tuple) else (rids,):
                if rid in self._done:
                    continue
                self._remote.setdefault(rid, []).append(StageEvent(name, process, t0, t1, clock, attrs, pid))
                if name in LAST_REMOTE_STAGES:
                    self._remote_seen.setdefault(rid, t)  # the orphan clock starts here

    def _on_traces(self, traces: list[ApiTrace], pid: int | None = None) -> None:
        traces, prompts = fold_parallel_sampling(traces)
        for prompt in prompts:
            self._forget(prompt.rid)
        for trace in traces:
            if trace.discard or "records" not in self._setting_of(trace).enabled:
                self._forget(trace.rid)
                self._discarded += trace.discard
                continue
            # ended: waits until complete or caught up (``_caught_up``), this long at most
            wait = (MAX_WAIT_S if _ended(trace) is not None else self.cfg.grace_s) if trace.dispatched else 0.0
            self._waiting.append((time.perf_counter() + wait, trace, pid or self.api_pid or os.getpid()))

    def _flush_ready(self, t: float) -> None:
        keep = []
        for deadline, trace, pid in self._waiting:
            remote = self._remote.get(trace.rid, ())
            complete = not trace.dispatched or all(any(e.name == n for e in remote) for n in self._last_stages())
            if complete or self._caught_up(_ended(trace), t) or t >= deadline:
                self._emit(trace, pid)
            else:
                keep.append((deadline, trace, pid))
        self._waiting = keep
        if len(self._remote) > ORPHAN_MAX or (
            self._remote_seen and t - next(iter(self._remote_seen.values())) > ORPHAN_TTL_S
        ):
            self._drop_orphans(t)

    def _caught_up(self, t_end: float | None, t: float) -> bool:
        """Every peer's messages sent after the request ended (``t_end``) have been read here, so no
        event of it can still be on its way (each peer sends what it queued before a message's send
        time in that message). A peer silent for the grace period is not waited for (gone, or idle
        with the switch off). Under load the collector may read its socket seconds late: then a
        record waits for it to catch up rather than going out without its other processes' stages."""
        if t_end is None or not self._watermarks:
            return False
        silent_after = self.cfg.grace_s
        return all(wm >= t_end or t - seen > silent_after for wm, seen in self._watermarks.values())

    def _drop_orphans(self, t: float) -> None:
        """Events whose request the API process never finished: finished remotely more than
        ``ORPHAN_TTL_S`` ago (oldest first; insertion order), then any beyond ``ORPHAN_MAX``."""
        for rid, seen in list(self._remote_seen.items()):
            if t - seen <= ORPHAN_TTL_S:
                break
            self._drop_orphan(rid, seen)
        while len(self._remote) > ORPHAN_MAX:
            rid = next(iter(self._remote))
            self._drop_orphan(rid, self._remote_seen.get(rid, t))

    def _drop_orphan(self, rid: str, seen: float) -> None:
        self._remote_seen.pop(rid, None)
        if self._remote.pop(rid, None) is not None:
            if abs(seen - self.last_flip) < ORPHAN_TTL_S:
                self._discarded += 1  # its API side arrived while the switch was off
            else:
                telemetry.drop("orphan_events")

    def _setting_of(self, trace: ApiTrace) -> switch.Setting:
        """The switch setting the request was served under (its generation's), not the one now: a
        request that ended just before a flip is still exported as it was when it ran."""
        gen = trace.http.gen if trace.http is not None else switch.generation
        return self._settings.get(gen) or switch.current()

    def _last_stages(self) -> tuple[str, ...]:
        """The last stages a request waits for: ``detokenize`` only once a detokenizer has reported."""
        if any(key.startswith("detokenizer:") for key in self._peers):
            return LAST_REMOTE_STAGES
        return LAST_REMOTE_STAGES[:1]

    def _forget(self, rid: str) -> list[StageEvent]:
        """The rid is done: its remote events are returned once, and later ones are ignored."""
        remote = self._remote.pop(rid, [])
        self._remote_seen.pop(rid, None)
        self._done[rid] = None
        while len(self._done) > DONE_MEMORY:
            del self._done[next(iter(self._done))]
        return remote

    def _emit(self, trace: ApiTrace, api_pid: int) -> None:
        remote = self._forget(trace.rid)
        if trace.http is not None and trace.http.internal:
            return
        try:
            record = build_record(trace, remote, self.sglang_version, self._unix_offset)
        except Exception as exc:
            telemetry.contained("record", exc)
            return
        if self.occupancy:
            record["occupancy"] = self.occupancy  # as last sampled (``_sync_health``): report's occupancy rows
        window = self._windows.get(trace.http.gen if trace.http is not None else switch.generation)
        if window is not None:
            record["window"] = window  # served in a tracing window: a sample of the traffic
        self._records += 1
        carrier = trace.sglang_trace_headers or (trace.http.trace_headers if trace.http is not None else None)
        ctx = EmitContext(carrier or {}, self._pids(remote, api_pid), http_facts(trace.http))
        parts = self._setting_of(trace).enabled
        for sink in self.sinks:
            if sink.PART not in parts:
                continue
            try:
                sink.emit(record, ctx)
            except Exception as exc:
                telemetry.contained(f"sink.{type(sink).__name__}", exc)

    def _pids(self, remote: list[StageEvent], api_pid: int) -> dict[str, int]:
        """Process kind -> pid for this request: the process that sent its events (with ``--dp-size``
        > 1 each request has its own scheduler, with ``--tokenizer-worker-num`` > 1 its own API
        process), else the first peer of that kind."""
        pids = {"api": api_pid}
        for e in remote:
            if e.pid is not None:
                pids.setdefault(e.process, e.pid)
        for key in self._peers:
            process, _, pid = key.partition(":")
            pids.setdefault(process, int(pid))
        return pids

    def _health_sources(self) -> dict[str, dict[str, Any]]:
        """Every process's counters: this one's, the API process's (as reported) and the peers'."""
        own = {"errors": dict(telemetry.errors), "dropped": dict(telemetry.dropped)}
        return {"collector": own, "api": self._api, **self._peers}

    def _sync_health(self) -> None:
        from ..sinks.prometheus import health_totals

        samples = self._occupancy() if self.metrics_started else {}  # the processes sample only for the metrics
        self.occupancy = occupancy.totals(samples.values())
        totals = None
        for sink in self.sinks:
            sync = getattr(sink, "sync_health", None)
            if sync is not None and switch.on(sink.PART):
                if totals is None:
                    sources = self._health_sources()
                    totals = health_totals(sources.pop("collector"), sources)
                try:
                    sync(totals)
                    sink.sync_occupancy(samples)
                except Exception as exc:
                    telemetry.contained(f"sink.{type(sink).__name__}", exc)

    def _occupancy(self) -> dict[occupancy.Where, occupancy.Sample]:
        """Where (``occupancy.LABELS``' values) -> the latest occupancy sample there (``occupancy``): the
        schedulers' heartbeats, the API process's timer and its tokenizer workers', and the
        shared-memory segments the API process created (read here). Processes that share labels are summed."""

        groups: dict[occupancy.Where, list[occupancy.Sample]] = {}
        for key, hb in self._peers.items():
            if hb.get("occupancy"):
                ranks = hb.get("ranks") or {}
                where = (key.partition(":")[0], ranks.get("dp_rank", ""), ranks.get("tp_rank", ""))
                groups.setdefault(where, []).append(hb["occupancy"])
        api = list(self._worker_occupancy.values())
        api_pid = self.api_pid or self.parent_pid
        if api_pid is not None:
            api.append({**(self._api.get("occupancy") or {}), **occupancy.shm_sample(api_pid)})
        if api:
            groups[(API, "", "")] = api
        return {where: occupancy.totals(samples) for where, samples in groups.items()}

    # -- introspection (tests, doctor) ---------------------------------------------------------
    def state(self) -> dict[str, Any]:
        """The collector's side of ``/mmtrace/state`` (the API process adds its own live requests)."""
        from ..sinks.prometheus import health_totals

        sources = self._health_sources()
        own = sources.pop("collector")
        api_and_own = health_totals(own, {"api": self._api})
        return {
            "api": {
                "finishing": len(self._waiting),
                "remote_pending": len(self._remote),
                "records": self._records,
                "switch_discarded": self._discarded,
                "errors": api_and_own["errors"],
                "dropped": api_and_own["dropped"],
            },
            "collector": {"pid": os.getpid(), "switch": switch.snapshot()},
            "peers": dict(self._peers),
        }


def fold_parallel_sampling(traces: list[ApiTrace]) -> tuple[list[ApiTrace], list[ApiTrace]]:
    """SGLang's parallel sampling (``n > 1``) as one exchange's traces show it: ``(requests, prompts)``.

    The TokenizerManager tokenizes each prompt under a rid of its own but never sends that request.
    It sends a prefix request (``max_new_tokens=0``, a new rid) per prompt and waits for it, then the
    ``n`` samples of each prompt (new rids); the traces were made in that order. Each prefix request
    and sample takes its prompt's API stages (tokenization, the multimodal processor) and facts
    (images, preprocessing cache, creation time), so its record has them. The prefix request is
    marked ``warmup``: its record shows the prompt's first pass (the vision encoder runs there), and
    metrics and ``report`` leave it out. Its time is unattributed in the samples' records, which
    waited for it. The prompts make no record. Any other exchange comes back as it was: a prompt is a
    trace never dispatched, though tokenized without an error, beside traces that were dispatched.
    """
    if len(traces) < 2:
        return traces, []
    unsent = [t for t in traces if not t.dispatched and t.error_class is None and t.tm_error is None]
    prompts = [t for t in unsent if t.events]
    sent = [t for t in traces if t.dispatched]
    if not prompts or not sent:
        return traces, []
    n = max(1, (len(sent) - len(prompts)) // len(prompts))  # samples per prompt
    for i, trace in enumerate(sent):
        k = i if i < len(prompts) else (i - len(prompts)) // n
        prompt = prompts[min(k, len(prompts) - 1)]
        trace.events = prompt.events + trace.events
        trace.t_created = prompt.t_created
        trace.images = trace.images or prompt.images
        trace.preprocess = trace.preprocess or prompt.preprocess
        if trace.content is None:
            trace.content = prompt.content
        if i < len(prompts):
            trace.warmup = True
    dropped = {id(t) for t in unsent}
    return [t for t in traces if id(t) not in dropped], unsent


def _status(trace: ApiTrace) -> tuple[str, str | None]:
    http = trace.http
    if http is not None:
        if http.disconnected and http.t_last_body is None:
            return "aborted", "client disconnected"
        if http.error:
            return "error", http.error
        if http.status_code is not None and http.status_code >= 400:
            return "error", f"HTTP {http.status_code}" + (f" {trace.error_class}" if trace.error_class else "")
    if trace.tm_error:
        return ("aborted" if trace.tm_error == "aborted" else "error"), trace.tm_error
    if isinstance(trace.finish_reason, dict) and trace.finish_reason.get("type") == "abort":
        return "aborted", "aborted"
    return "ok", None


def build_record(trace: ApiTrace, remote: list[StageEvent], sglang_version: str, unix_offset: float) -> dict[str, Any]:
    """Join one request's events into the contract's record."""
    http = trace.http
    arrival = http.t_arrival if http is not None else trace.t_created
    events: list[StageEvent] = []
    if http is not None:
        if http.t_handle is not None and trace.t_created >= http.t_handle:
            # SGLang's OpenAI handlers note their start before the conversion, and the trace is made
            # when the TokenizerManager holds the converted request: the conversion lies between, with
            # the hops onto the executor and back (0.5.22+). The native endpoints note no start.
            events.append(StageEvent(OPENAI_CONVERT, API, http.t_handle, trace.t_created))
        events.append(StageEvent(HTTP_PARSE, API, arrival, http.t_handle or trace.t_created))
    events.extend(trace.events)
    joined = _join_stages(trace, remote)  # completes the remote events it joins (clamps, attrs)
    events.extend(remote)
    events.extend(joined)
    status, error = _status(trace)
    t_first = http.t_first_body if http is not None else trace.t_first_output
    if t_first is not None and trace.t_first_output is not None and trace.t_first_output > t_first:
        # A later request of its exchange (a batch, or a sample of n > 1): the exchange's first bytes
        # were another request's. Its own first chunk's write is not timed: its TTFT ends when the
        # API process had its first output.
        t_first = trace.t_first_output
    ttft = None
    if trace.t_first_output is not None and t_first is not None and status != "error":
        ttft = t_first - arrival
        if http is not None and t_first > trace.t_first_output:
            events.append(StageEvent(RESPONSE_FIRST_CHUNK, API, trace.t_first_output, t_first))
        events.append(StageEvent(ROOT, API, arrival, t_first))
    t_end = (http.t_last_body if http is not None else None) or trace.t_finished
    stages = stage_dicts(merge_chunks(events), arrival)
    attributed, cov = coverage(stages, ttft)

    prefix = next((e.attrs for e in remote if e.name == SCHEDULER_PREFIX_MATCH), None)
    prompt_tokens = prefix.get("prompt_tokens") if prefix else trace.meta_prompt_tokens
    cached_tokens = prefix.get("cached_tokens") if prefix else trace.meta_cached_tokens
    cache = decide(evidence(trace, remote, prefix))
    return {
        "rid": trace.rid,
        "trace_id": _trace_id(http),
        "model": trace.model,
        "sglang_version": sglang_version,
        "status": status,
        "error": error,
        "arrival_unix_s": round(arrival + unix_offset, 6),
        "ttft_s": round(ttft, 9) if ttft is not None else None,
        "e2e_s": round(t_end - arrival, 9) if t_end is not None else None,
        "prompt_tokens": int(prompt_tokens or 0),
        "cached_tokens": int(cached_tokens or 0),
        "output_tokens": int(trace.output_tokens or 0),
        "images": trace.images,
        "cache": cache.as_record(),
        "transport": {"mode": trace.transport_mode or "none", "bytes": int(trace.transport_bytes)},
        "stages": stages,
        "attributed_s": round(attributed, 9),
        "coverage": round(cov, 6),
        "unobserved": unobserved(
            {s["name"] for s in stages},
            trace.media,
            cache.preprocess,
            {m: o["embedding"] for m, o in cache.modalities.items()},
        )
        if status == "ok" and ttft is not None
        else [],
        "failures": list(trace.failures),
        **({"warmup": True} if trace.warmup else {}),
        **({"content": trace.content} if trace.content is not None else {}),
    }


def evidence(trace: ApiTrace, remote: list[StageEvent], prefix: dict[str, Any] | None) -> Evidence:
    """What the request's events prove about its caches (``join.outcomes``), gathered from the
    scheduler's admission (``placement``), its forwards' ``model.embed`` (``items``) and encoder runs."""
    placed = prefix.get("placement") if prefix else None
    placement = {m: Placement(*c) for m, c in placed.items()} if isinstance(placed, dict) else None
    embedding: dict[str, Embedding] = {}
    for e in remote:
        if e.name == MODEL_EMBED:
            for m, (needed, hit, miss) in (e.attrs.get("items") or {}).items():
                got = embedding.setdefault(m, Embedding())
                got.needed += needed
                got.hit += hit
                got.miss += miss
        elif e.name in (MODEL_VISION_ENCODER, MODEL_AUDIO_ENCODER) and not e.attrs.get("skipped"):
            embedding.setdefault(str(e.attrs.get("modality") or "image"), Embedding()).encoded = True
    return Evidence(dict(trace.media), placement, embedding, tuple(trace.preprocess))


def _ended(trace: ApiTrace) -> float | None:
    """When the API process was done with the request (its last body byte), on the shared clock."""
    http = trace.http
    return http.t_last_body if http is not None and http.t_last_body is not None else trace.t_finished


def _first(events: list[StageEvent], name: str) -> StageEvent | None:
    return next((e for e in events if e.name == name), None)


JOINED_STAGES = (SCHEDULER_INBOX_WAIT, SCHEDULER_ENCODER_WAIT, DETOKENIZE_INBOX_WAIT, RESPONSE_INBOX_WAIT)
"""The stages ``_join_stages`` builds (no hook measures them; the README's stage table says so)."""


SCHEDULER_RECEIVED_EMBEDDINGS = ("zmq_to_scheduler", "mooncake")
"""Encoder transfer backends whose language scheduler receives the embeddings (``zmq_to_tokenizer``'s
API process waits for them inside ``tokenize`` instead)."""


def _join_stages(trace: ApiTrace, remote: list[StageEvent]) -> list[StageEvent]:
    """Stages that only the join can see: the hops between processes, one end measured on each side.

    Also completes the scheduler's receive: it carries the hand-off's ``mode`` and ``bytes`` (what the
    API process prepared is what the scheduler received; known on the API side), and it starts no
    earlier than the request was sent (the ``recv_requests`` call that returned it may have started
    polling before). Remote events get new ``attrs`` dicts, never edited ones: a batch event's attrs
    are shared by all its requests.
    """
    api, t_first_output = trace.events, trace.t_first_output
    out = []
    dispatch, recv = _first(api, DISPATCH), _first(remote, SCHEDULER_RECV)
    if recv is not None and trace.transport_bytes and trace.transport_mode:
        recv.attrs = {**recv.attrs, "mode": trace.transport_mode, "bytes": int(trace.transport_bytes)}
    if dispatch is not None and recv is not None:
        prepared = _first(api, TRANSPORT_PREPARE)
        sent_after = max(dispatch.t0, prepared.t1 if prepared is not None else dispatch.t0)
        if recv.t0 < sent_after <= recv.t1:
            recv.attrs = {**recv.attrs, "poll_started_s": round(sent_after - recv.t0, 9)}
            recv.t0 = sent_after
        if recv.t0 > dispatch.t1:
            # a language-only server's scheduler holds the request until the encoder server's
            # embeddings arrive: that wait is remote work, never the local inbox's
            waited = trace.remote_encoder in SCHEDULER_RECEIVED_EMBEDDINGS
            out.append(
                StageEvent(SCHEDULER_ENCODER_WAIT if waited else SCHEDULER_INBOX_WAIT, SCHEDULER, dispatch.t1, recv.t0)
            )
    output, detok = _first(remote, SCHEDULER_OUTPUT), _first(remote, DETOKENIZE)
    received = detok.t0 if detok is not None else t_first_output
    if output is not None and received is not None and output.t0 <= received < output.t1:
        # The hand-off was sent before the next process received it: stream_output may still be
        # returning (bookkeeping after its send) while the detokenizer already works.
        output.attrs = {**output.attrs, "after_send_s": round(output.t1 - received, 9)}
        output.t1 = received
    if output is not None and detok is not None and detok.t0 > output.t1:
        out.append(StageEvent(DETOKENIZE_INBOX_WAIT, DETOKENIZER, output.t1, detok.t0))
    if detok is not None and t_first_output is not None and t_first_output > detok.t1:
        out.append(StageEvent(RESPONSE_INBOX_WAIT, API, detok.t1, t_first_output))
    return out


def http_facts(http: HttpCtx | None) -> HttpFacts | None:
    """What the spans may say about the exchange. Streamed: its first body bytes went out before its
    last (the middleware times a one-message body's first bytes as its last)."""
    if http is None:
        return None
    first, last = http.t_first_body, http.t_last_body
    streamed = first is not None and last is not None and first < last
    return HttpFacts(http.method, http.scheme, http.path, http.route, http.status_code, streamed)


def _trace_id(http: HttpCtx | None) -> str | None:
    """The incoming trace's id where the caller's context is valid and sampled (its trace exists);
    None otherwise. The OTLP sink, where it runs, replaces it with the id of the trace it exported."""
    headers = http.trace_headers if http is not None else None
    if not headers:
        return None
    from opentelemetry import propagate
    from opentelemetry import trace as trace_api

    span_context = trace_api.get_current_span(propagate.extract(headers)).get_span_context()
    return format(span_context.trace_id, "032x") if span_context.is_valid and span_context.trace_flags.sampled else None


def _sinks(cfg: Config) -> list[Sink]:
    sinks: list[Sink] = []
    if cfg.otlp_endpoint:
        try:
            from ..sinks.otlp import OtlpSink, settings

            otlp = settings(cfg)
            if otlp.exports:  # not with OTEL_SDK_DISABLED=true
                sinks.append(OtlpSink(otlp))
                if cfg.otlp_metrics:
                    from ..sinks.genai import GenAiOtlpMetrics

                    metrics = GenAiOtlpMetrics(
                        cfg.otlp_endpoint, cfg.otlp_protocol, otlp.service_name, insecure=otlp.insecure
                    )
                    sinks.append(metrics)
        except Exception as exc:  # a broken install of the opentelemetry packages (they are dependencies)
            telemetry.warn("OTLP export disabled: %r", exc)
    if cfg.jsonl_path:
        from ..sinks.jsonl import JsonlSink

        try:
            sinks.append(JsonlSink(cfg.jsonl_path))
        except OSError as exc:  # e.g. a read-only folder: serve and measure without the file
            telemetry.errors["sink.jsonl"] += 1
            telemetry.warn("JSONL records disabled: cannot open %s: %r", cfg.jsonl_path, exc)
    return sinks


def main(argv: list[str] | None = None) -> None:
    """The collector process (started by ``client.CollectorClient``; configuration from the environment)."""
    p = argparse.ArgumentParser(prog="python -m sglang_mmtrace.join.collector")
    p.add_argument(
        "--ipc-dir", required=True, help="the sockets' folder (ipc.addresses), removed when this process ends"
    )
    p.add_argument("--sglang-version", default="unknown")
    p.add_argument("--parent", type=int, required=True)
    args = p.parse_args(argv)
    ipc.remove_at_exit(args.ipc_dir)
    ipc.remove_on_sigterm(args.ipc_dir)
    _die_with_parent()
    logging.basicConfig(level=logging.INFO, format="[mmtrace collector] %(message)s", stream=sys.stderr)
    from .. import config

    cfg = config.get()
    collector = Collector(cfg, _sinks(cfg), args.sglang_version, ipc.addresses(args.ipc_dir))
    collector.parent_pid = args.parent
    if os.getppid() != args.parent:
        return
    collector.run()


def _die_with_parent() -> None:
    """Linux: SIGTERM this process when its parent (the API process) dies (also checked every second)."""
    try:
        import ctypes
        import signal

        ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG
    except Exception:
        pass


if __name__ == "__main__":
    main()
