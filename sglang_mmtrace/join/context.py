"""Per-request state in the API process, and how hooks find it.

A request's state lives on objects that die with it: ``HttpCtx`` hangs off the ASGI scope, and
``ApiTrace`` is indexed in ``LIVE`` by rid only between ``_init_req_state`` and the end of the HTTP
exchange (or the TokenizerManager's end of the request), when it is handed to the collector.

The stage events measured here are kept as plain tuples in the wire form (``WireEvent``), not as
``StageEvent`` objects: a tuple is built in C, a ``StageEvent`` through a Python ``__init__`` (a dozen
of them per image request, before its first token), and the tuples are what is shipped anyway. The
collector process turns them into ``StageEvent``s (``from_wire``).
"""

from __future__ import annotations

import contextvars
import time
from typing import Any

from .. import switch
from ..stages import API, DISPATCH
from .record import StageEvent

now = time.perf_counter

WireEvent = tuple[str, str, float, float, str, dict[str, Any], "int | None"]
"""A ``StageEvent``'s fields in order: (name, process, t0, t1, clock, attrs, pid)."""

INTERNAL_PATHS = frozenset({"/health", "/health_generate"})
WARMUP_HEADER = b"x-mmtrace-warmup"
"""A request sent with ``X-Mmtrace-Warmup: 1`` is a warm-up: its record says ``"warmup": true`` and
``report``, the metrics and so the dashboards leave it out (as SGLang's own start-up request)."""


class HttpCtx:
    """One HTTP exchange, as the ASGI middleware sees it."""

    __slots__ = (
        "t_arrival",
        "t_handle",
        "t_first_body",
        "t_last_body",
        "status_code",
        "disconnected",
        "error",
        "traces",
        "trace_headers",
        "path",
        "method",
        "scheme",
        "route",
        "internal",
        "gen",
        "gen_end",
        "ship",
        "warmup",
    )

    def __init__(self, t_arrival: float, path: str) -> None:
        self.t_arrival = t_arrival
        self.path = path
        self.t_handle: float | None = None
        self.t_first_body: float | None = None
        self.t_last_body: float | None = None
        self.status_code: int | None = None
        self.disconnected = False
        self.error: str | None = None
        self.traces: list[ApiTrace] = []
        self.trace_headers: dict[str, str] | None = None
        """The incoming trace context: the headers the configured propagators read (``traceparent``,
        ``tracestate``, ``baggage`` by default)."""
        self.method = ""  # the HTTP method, scheme and matched route: the root span's HTTP attributes
        self.scheme = "http"
        self.route: str | None = None  # set when the exchange is handed over (routing has run by then)
        self.internal = path in INTERNAL_PATHS  # SGLang's own health probes: joined, never reported
        self.gen = switch.generation  # recorded only if it ends in the same switch generation
        self.gen_end: int | None = None  # the generation when the last body byte was sent
        self.ship = switch.on("ship")  # the setting it runs under decides, not the one when it is handed over
        self.warmup = False  # the client said so (``WARMUP_HEADER``)


class ApiTrace:
    """Everything the API process measures for one rid."""

    __slots__ = (
        "rid",
        "http",
        "model",
        "t_created",
        "events",
        "image_meta",
        "images",
        "preprocess",
        "transport_mode",
        "transport_bytes",
        "dispatched",
        "t_first_output",
        "t_finished",
        "output_tokens",
        "meta_prompt_tokens",
        "meta_cached_tokens",
        "finish_reason",
        "tm_error",
        "closed",
        "sglang_trace_headers",
        "error_class",
        "content",
        "discard",
        "warmup",
        "gpu_pending",
        "sglang_state",
        "media",
        "failures",
        "remote_encoder",
    )

    def __init__(self, rid: str, http: HttpCtx | None, model: str, t_created: float) -> None:
        self.rid = rid
        self.http = http
        self.model = model
        self.t_created = t_created
        self.events: list[WireEvent] = []
        self.image_meta: dict[str, dict[str, Any]] = {}
        self.images: list[dict[str, Any]] = []
        self.preprocess: list[str] = []
        self.transport_mode: str | None = None
        self.transport_bytes = 0
        self.dispatched = False
        self.t_first_output: float | None = None
        self.t_finished: float | None = None
        self.output_tokens = 0
        self.meta_prompt_tokens: int | None = None
        self.meta_cached_tokens: int | None = None
        self.finish_reason: Any = None
        self.tm_error: str | None = None
        self.closed = False
        self.sglang_trace_headers: dict[str, str] | None = None  # SGLang's own root span (--enable-trace)
        self.error_class: str | None = None  # exception class that failed the request in a hook's target
        self.content: dict[str, Any] | None = None  # prompt and image URLs, only with CAPTURE_CONTENT=1
        self.discard = False  # crossed a switch flip: no record
        self.warmup = False  # a warm-up request (SGLang's start-up request, or marked by its client)
        self.gpu_pending: list[tuple[str, float, float, dict[str, Any], Any, int]] = []  # see add_gpu
        self.sglang_state: Any = None  # SGLang's own state of the rid (its ReqState): see read_sglang_notes
        self.media: dict[str, int] = {}  # modality -> items the request carried (its stages are then expected)
        # encoder disaggregation: the transfer backend when this (language-only) server sent the
        # request's media to an encoder server, whose scheduler then waits for the embeddings
        self.remote_encoder: str | None = None
        self.failures: list[dict[str, str]] = []  # the record's failures: see fail

    def add(self, name: str, t0: float, t1: float, attrs: dict[str, Any] | None = None, clock: str = "host") -> None:
        self.events.append((name, API, t0, t1, clock, attrs or {}, None))

    def fail(self, stage: str, modality: str, exc: BaseException) -> None:
        """A multimodal stage whose call raised: the record's ``failures`` (the Prometheus sink counts
        them, ``sglang_mmtrace_stage_failures_total``). The exception's class name only: its message
        can carry content (a URL, a data prefix)."""
        self.failures.append({"stage": stage, "modality": modality, "error_type": type(exc).__name__})

    def add_gpu(self, name: str, t0: float, t1: float, attrs: dict[str, Any], ref: Any, end: int) -> None:
        """A stage whose GPU work ends at CUDA mark ``end``, placed on the host timeline by reference
        ``ref`` (``hooks.cuda_marks.Reference``), read by ``resolve_gpu`` when the request has finished:
        off its path to the first token (a read is a CUDA call, microseconds of its thread's CPU), and
        by then the GPU has long passed the mark."""
        self.gpu_pending.append((name, t0, t1, attrs, ref, end))

    def read_sglang_notes(self) -> None:
        """What SGLang notes itself about the rid, read once the request is handed over: whether it
        reached the scheduler (``ReqState.dispatched``, set for the rid that was sent) and ``dispatch``,
        from the start and end of ``_send_one_request`` in its time stats (``api_server_dispatch_time``,
        ``..._finish_time``; ``perf_counter`` as ours, 0.5.17-0.5.23). No hook on that call, then: one
        hooked call less on every request's way to its first token (its NVTX range has a hook only where
        a tool is attached, ``hooks.base.ranged``). Lets go of the state.

        The time stats can be another rid's: the prefix request of a parallel sampling (n > 1) is sent
        with the prompt's. So the state's own flag says whether the rid was sent (times then only when
        they are its own: the prefix request has no ``dispatch`` stage); only a release whose
        ``ReqState`` has no flag (0.5.18, 0.5.19) goes by the times alone."""
        state, self.sglang_state = self.sglang_state, None
        stats = getattr(state, "time_stats", None)
        t0 = getattr(stats, "api_server_dispatch_time", 0.0)
        t1 = getattr(stats, "api_server_dispatch_finish_time", 0.0)
        sent = getattr(state, "dispatched", None)
        if sent is None:
            sent = 0.0 < t0 <= t1
        if sent:
            self.dispatched = True
            if 0.0 < t0 <= t1:
                self.add(DISPATCH, t0, t1)

    def resolve_gpu(self) -> None:
        """File the stages ``add_gpu`` held: from the host call's start to the later of its return and
        the GPU's end of its work (``clock: "cuda"``; ``gpu_s``: that end from the start), host-timed
        (with the reason, ``"gpu": "pending"`` or ``"unreadable"``) when the mark does not read. Never
        waits for the GPU."""
        pending, self.gpu_pending = self.gpu_pending, []
        for name, t0, t1, attrs, ref, end in pending:
            t_end = ref.host(end, t0)  # the GPU did not run the stage's work before the call started
            if isinstance(t_end, float):
                timed = {**attrs, "gpu_s": round(t_end - t0, 9), "host_s": round(t1 - t0, 9)}
                self.add(name, t0, max(t1, t_end), timed, "cuda")
            else:
                self.add(name, t0, t1, {**attrs, "gpu": t_end})


current_http: contextvars.ContextVar[HttpCtx | None] = contextvars.ContextVar("mmtrace_http", default=None)
current_trace: contextvars.ContextVar[ApiTrace | None] = contextvars.ContextVar("mmtrace_trace", default=None)


class EngineCall:
    """One offline ``sglang.Engine.generate``/``async_generate`` call: its requests' root starts here."""

    __slots__ = ("t_call", "traces")

    def __init__(self, t_call: float) -> None:
        self.t_call = t_call
        self.traces: list[ApiTrace] = []


current_call: contextvars.ContextVar[EngineCall | None] = contextvars.ContextVar("mmtrace_call", default=None)

LIVE: dict[str, ApiTrace] = {}
"""rid -> trace, for hooks that run outside the request's task (output handling)."""


# -- the wire form: what the API process sends the collector process for a finished request --------
_EVENT_LISTS = frozenset({"events"})
_HTTP_WIRE = tuple(s for s in HttpCtx.__slots__ if s != "traces")  # siblings are not needed there
NOT_SHIPPED = ("http", "gpu_pending", "sglang_state")
"""``ApiTrace`` fields that stay in the API process: the exchange (shipped beside it), and what is read
into events before the hand-over (``resolve_gpu``, ``read_sglang_notes``)."""
_TRACE_WIRE = tuple(s for s in ApiTrace.__slots__ if s not in NOT_SHIPPED)


def _pack(obj: Any, names: tuple[str, ...]) -> tuple:
    return tuple(getattr(obj, n) for n in names)  # the event lists already hold wire tuples


def _unpack(obj: Any, names: tuple[str, ...], values: tuple) -> Any:
    for n, v in zip(names, values, strict=True):
        setattr(obj, n, [StageEvent(*e) for e in v] if n in _EVENT_LISTS else v)
    return obj


def to_wire(trace: ApiTrace) -> tuple:
    """Plain tuples of the trace and its HTTP exchange: pickled much faster than the objects.
    The collector's ``from_wire`` gives back an ``ApiTrace`` whose event lists hold ``StageEvent``s."""
    http = trace.http
    return _pack(trace, _TRACE_WIRE), (None if http is None else _pack(http, _HTTP_WIRE))


def from_wire(wire: tuple) -> ApiTrace:
    values, http_values = wire
    trace = _unpack(ApiTrace.__new__(ApiTrace), _TRACE_WIRE, values)
    trace.http = None if http_values is None else _unpack(HttpCtx.__new__(HttpCtx), _HTTP_WIRE, http_values)
    if trace.http is not None:
        trace.http.traces = [trace]
    return trace
