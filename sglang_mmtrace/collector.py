"""The join: one record per request from the API, scheduler and detokenizer processes.

Runs in the API process on one daemon thread. API hooks hand over finished ``ApiTrace`` objects
(a deque append); scheduler and detokenizer outboxes send their stage events over ZMQ, keyed by rid.
Records are built here, off the request path, and passed to the sinks.
"""

from __future__ import annotations

import collections
import logging
import os
import pickle
import tempfile
import threading
import time
import uuid
from typing import Any, Protocol

from . import switch, telemetry
from .config import Config
from .context import LIVE, ApiTrace, HttpCtx
from .record import EmitContext, StageEvent, coverage, stage_dicts
from .stages import API, ROOT

logger = logging.getLogger("sglang_mmtrace")

POLL_MS = 50
IDLE_POLL_MS = 1000
"""While the switch is off and nothing is waiting: how long the collector thread sleeps between looks."""
FLIP_TIMEOUT_S = 5.0
FLIP_RESEND_S = 0.2
HEALTH_INTERVAL_S = 1.0
ORPHAN_TTL_S = 30.0
DONE_MEMORY = 4096
LAST_REMOTE_STAGES = ("scheduler.output", "detokenize")


_ship = switch.gate("ship")
_records = switch.gate("records")


class Sink(Protocol):
    PART: str  # the switch part that gates it

    def emit(self, record: dict[str, Any], ctx: EmitContext) -> None: ...


def collector_address(kind: str = "events") -> str:
    name = f"sglang-mmtrace-{os.getpid()}-{kind}-{uuid.uuid4().hex[:8]}.ipc"
    return "ipc://" + os.path.join(tempfile.gettempdir(), name)


class FlipPublisher:
    """The API process's end of the switch: a PUB socket the schedulers and detokenizer subscribe to.

    Bound at install, used only by the HTTP handler of ``POST /mmtrace/enabled`` (the event loop).
    """

    def __init__(self, address: str | None = None) -> None:
        import zmq

        self.address = address or collector_address("control")
        self._sock = zmq.Context.instance().socket(zmq.PUB)
        self._sock.setsockopt(zmq.LINGER, 0)
        self._sock.bind(self.address)
        self._lock = threading.Lock()

    def publish(self, setting: switch.Setting, gen: int) -> None:
        with self._lock:
            self._sock.send(pickle.dumps((gen, setting.on, setting.parts)))


class Collector:
    def __init__(self, cfg: Config, sinks: list[Sink], sglang_version: str, address: str | None = None) -> None:
        self.cfg = cfg
        self.sinks = sinks
        self.sglang_version = sglang_version
        self.address = address or collector_address()
        self._finished: collections.deque[ApiTrace] = collections.deque()
        self._waiting: list[tuple[float, ApiTrace]] = []
        self._remote: dict[str, list[StageEvent]] = {}
        self._remote_seen: dict[str, float] = {}
        self._done: collections.OrderedDict[str, None] = collections.OrderedDict()
        self._peers: dict[str, dict[str, Any]] = {}
        self._records = 0
        self._discarded = 0  # requests that crossed a switch flip: no record
        self.control = FlipPublisher()
        self.last_flip = float("-inf")  # perf_counter time of the last flip
        self._unix_offset = time.time() - time.perf_counter()
        self._last_health = 0.0
        self.metrics_started = False
        self._thread = threading.Thread(target=self._run, name="mmtrace-collector", daemon=True)
        self._ready = threading.Event()

    # -- called from request paths (cheap) ---------------------------------------------------
    def start(self) -> None:
        self._thread.start()
        self._ready.wait(5.0)

    def add_sink(self, sink: Sink) -> None:
        """Sinks may arrive after start (metrics need SGLang's server args); list swaps are atomic."""
        self.sinks = [*self.sinks, sink]

    def finish(self, trace: ApiTrace) -> None:
        """Hand a finished request over; it leaves ``LIVE`` now, whatever its status.

        A request that did not start and end in the same switch generation is marked for discard
        (the collector also drops the other processes' events for it)."""
        if trace.closed:
            return
        trace.closed = True
        LIVE.pop(trace.rid, None)
        if trace.http is not None and trace.http.gen != switch.generation:
            trace.discard = True
        elif not _ship.on:
            return
        self._finished.append(trace)

    async def flip(self, setting: switch.Setting) -> tuple[bool, dict[str, Any]]:
        """Apply a setting here, publish it, and wait until every peer process confirms it.

        Returns ``(all confirmed, per-process state)``; runs on the event loop (``POST /mmtrace/enabled``).
        """
        import asyncio

        gen = switch.generation + 1
        switch.apply(setting, gen)
        self.last_flip = time.perf_counter()
        deadline = time.monotonic() + FLIP_TIMEOUT_S
        sent = 0.0
        while True:
            missing = [key for key, hb in self._peers.items() if (hb.get("switch") or {}).get("generation") != gen]
            t = time.monotonic()
            if not missing or t >= deadline:
                break
            if t - sent >= FLIP_RESEND_S:  # a subscriber that connected late missed the first one
                self.control.publish(setting, gen)
                sent = t
            await asyncio.sleep(0.002)
        processes = {f"api:{os.getpid()}": switch.snapshot()}
        processes.update({key: hb.get("switch") for key, hb in self._peers.items()})
        return not missing, {**switch.snapshot(), "processes": processes, **({"missing": missing} if missing else {})}

    def finish_http(self, http: HttpCtx) -> None:
        for trace in http.traces:
            self.finish(trace)

    # -- collector thread ------------------------------------------------------------------
    def _run(self) -> None:
        import zmq

        ctx = zmq.Context.instance()
        sock = ctx.socket(zmq.PULL)
        sock.setsockopt(zmq.RCVHWM, 100000)
        sock.bind(self.address)
        self._ready.set()
        poller = zmq.Poller()
        poller.register(sock, zmq.POLLIN)
        while True:
            try:
                idle = not switch.GATES["records"].on and not self._waiting and not self._finished
                if poller.poll(IDLE_POLL_MS if idle else POLL_MS):
                    while True:
                        try:
                            raw = sock.recv(zmq.NOBLOCK)
                        except zmq.Again:
                            break
                        self._on_message(pickle.loads(raw))
                self._drain_finished()
                t = time.perf_counter()
                self._flush_ready(t)
                if t - self._last_health >= HEALTH_INTERVAL_S:
                    self._last_health = t
                    self._sync_health()
            except Exception as exc:  # the collector must outlive any bad message
                telemetry.contained("collector", exc)

    def _on_message(self, msg: tuple[Any, ...]) -> None:
        kind, process, pid, body = msg
        if kind == "hb":
            self._peers[f"{process}:{pid}"] = body
            return
        t = time.perf_counter()
        for rids, name, t0, t1, clock, attrs in body:
            for rid in rids if isinstance(rids, tuple) else (rids,):
                if rid in self._done:
                    continue
                self._remote.setdefault(rid, []).append(StageEvent(name, process, t0, t1, clock, attrs, pid))
                self._remote_seen.setdefault(rid, t)

    def _drain_finished(self) -> None:
        q = self._finished
        while q:
            trace = q.popleft()
            if trace.discard or not _records.on:
                self._forget(trace.rid)
                self._discarded += trace.discard
                continue
            wait = self.cfg.grace_s if trace.dispatched else 0.0
            self._waiting.append((time.perf_counter() + wait, trace))

    def _flush_ready(self, t: float) -> None:
        keep = []
        for deadline, trace in self._waiting:
            remote = self._remote.get(trace.rid, ())
            complete = not trace.dispatched or all(any(e.name == n for e in remote) for n in self._last_stages())
            if complete or t >= deadline:
                self._emit(trace)
            else:
                keep.append((deadline, trace))
        self._waiting = keep
        for rid, seen in list(self._remote_seen.items()):
            if t - seen > ORPHAN_TTL_S and rid not in LIVE:  # a live request may be slow (cold JIT)
                self._remote_seen.pop(rid, None)
                if self._remote.pop(rid, None) is not None:
                    if abs(seen - self.last_flip) < ORPHAN_TTL_S:
                        self._discarded += 1  # its API side arrived while the switch was off
                    else:
                        telemetry.drop("orphan_events")

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
            self._done.popitem(last=False)
        return remote

    def _emit(self, trace: ApiTrace) -> None:
        remote = self._forget(trace.rid)
        if trace.http is not None and trace.http.internal:
            return
        try:
            record = build_record(trace, remote, self.sglang_version, self._unix_offset)
        except Exception as exc:
            telemetry.contained("record", exc)
            return
        self._records += 1
        parent = trace.sglang_traceparent or (trace.http.traceparent if trace.http is not None else None)
        ctx = EmitContext(parent, self._pids(remote))
        for sink in self.sinks:
            if not switch.on(sink.PART):
                continue
            try:
                sink.emit(record, ctx)
            except Exception as exc:
                telemetry.contained(f"sink.{type(sink).__name__}", exc)

    def _pids(self, remote: list[StageEvent]) -> dict[str, int]:
        """Process kind -> pid for this request: the process that sent its events (with ``--dp-size``
        > 1 each request has its own scheduler), else the first peer of that kind."""
        pids = {"api": os.getpid()}
        for e in remote:
            if e.pid is not None:
                pids.setdefault(e.process, e.pid)
        for key in self._peers:
            process, _, pid = key.partition(":")
            pids.setdefault(process, int(pid))
        return pids

    def _sync_health(self) -> None:
        from .sinks.prometheus import health_totals

        totals = None
        for sink in self.sinks:
            sync = getattr(sink, "sync_health", None)
            if sync is not None and switch.on(sink.PART):
                totals = totals or health_totals(
                    {"errors": telemetry.errors, "dropped": telemetry.dropped}, self._peers
                )
                try:
                    sync(totals)
                except Exception as exc:
                    telemetry.contained(f"sink.{type(sink).__name__}", exc)

    # -- introspection (tests, doctor) ---------------------------------------------------------
    def state(self) -> dict[str, Any]:
        return {
            "api": {
                "live_requests": len(LIVE),
                "finishing": len(self._finished) + len(self._waiting),
                "remote_pending": len(self._remote),
                "records": self._records,
                "switch_discarded": self._discarded,
                "switch": switch.snapshot(),
                "errors": dict(telemetry.errors),
                "dropped": dict(telemetry.dropped),
            },
            "peers": dict(self._peers),
        }


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
        for e in http.pre_events:
            if e.name == "openai.convert" and trace.t_created > e.t1:
                # Until the TokenizerManager holds the internal request: includes the executor's return hop.
                e = StageEvent(
                    e.name, e.process, e.t0, trace.t_created, e.clock, {**e.attrs, "converted_s": round(e.t1 - e.t0, 9)}
                )
            events.append(e)
        events.append(StageEvent("http.parse", API, arrival, http.t_handle or trace.t_created))
    events.extend(trace.events)
    joined = _join_stages(trace, remote)  # completes the remote events it joins (clamps, attrs)
    events.extend(remote)
    events.extend(joined)
    status, error = _status(trace)
    t_first = http.t_first_body if http is not None else trace.t_first_output
    ttft = None
    if trace.t_first_output is not None and t_first is not None and status != "error":
        ttft = t_first - arrival
        if http is not None:
            events.append(StageEvent("response.first_chunk", API, trace.t_first_output, t_first))
        events.append(StageEvent(ROOT, API, arrival, t_first))
    t_end = (http.t_last_body if http is not None else None) or trace.t_finished
    stages = stage_dicts(events, arrival)
    attributed, cov = coverage(stages, ttft)

    prefix = next((e.attrs for e in remote if e.name == "scheduler.prefix_match"), None)
    prompt_tokens = prefix.get("prompt_tokens") if prefix else trace.meta_prompt_tokens
    cached_tokens = prefix.get("cached_tokens") if prefix else trace.meta_cached_tokens
    image_prefix_hit = bool(prefix.get("image_prefix_hit")) if prefix else False
    vit = [e for e in remote if e.name == "model.vision_encoder" and not e.attrs.get("skipped")]
    emb_states = {e.attrs.get("embedding_cache") for e in remote if e.name in ("model.embed", "model.vision_encoder")}
    emb_states.discard(None)
    embedding = "miss" if (vit or "miss" in emb_states) else ("hit" if "hit" in emb_states else "off")
    preprocess = ("miss" if "miss" in trace.preprocess else "hit") if trace.preprocess else "off"
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
        "cache": {"preprocess": preprocess, "embedding": embedding, "image_prefix_hit": image_prefix_hit},
        "transport": {"mode": trace.transport_mode or "none", "bytes": int(trace.transport_bytes)},
        "stages": stages,
        "attributed_s": round(attributed, 9),
        "coverage": round(cov, 6),
        **({"content": trace.content} if trace.content is not None else {}),
    }


def _first(events: list[StageEvent], name: str) -> StageEvent | None:
    return next((e for e in events if e.name == name), None)


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
    dispatch, recv = _first(api, "dispatch"), _first(remote, "scheduler.recv")
    if recv is not None and trace.transport_bytes and trace.transport_mode:
        recv.attrs = {**recv.attrs, "mode": trace.transport_mode, "bytes": int(trace.transport_bytes)}
    if dispatch is not None and recv is not None:
        prepared = _first(api, "transport.prepare")
        sent_after = max(dispatch.t0, prepared.t1 if prepared is not None else dispatch.t0)
        if recv.t0 < sent_after <= recv.t1:
            recv.attrs = {**recv.attrs, "poll_started_s": round(sent_after - recv.t0, 9)}
            recv.t0 = sent_after
        if recv.t0 > dispatch.t1:
            out.append(StageEvent("scheduler.inbox_wait", "scheduler", dispatch.t1, recv.t0))
    output, detok = _first(remote, "scheduler.output"), _first(remote, "detokenize")
    received = detok.t0 if detok is not None else t_first_output
    if output is not None and received is not None and output.t0 <= received < output.t1:
        # The hand-off was sent before the next process received it: stream_output may still be
        # returning (bookkeeping after its send) while the detokenizer already works.
        output.attrs = {**output.attrs, "after_send_s": round(output.t1 - received, 9)}
        output.t1 = received
    if output is not None and detok is not None and detok.t0 > output.t1:
        out.append(StageEvent("detokenize.inbox_wait", "detokenizer", output.t1, detok.t0))
    if detok is not None and t_first_output is not None and t_first_output > detok.t1:
        out.append(StageEvent("response.inbox_wait", "api", detok.t1, t_first_output))
    return out


def _trace_id(http: HttpCtx | None) -> str | None:
    tp = http.traceparent if http is not None else None
    if tp:
        parts = tp.split("-")
        if len(parts) >= 4 and len(parts[1]) == 32:
            return parts[1]
    return None
