"""Hot-path microbenchmark: the plugin's own cost per request and per decode step, per process.

No SGLang server is started. Each SGLang target the plugin hooks is replaced by a stand-in of the
same shape (same method names, the arguments and results the hooks read), and the *real* hook
wrappers are built with ``registry.HOOKS[hook_id].make(kind)`` and applied exactly as
``patch.apply`` does (``patch.hooked``: the hook built into its target's replacement). The
API request runs through the real ASGI ``MmtraceMiddleware``.

Two arms per measurement, built from the same stand-ins: ``plain`` (no plugin) and ``traced``
(plugin wrappers applied, plugin runtime live). Samples are interleaved one by one, in random order
per repetition, and timed with ``time.perf_counter_ns``; the reported *extra* cost is
``quantile(traced) - quantile(plain)`` at the median and at p90, plus the median of paired
differences with a bootstrap 95% interval. Stand-ins do no work, so the plain arm is the floor of
the call chain itself and the extra is the plugin's cost alone. Per request it is also given up to the
hand-off of the first output (the API's first SSE body bytes, the scheduler's ``stream_output``): the
part that can add to TTFT; the rest (records handed over, events built and shipped) runs after it.

Each process kind runs in its own child interpreter so its runtime is set up as in SGLang:
- api: the real collector process (no sinks), started by ``CollectorClient``; remote stage events
  for the traced rids are pushed to it between blocks (outside the timed region), as an outbox
  would, so records complete and the collector does its real join work in its own process;
- scheduler / detokenizer: a real ``Outbox`` connected to a bound ZMQ PULL socket, so appends, the
  sends from the emitting thread and the control thread are real.
The outbox's control thread is also measured: its CPU time per traced request, from the thread CPU
clock, minus its idle rate (the API process runs no plugin thread).

    python -m benchmarks.hotpath                 # all processes, writes hotpath.json here (--json OUT)
    python -m benchmarks.hotpath --reps 5000     # quicker
    python -m benchmarks.hotpath --processes api scheduler --cold --leave-out   # each hook left out in turn
    python -m benchmarks.hotpath --processes api scheduler --cold --switched-off
    python -m benchmarks.hotpath --processes api scheduler --cold --after-flip --reps 1000

``--switched-off`` (api, scheduler) also times a request whose hooks are left in place with the switch
off (their gates closed, the middleware's ``http`` gate off) against the plain arm: what a switched-off
plugin cost per request while it kept its hooks in place, a cost the switch's same-instance comparison
does not see (the server now takes switched-off hooks out, ``patch.follow``). ``--after-flip`` (api,
scheduler) times a request right after the switch was flipped off and on (``after_flip``) against one
on an arm never flipped: the part of a same-instance run's carry-over that the flip itself makes.
"""

from __future__ import annotations

import argparse
import contextvars
import functools
import gc
import json
import os
import pickle
import random
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from collections.abc import Callable
from pathlib import Path
from time import perf_counter_ns
from types import SimpleNamespace as NS
from typing import Any

import numpy as np

from sglang_mmtrace.patch import hooked

from ._common import bootstrap_median_ci, machine, quantile

DEFAULT_REPS = 20000
DEFAULT_WARMUP = 2000
DEFAULT_STEPS = 8  # output steps per request (the TTFT A/B benchmark asks for max_tokens=8)
STEP_BLOCK = 20  # decode-step samples time a block of this many steps (one step is ~1 µs)
DEFAULT_STEP_REPS = 10000


# ---------------------------------------------------------------------------------------------
# measurement


def hooks() -> dict[str, Any]:
    from sglang_mmtrace.hooks.registry import HOOKS

    return HOOKS


GATE: list[bool] | None = None
"""The gate the wrappers below are built with (``patch.hooked``'s ``enabled``): None (always on), or
``[]`` while building a ``--switched-off`` arm (its hooks pass every call straight through)."""


PLACED: list[tuple[type, str, Any, Any]] | None = None
"""While an ``--after-flip`` arm is built: each class attribute its hooks replaced, as (class, name,
the stand-in's own function, the hook)."""


def wrap_method(cls: type, attr: str, hook_id: str, kind: str) -> None:
    """What ``patch.apply`` does to a class attribute, on a stand-in class (nothing for a hook that is
    an NVTX range only: no tool is attached here, and the plugin applies none then)."""
    spec = hooks()[hook_id]
    if not spec.nvtx_only:
        original = cls.__dict__[attr]
        hook = hooked(cls, original, spec.make(kind), GATE)
        setattr(cls, attr, hook)
        if PLACED is not None:
            PLACED.append((cls, attr, original, hook))


def wrap_function(fn: Callable[..., Any], hook_id: str, kind: str) -> Callable[..., Any]:
    """What ``patch.apply`` rebinds a module-level function to."""
    spec = hooks()[hook_id]
    return fn if spec.nvtx_only else hooked(None, fn, spec.make(kind), GATE)


def switched_off(
    build: Callable[[], Callable[[bool], Callable[[], Any]]],
    plain: Callable[[bool], Callable[[], Any]],
    args: argparse.Namespace,
    unit: str,
) -> dict[str, Any]:
    """``--switched-off``: image and text requests up to the hand-off, hooks in place with every gate
    closed (``build()`` makes the traced arm while ``GATE`` is ``[]``), against the plain arm."""
    global GATE
    from sglang_mmtrace import switch

    GATE = []
    try:
        off = build()
    finally:
        GATE = None
    http = switch.gate("http")
    http.on = False  # the middleware's own test (the patched targets test GATE)
    try:
        return {kind: summarize(samples, unit, "@handoff") for kind, samples in by_kind(plain, off, args, 7).items()}
    finally:
        http.on = True


def after_flip(
    build: Callable[[], Callable[[bool], Callable[[], Any]]], args: argparse.Namespace, unit: str
) -> dict[str, Any]:
    """``--after-flip``: image and text requests up to the hand-off, each right after the switch was
    flipped off and on again (untimed: every hooked class attribute put back to the stand-in's own
    function, then the hook again, as ``patch.follow`` does), against the same requests on an arm
    never flipped. Both start with cold data caches under ``--cold``; the difference is what a flip
    leaves the next request to redo (the interpreter's type caches and specialised call sites of the
    classes whose attributes changed): the part of the carry-over between a same-instance run's arms
    that the flip itself makes. Module-level functions the hooks rebind are not flipped here."""
    global PLACED
    PLACED = []
    try:
        flipped = build()
        placed = PLACED
    finally:
        PLACED = None
    steady = build()

    def flip_then(image: bool) -> Callable[[], Any]:
        for cls, attr, original, _ in placed:
            setattr(cls, attr, original)
        for cls, attr, _, hook in placed:
            setattr(cls, attr, hook)
        return flipped(image)

    return {kind: summarize(s, unit, "@handoff") for kind, s in by_kind(steady, flip_then, args, 11).items()}


Arm = Callable[[], Callable[[], Any]]
"""Called untimed to set one sample up; returns the zero-argument call that is timed."""


COLD_BYTES = 64 << 20
"""``--cold``: bytes written (one byte per cache line) before every sample, more than a server CPU's
last-level cache holds: each sample then starts with cold data caches, as a hook does in a server,
where SGLang's own work runs between two calls of it (not a loop of the same call)."""
_cold_buf: bytearray | None = None
COLD = False


def evict_caches() -> None:
    """Write one byte in every cache line of ``COLD_BYTES`` (a C-level slice assignment)."""
    global _cold_buf
    if _cold_buf is None:
        _cold_buf = bytearray(COLD_BYTES)
    _cold_buf[::64] = bytes([(_cold_buf[0] + 1) % 256]) * (COLD_BYTES // 64)


HANDOFF = [0]
"""``perf_counter_ns`` when the sample's stand-in handed the first output on (the API's first SSE body
bytes, the scheduler's ``stream_output``); 0 when it did not. The time up to there is what the hooks
add to TTFT; what runs after it (record hand-over, the model stages' events, the outbox's send) delays
the process's next work, not this request's first token."""


def mark_handoff() -> None:
    if not HANDOFF[0]:
        HANDOFF[0] = perf_counter_ns()


def interleave(
    arms: dict[str, Arm],
    reps: int,
    warmup: int,
    seed: int,
    divisor: int = 1,
    after_block: Callable[[], None] | None = None,
    block: int = 256,
) -> dict[str, list[float]]:
    """Time one sample of every arm (``plain`` and ``traced``, or more) per repetition, in random order;
    ns per unit.

    With ``COLD`` set (``--cold``) the caches are evicted before every sample (untimed). A sample whose
    stand-in marks its hand-off (``mark_handoff``) also adds the time up to it under ``<arm>@handoff``."""
    rng = random.Random(seed)
    order = list(arms)
    out: dict[str, list[float]] = {n: [] for n in order}
    for i in range(warmup + reps):
        rng.shuffle(order)
        for name in order:
            call = arms[name]()
            if COLD:
                evict_caches()
            HANDOFF[0] = 0
            t0 = perf_counter_ns()
            call()
            t1 = perf_counter_ns()
            if i >= warmup:
                out[name].append((t1 - t0) / divisor)
                if HANDOFF[0]:
                    out.setdefault(f"{name}@handoff", []).append((HANDOFF[0] - t0) / divisor)
        if after_block is not None and (i + 1) % block == 0:
            after_block()
    if after_block is not None:
        after_block()
    return out


KINDS = (("image_request", True), ("text_request", False))
"""The request kinds of every per-request measurement, and whether each carries an image."""


def by_kind(
    plain: Callable[[bool], Callable[[], Any]],
    traced: Callable[[bool], Callable[[], Any]],
    args: argparse.Namespace,
    seed: int,
    after_block: Callable[[], None] | None = None,
    block: int = 256,
) -> dict[str, dict[str, list[float]]]:
    """``interleave`` once per request kind (``KINDS``): ``plain(image)`` and ``traced(image)`` set up
    one sample of each arm; ``--reps`` samples after ``--warmup``."""
    return {
        kind: interleave(
            {"plain": lambda image=image: plain(image), "traced": lambda image=image: traced(image)},
            args.reps,
            args.warmup,
            seed=seed,
            after_block=after_block,
            block=block,
        )
        for kind, image in KINDS
    }


def summarize(samples: dict[str, list[float]], unit: str, suffix: str = "") -> dict[str, Any]:
    """Extra cost of ``traced`` over ``plain`` (``suffix="@handoff"``: the times up to the hand-off)."""
    p = np.asarray(samples["plain" + suffix]) / 1000.0  # ns -> µs
    t = np.asarray(samples["traced" + suffix]) / 1000.0
    diff = t - p
    lo, hi = bootstrap_median_ci(diff, n_boot=1000)
    return {
        "unit": unit,
        "n": int(p.size),
        "plain_median_us": round(quantile(p, 0.5), 3),
        "plain_p90_us": round(quantile(p, 0.9), 3),
        "traced_median_us": round(quantile(t, 0.5), 3),
        "traced_p90_us": round(quantile(t, 0.9), 3),
        "extra_median_us": round(quantile(t, 0.5) - quantile(p, 0.5), 3),
        "extra_p90_us": round(quantile(t, 0.9) - quantile(p, 0.9), 3),
        "paired_diff_median_us": round(float(np.median(diff)), 3),
        "paired_diff_median_ci95_us": [round(lo, 3), round(hi, 3)],
    }


def worker_result(
    per_request: dict[str, Any],
    to_handoff: dict[str, Any],
    steps: dict[str, Any],
    background: dict[str, Any],
    checks: dict[str, Any],
) -> dict[str, Any]:
    """What a process worker (api, scheduler) reports: its summaries, background thread and checks."""
    return {
        "per_request": per_request,
        "per_request_to_handoff": to_handoff,
        "per_decode_step": steps,
        "background": background,
        "checks": checks,
    }


def thread_cpu_s(thread: threading.Thread | None) -> float:
    if thread is None or thread.ident is None:
        return 0.0
    return time.clock_gettime(time.pthread_getcpuclockid(thread.ident))


class BackgroundMeter:
    """CPU time a plugin thread spends per traced request, net of what it burns when idle."""

    def __init__(self, thread: threading.Thread | None, idle_s: float = 1.0) -> None:
        self.thread = thread
        c0, w0 = thread_cpu_s(thread), time.perf_counter()
        time.sleep(idle_s)
        self.idle_rate = (thread_cpu_s(thread) - c0) / (time.perf_counter() - w0)  # cpu s per wall s
        self.c0 = self.w0 = 0.0

    def start(self) -> None:
        self.c0, self.w0 = thread_cpu_s(self.thread), time.perf_counter()

    def stop(self, traced_requests: int) -> dict[str, Any]:
        cpu = thread_cpu_s(self.thread) - self.c0
        wall = time.perf_counter() - self.w0
        net = max(0.0, cpu - self.idle_rate * wall)
        return {
            "thread": self.thread.name if self.thread else None,
            "idle_cpu_us_per_s": round(self.idle_rate * 1e6, 1),
            "cpu_us_per_traced_request": round(net / max(1, traced_requests) * 1e6, 3),
            "window_wall_s": round(wall, 3),
            "window_cpu_s": round(cpu, 4),
        }


def drive(coro: Any) -> Any:
    """Run a coroutine that never suspends (every stand-in awaitable returns at once)."""
    try:
        coro.send(None)
    except StopIteration as stop:
        return stop.value
    coro.close()
    raise RuntimeError("stand-in coroutine suspended")


def rid() -> str:
    return uuid.uuid4().hex  # SGLang's rid is a uuid4 hex


# ---------------------------------------------------------------------------------------------
# stand-ins: SGLang-shaped objects carrying the fields the hooks read


class Tensor:
    """A feature tensor as the transport hook sees it (type name and ``nbytes``)."""

    __slots__ = ("nbytes",)

    def __init__(self, nbytes: int) -> None:
        self.nbytes = nbytes


class ShmPointerMMData:
    """Name-matched stand-in of SGLang's SHM pointer (the transport mode is read from the type name)."""

    __slots__ = ()


class Done:
    __slots__ = ("_value",)

    def __init__(self, value: Any) -> None:
        self._value = value

    def result(self) -> Any:
        return self._value


IMAGE_TOKENS = 256  # 512x512 on Qwen3-VL
PROMPT_TOKENS = 300
MAX_REQ_INPUT_LEN = 32768
SNAPSHOT = NS(content_digest="sha256:" + "ab" * 32, size_bytes=180_000, source="data_url")
DECODED = NS(size=(512, 512))
ARTIFACTS = [NS(content_digest=SNAPSHOT.content_digest)]
ENTRIES = [NS(content_digest=SNAPSHOT.content_digest)]
MM_OUTPUT = NS(mm_items=[NS(offsets=[(15, 15 + IMAGE_TOKENS - 1)])])
SHM = ShmPointerMMData()
FEATURE_BYTES = IMAGE_TOKENS * 4 * 1536 * 4  # pixel values of a 512x512 image, fp32


# ---------------------------------------------------------------------------------------------
# API process


API_HOOKS = (
    "http_server.app",
    "tokenizer_manager.init_req_state",
    "tokenizer_manager.tokenize",
    "mm_processor_generic.request",
    "mm_processor.load",
    "mm_processor.preprocess_cache",
    "mm_processor.decode",
    "mm_processor.resize_normalize",
    "mm_processor.expand",
    "transport.wrap_shm_features",
    "tokenizer_manager.batch_output",
)
"""The API hooks an image request meets, in call order (``--leave-out`` drops each in turn)."""
API_TEXT_HOOKS = tuple(h for h in API_HOOKS if not h.startswith("mm_processor"))
"""The API hooks a text request meets (no multimodal processor call)."""
RECORDLESS = frozenset({"http_server.app", "tokenizer_manager.init_req_state"})
"""Left out, these leave a request without an exchange or a trace: it makes no record."""


def build_api(traced: bool, steps: int, skip: str | None = None) -> Callable[[bool], Callable[[], Any]]:
    """One arm of the API process; returns ``sample(image) -> timed call``.

    ``skip``: a hook of ``API_HOOKS`` left unwrapped (``--leave-out``)."""

    class Executor:  # SGLang's sglang-mm-io pool, run inline
        def submit(self, fn, /, *args, **kwargs):
            return Done(fn(*args, **kwargs))

    class Processor:  # QwenVLImageProcessor / MediaArtifactCacheMixin / BaseMultimodalProcessor
        def __init__(self) -> None:
            self.io_executor = Executor()
            self.mm_processor_executor = None

        def snapshot_media_source(self, source, modality):
            return SNAPSHOT

        def _get_cached_artifact(self, key, content_digest, modality):
            return None  # new image: a preprocess-cache miss, every stage runs

        def decode_media_snapshot(self, snapshot, modality):
            return DECODED

        def prepare_artifact_batch(self, entries, *, processor=None):
            return ARTIFACTS

        def compose_image_artifacts(self, input_text, artifacts):
            return MM_OUTPUT

        async def process_mm_data_async(self, image_data, input_text, request_obj, *args, **kwargs):
            snap = self.io_executor.submit(self.snapshot_media_source, image_data[0], "image").result()
            arts = self._get_cached_artifact("key", snap.content_digest, "image")
            if arts is None:
                self.io_executor.submit(self.decode_media_snapshot, snap, "image").result()
                arts = self.prepare_artifact_batch(ENTRIES)
            return self.compose_image_artifacts(input_text, arts)

    def wrap_shm_features(obj):  # mm_utils.wrap_shm_features: features become SHM pointers
        if obj.mm_inputs:
            for item in obj.mm_inputs.mm_items:
                item.feature = SHM
        return obj

    class TokenizerManager:
        served_model_name = "tiny-qwen3vl"

        def __init__(self) -> None:
            self.mm_processor = Processor()
            self.rid_to_state: dict[str, Any] = {}

        def _init_req_state(self, obj, request=None):
            # SGLang's own time stats of the rid (both arms), which the plugin reads dispatch's times from
            stats = NS(
                created_time=time.perf_counter(), api_server_dispatch_time=0.0, api_server_dispatch_finish_time=0.0
            )
            self.rid_to_state[obj.rid] = NS(time_stats=stats, dispatched=False)
            return None

        async def _tokenize_one_request(self, obj):
            mm = None
            if obj.image_data:
                # by name, as SGLang calls it (the request hook reads request_obj by name)
                await self.mm_processor.process_mm_data_async(
                    image_data=obj.image_data,
                    audio_data=obj.audio_data,
                    input_text=obj.text,
                    request_obj=obj,
                    max_req_input_len=MAX_REQ_INPUT_LEN,
                )
                mm = NS(mm_items=[NS(feature=Tensor(FEATURE_BYTES), offsets=MM_OUTPUT.mm_items[0].offsets)])
            return NS(rid=obj.rid, mm_inputs=mm, time_stats=self.rid_to_state[obj.rid].time_stats)

        async def _send_one_request(self, tokenized_obj):
            tokenized_obj.time_stats.api_server_dispatch_time = time.perf_counter()
            wrap_shm(tokenized_obj)
            self.rid_to_state[tokenized_obj.rid].dispatched = True
            tokenized_obj.time_stats.api_server_dispatch_finish_time = time.perf_counter()

        async def _handle_batch_output(self, recv_obj):
            return None

    class OpenAIServingChat:
        def __init__(self, tm: TokenizerManager) -> None:
            self.tm = tm

        def _convert_to_internal_request(self, request, raw_request):
            return request.adapted, request

        async def handle_request(self, request, raw_request):
            received = time.perf_counter()  # SGLang notes the handler's start on the internal request
            tm = self.tm
            adapted, _ = self._convert_to_internal_request(request, raw_request)
            adapted.received_time = received
            tm._init_req_state(adapted, request)
            tokenized = await tm._tokenize_one_request(adapted)
            await tm._send_one_request(tokenized)
            send = raw_request.send
            await send(
                {"type": "http.response.start", "status": 200, "headers": [(b"content-type", b"text/event-stream")]}
            )
            for recv_obj in request.outputs:
                await tm._handle_batch_output(recv_obj)
                await send({"type": "http.response.body", "body": b'data: {"choices":[]}\n\n', "more_body": True})
            await send({"type": "http.response.body", "body": b"data: [DONE]\n\n", "more_body": True})
            await send({"type": "http.response.body", "body": b"", "more_body": False})
            tm.rid_to_state.pop(adapted.rid, None)  # SGLang drops a finished request's state

    wrap_shm = wrap_shm_features
    if traced:
        for attr, hid in (
            ("__init__", "mm_processor.init"),
            ("snapshot_media_source", "mm_processor.load"),
            ("_get_cached_artifact", "mm_processor.preprocess_cache"),
            ("decode_media_snapshot", "mm_processor.decode"),
            ("prepare_artifact_batch", "mm_processor.resize_normalize"),
            ("compose_image_artifacts", "mm_processor.expand"),
        ):
            if hid != skip:
                wrap_method(Processor, attr, hid, "sync")
        for cls, attr, hid, kind in (
            (Processor, "process_mm_data_async", "mm_processor_generic.request", "async"),
            (TokenizerManager, "_init_req_state", "tokenizer_manager.init_req_state", "sync"),
            (TokenizerManager, "_tokenize_one_request", "tokenizer_manager.tokenize", "async"),
            (TokenizerManager, "_send_one_request", "tokenizer_manager.dispatch", "async"),
            (TokenizerManager, "_handle_batch_output", "tokenizer_manager.batch_output", "async"),
            (OpenAIServingChat, "_convert_to_internal_request", "openai_serving.convert", "sync"),
        ):
            if hid != skip:
                wrap_method(cls, attr, hid, kind)
        if skip != "transport.wrap_shm_features":
            wrap_shm = wrap_function(wrap_shm_features, "transport.wrap_shm_features", "sync")

    serving = OpenAIServingChat(TokenizerManager())  # built once per process, like SGLang's
    body = {"type": "http.request", "body": b'{"model":"default","stream":true}', "more_body": False}

    async def receive():
        return body

    async def send(message):  # the server's transport: the first body bytes leave here
        if message["type"] == "http.response.body" and message.get("body"):
            mark_handoff()

    async def app(scope, receive, send):  # the FastAPI route: read the body, call the handler
        await receive()
        await serving.handle_request(scope["_request"], NS(scope=scope, send=send))

    entry: Any = app
    if traced and skip != "http_server.app":
        from sglang_mmtrace.hooks.api.http_server import MmtraceMiddleware

        entry = MmtraceMiddleware(app)

    def sample(image: bool) -> Callable[[], Any]:
        r = rid()
        adapted = NS(
            rid=r,
            text="<|vision_start|><|image_pad|><|vision_end|>Describe.",
            image_data=["data:..."] if image else None,
            video_data=None,
            audio_data=None,
        )
        outputs = [
            NS(
                rids=[r],
                finished_reasons=[None if i < steps - 1 else {"type": "length", "length": steps}],
                completion_tokens=[i + 1],
                prompt_tokens=[PROMPT_TOKENS],
                cached_tokens=[0],
            )
            for i in range(steps)
        ]
        scope = {
            "type": "http",
            "method": "POST",
            "path": "/v1/chat/completions",
            "headers": [
                (b"host", b"127.0.0.1"),
                (b"content-type", b"application/json"),
                (b"accept", b"text/event-stream"),
            ],
            "_request": NS(adapted=adapted, outputs=outputs),
        }
        ctx = contextvars.copy_context()  # each asyncio task runs in its own context copy

        def call() -> Any:
            return ctx.run(drive, entry(scope, receive, send))

        call.rid = r  # type: ignore[attr-defined]
        return call

    return sample


def build_api_decode(traced: bool, n: int) -> Callable[[], Callable[[], Any]]:
    """``_handle_batch_output`` with ``n`` rids, all live and past their first output (steady decode)."""
    from sglang_mmtrace.join.context import LIVE, ApiTrace, HttpCtx

    class TokenizerManager:
        async def _handle_batch_output(self, recv_obj):
            return None

    if traced:
        wrap_method(TokenizerManager, "_handle_batch_output", "tokenizer_manager.batch_output", "async")
    tm = TokenizerManager()
    rids = [rid() for _ in range(n)]
    if traced:
        http = HttpCtx(time.perf_counter(), "/v1/chat/completions")
        for r in rids:
            tr = ApiTrace(r, http, "tiny", time.perf_counter())
            tr.t_first_output = time.perf_counter()
            LIVE[r] = tr
    recv_obj = NS(
        rids=rids,
        finished_reasons=[None] * n,
        completion_tokens=[3] * n,
        prompt_tokens=[PROMPT_TOKENS] * n,
        cached_tokens=[0] * n,
    )

    def sample() -> Callable[[], Any]:
        def call() -> None:
            h = tm._handle_batch_output
            for _ in range(STEP_BLOCK):
                drive(h(recv_obj))

        return call

    return sample


def build_sse_chunks(traced: bool, chunks: int) -> Callable[[], Callable[[], Any]]:
    """An HTTP exchange that streams ``chunks`` body messages, with and without the middleware."""
    body = {"type": "http.request", "body": b"{}", "more_body": False}
    start = {"type": "http.response.start", "status": 200, "headers": []}
    chunk = {"type": "http.response.body", "body": b'data: {"choices":[]}\n\n', "more_body": True}
    last = {"type": "http.response.body", "body": b"", "more_body": False}

    async def receive():
        return body

    async def send(message):
        return None

    async def app(scope, receive, send):
        await receive()
        await send(start)
        for _ in range(chunks):
            await send(chunk)
        await send(last)

    entry: Any = app
    if traced:
        from sglang_mmtrace.hooks.api.http_server import MmtraceMiddleware

        entry = MmtraceMiddleware(app)

    def sample() -> Callable[[], Any]:
        scope = {"type": "http", "method": "POST", "path": "/v1/chat/completions", "headers": [(b"host", b"x")]}
        ctx = contextvars.copy_context()
        return lambda: ctx.run(drive, entry(scope, receive, send))

    return sample


def run_api(args: argparse.Namespace) -> dict[str, Any]:
    import zmq

    from sglang_mmtrace import runtime, telemetry
    from sglang_mmtrace.join.client import CollectorClient
    from sglang_mmtrace.join.context import LIVE

    # The real collector process (no sinks configured: the join runs, nothing is written).
    collector = CollectorClient("0.5.23")
    runtime.collector = collector
    runtime.role = "api"

    def records_built() -> int:
        return collector.request(("state",))["api"]["records"]

    # Remote stages of each traced rid, as the scheduler/detokenizer outboxes would send them.
    push = zmq.Context.instance().socket(zmq.PUSH)
    push.setsockopt(zmq.SNDHWM, 100000)
    push.connect(collector.address)
    pending: list[str] = []
    remote_names = (
        "scheduler.recv",
        "scheduler.queue",
        "scheduler.prefix_match",
        "scheduler.batch",
        "model.forward",
        "model.vision_encoder",
        "model.embed",
        "model.prefill",
        "model.sample",
        "scheduler.output",
    )

    def flush_remote() -> None:
        if not pending:
            return
        t = time.perf_counter()
        sched = [(r, name, t, t, "host", {"batch_size": 1}) for r in pending for name in remote_names]
        detok = [(r, "detokenize", t, t, "host", {"batch_size": 1}) for r in pending]
        push.send(pickle.dumps(("ev", "scheduler", 1, sched), protocol=pickle.HIGHEST_PROTOCOL))
        push.send(pickle.dumps(("ev", "detokenizer", 2, detok), protocol=pickle.HIGHEST_PROTOCOL))
        pending.clear()

    plain, traced = build_api(False, args.steps), build_api(True, args.steps)
    meter = BackgroundMeter(None)  # the API process runs no plugin thread (the collector is its own process)
    results: dict[str, Any] = {}
    to_handoff: dict[str, Any] = {}
    traced_requests = 0
    records_before = records_built()
    meter.start()

    def traced_arm(image: bool) -> Callable[[], Any]:
        call = traced(image)
        pending.append(call.rid)  # type: ignore[attr-defined]
        return call

    for kind, samples in by_kind(plain, traced_arm, args, 1, after_block=flush_remote).items():
        traced_requests += args.reps + args.warmup
        results[kind] = summarize(samples, f"µs per request ({args.steps} output steps)")
        to_handoff[kind] = summarize(samples, "µs per request, up to its first SSE body bytes", "@handoff")
    background = meter.stop(traced_requests)
    leave_out_result = None
    if args.leave_out:

        def traced_without(skip: str | None) -> Callable[[bool], Callable[[], Any]]:
            build = build_api(True, args.steps, skip)

            def sample(image: bool) -> Callable[[], Any]:
                call = build(image)
                pending.append(call.rid)  # type: ignore[attr-defined]
                return call

            return sample

        leave_out_result = leave_out(
            {"image_request": API_HOOKS, "text_request": API_TEXT_HOOKS},
            traced_without,
            plain,
            args,
            flush_remote,
            "µs per request up to its first SSE body bytes",
        )
        # without the middleware or init_req_state a request has no exchange or no trace: no record
        recorded = [h for h in (None, None, *API_HOOKS, *API_TEXT_HOOKS) if h not in RECORDLESS]
        traced_requests += len(recorded) * (args.reps + args.warmup)
    deadline = time.time() + 10
    while records_built() - records_before < traced_requests and time.time() < deadline:
        time.sleep(0.2)
    checks = {
        "traced_requests": traced_requests,
        "records_built": records_built() - records_before,
        "live_left": len(LIVE),
        "contained_errors": dict(telemetry.errors),
        "dropped": dict(telemetry.dropped),
    }

    steps: dict[str, Any] = {}
    for n in args.batch_sizes:
        samples = interleave(
            {"plain": build_api_decode(False, n), "traced": build_api_decode(True, n)},
            args.step_reps,
            args.step_reps // 10,
            seed=2,
            divisor=STEP_BLOCK,
        )
        steps[f"batch_output_{n}_rids"] = summarize(samples, f"µs per decode step (_handle_batch_output, {n} rids)")
    LIVE.clear()
    sse = interleave(
        {"plain": build_sse_chunks(False, 200), "traced": build_sse_chunks(True, 200)},
        args.step_reps,
        args.step_reps // 10,
        seed=3,
        divisor=200,
    )
    steps["middleware_per_sse_chunk"] = summarize(
        sse, "µs per SSE body chunk (200-chunk response, fixed cost amortized)"
    )
    out = worker_result(results, to_handoff, steps, background, checks)
    if leave_out_result is not None:
        out["leave_out"] = leave_out_result
    if args.switched_off:
        out["switched_off"] = switched_off(
            lambda: build_api(True, args.steps), plain, args, "µs per request up to its first SSE body bytes"
        )
    if args.after_flip:
        out["after_flip"] = after_flip(
            lambda: build_api(True, args.steps), args, "µs per request up to its first SSE body bytes, after a flip"
        )
    return out


# ---------------------------------------------------------------------------------------------
# scheduler process


class Mode:
    __slots__ = ("extend",)

    def __init__(self, extend: bool) -> None:
        self.extend = extend

    def is_extend(self) -> bool:
        return self.extend


EXTEND, DECODE = Mode(True), Mode(False)


SCHEDULER_HOOKS = (
    "scheduler.recv_requests",
    "schedule_batch.match",
    "scheduler.run_batch",
    "model_runner.forward",
    "mm_embedding.prepare",
    "mm_embedding.vision_encoder",
    "model_runner.sample",
    "batch_result.prefill",
    "batch_result.stream_output",
)
"""The scheduler hooks an image prefill meets, in call order (``--leave-out`` drops each in turn)."""
SCHEDULER_TEXT_HOOKS = tuple(h for h in SCHEDULER_HOOKS if not h.startswith("mm_embedding"))
"""The scheduler hooks a text prefill meets (nothing to embed)."""


def build_scheduler(
    traced: bool, skip: str | None = None
) -> tuple[Callable[[bool], Callable[[], Any]], Callable[[int], Callable[[], Any]]]:
    """One arm of the scheduler process; returns ``(prefill_sample(image), decode_sample(batch_size))``.

    ``skip``: a hook of ``SCHEDULER_HOOKS`` left unwrapped (``--leave-out``)."""

    class Req:  # schedule_batch.Req
        def __init__(self, rid: str, mm: Any) -> None:
            self.rid = rid
            self.origin_input_ids = list(range(PROMPT_TOKENS))
            self.multimodal_inputs = mm
            self.prefix_indices: list[int] = []
            self.cached_tokens = 0
            self.output_ids: list[int] = []
            # SGLang notes the receive here and the queue entry in _add_request_to_queue (both arms)
            self.time_stats = NS(scheduler_recv_time=time.perf_counter(), wait_queue_entry_time=0.0)

        def init_next_round_input(self, tree_cache=None):
            return None

        def finished(self) -> bool:
            return False

    class ScheduleBatch:
        def __init__(self, reqs: list[Req], mode: Mode, forward_batch: Any) -> None:
            self.reqs = reqs
            self.forward_mode = mode
            self.forward_batch = forward_batch
            # the per-request lists prepare_for_extend sets, which the forward batch is built from
            self.multimodal_inputs = [r.multimodal_inputs for r in reqs]
            self.prefix_lens = forward_batch.extend_prefix_lens_cpu
            self.extend_lens = forward_batch.extend_seq_lens_cpu

        def prepare_for_extend(self):
            return None

    class Model:  # Qwen3VLForConditionalGeneration
        def get_image_feature(self, items):
            return None

    model = Model()

    def prepare_mm_inputs(input_ids, forward_batch, language_model=None, kwargs=None, multimodal_model=None):
        items = [it for mm in forward_batch.mm_inputs if mm is not None for it in mm.mm_items]
        if items:
            model.get_image_feature(items)
        return None

    class ModelRunner:
        def forward(self, forward_batch):
            if forward_batch.mm_inputs:
                prepare_mm(None, forward_batch)
            return forward_batch

        def sample(self, logits_output, forward_batch):
            return None

    class Receiver:  # scheduler_components.request_receiver.SchedulerRequestReceiver
        def __init__(self) -> None:
            self.incoming: list[Any] = []

        def recv_requests(self):
            out, self.incoming = self.incoming, []
            return out

    class Scheduler:
        def __init__(self) -> None:
            self.model_runner = ModelRunner()

        def _add_request_to_queue(self, req, is_retracted=False):
            req.time_stats.wait_queue_entry_time = time.perf_counter()

        def run_batch(self, batch):
            runner = self.model_runner
            out = runner.forward(batch.forward_batch)
            runner.sample(out, batch.forward_batch)
            return out

    class BatchResultProcessor:
        def process_batch_result_prefill(self, batch, result):
            for req in batch.reqs:
                req.output_ids.append(1)
            self.stream_output(batch.reqs)

        def stream_output(self, reqs):  # output_streamer: the first token goes to the detokenizer here
            mark_handoff()

    prepare_mm = prepare_mm_inputs
    if traced:
        for cls, attr, hook_id in (
            (Receiver, "recv_requests", "scheduler.recv_requests"),
            (Scheduler, "run_batch", "scheduler.run_batch"),
            (Req, "init_next_round_input", "schedule_batch.match"),
            (ModelRunner, "forward", "model_runner.forward"),
            (ModelRunner, "sample", "model_runner.sample"),
            (Model, "get_image_feature", "mm_embedding.vision_encoder"),
            (BatchResultProcessor, "process_batch_result_prefill", "batch_result.prefill"),
            (BatchResultProcessor, "stream_output", "batch_result.stream_output"),
        ):
            if hook_id != skip:
                wrap_method(cls, attr, hook_id, "sync")
        if skip != "mm_embedding.prepare":
            prepare_mm = wrap_function(prepare_mm_inputs, "mm_embedding.prepare", "sync")

    receiver, scheduler, results = Receiver(), Scheduler(), BatchResultProcessor()

    def prefill(image: bool) -> Callable[[], Any]:
        r = rid()
        mm = NS(mm_items=[NS(hash=random.getrandbits(63), offsets=[(15, 15 + IMAGE_TOKENS - 1)])]) if image else None
        req = Req(r, mm)
        fb = NS(
            rids=[r],
            mm_inputs=[mm] if image else [],
            extend_prefix_lens_cpu=[0],
            extend_seq_lens_cpu=[PROMPT_TOKENS],
        )
        batch = ScheduleBatch([req], EXTEND, fb)

        def call() -> None:
            receiver.incoming = [req]
            for rq in receiver.recv_requests():
                scheduler._add_request_to_queue(rq)
            req.init_next_round_input(None)
            batch.prepare_for_extend()
            out = scheduler.run_batch(batch)
            results.process_batch_result_prefill(batch, out)

        return call

    def decode(n: int) -> Callable[[], Callable[[], Any]]:
        reqs = [Req(rid(), None) for _ in range(n)]
        if traced:
            from sglang_mmtrace.hooks.scheduler.state import ReqTrace

            for req in reqs:
                req._mmtrace = ReqTrace(0.0, 0.0, req.rid)
                req._mmtrace.admitted = req._mmtrace.first_token = True
        fb = NS(rids=[r.rid for r in reqs], mm_inputs=[], extend_prefix_lens_cpu=[], extend_seq_lens_cpu=[])
        batch = ScheduleBatch(reqs, DECODE, fb)

        def sample() -> Callable[[], Any]:
            def call() -> None:
                for _ in range(STEP_BLOCK):  # one scheduler loop iteration with a decode batch
                    receiver.recv_requests()
                    scheduler.run_batch(batch)

            return call

        return sample

    return prefill, decode


def bind_pull() -> tuple[Any, str]:
    import zmq

    sock = zmq.Context.instance().socket(zmq.PULL)
    sock.setsockopt(zmq.RCVHWM, 1_000_000)
    address = "ipc://" + os.path.join(tempfile.gettempdir(), f"mmtrace-bench-{os.getpid()}-{uuid.uuid4().hex[:6]}.ipc")
    sock.bind(address)
    return sock, address


def drain(sock: Any) -> tuple[int, int]:
    import zmq

    msgs = events = 0
    while True:
        try:
            raw = sock.recv(zmq.NOBLOCK)
        except zmq.Again:
            return msgs, events
        kind, _process, _pid, body, _t_sent = pickle.loads(raw)
        if kind == "ev":
            msgs += 1
            events += len(body)


def run_scheduler(args: argparse.Namespace) -> dict[str, Any]:
    from sglang_mmtrace import runtime, telemetry
    from sglang_mmtrace.join.outbox import Outbox

    sock, address = bind_pull()
    runtime.outbox = Outbox(address, "scheduler")
    runtime.outbox.start()
    runtime.role = "scheduler"
    import torch  # noqa: F401  (loaded in a real scheduler; Clock() asks torch.cuda once per prefill batch)

    plain_prefill, plain_decode = build_scheduler(False)
    traced_prefill, traced_decode = build_scheduler(True)
    meter = BackgroundMeter(runtime.outbox._thread)
    drain(sock)
    got = [0, 0]

    def collect() -> None:
        m, e = drain(sock)
        got[0] += m
        got[1] += e

    results: dict[str, Any] = {}
    to_handoff: dict[str, Any] = {}
    traced_requests = 0
    meter.start()
    for kind, samples in by_kind(plain_prefill, traced_prefill, args, 4, after_block=collect, block=1024).items():
        traced_requests += args.reps + args.warmup
        results[kind] = summarize(samples, "µs per request (prefill path)")
        to_handoff[kind] = summarize(samples, "µs per request, up to stream_output (first token handed on)", "@handoff")
    time.sleep(0.1)
    background = meter.stop(traced_requests)
    collect()
    checks = {
        "traced_requests": traced_requests,
        "events_shipped": got[1],
        "events_per_traced_request": round(got[1] / max(1, traced_requests), 2),
        "messages_shipped": got[0],
        "contained_errors": dict(telemetry.errors),
        "dropped": dict(telemetry.dropped),
    }

    steps: dict[str, Any] = {}
    for n in args.batch_sizes:
        samples = interleave(
            {"plain": plain_decode(n), "traced": traced_decode(n)},
            args.step_reps,
            args.step_reps // 10,
            seed=5,
            divisor=STEP_BLOCK,
        )
        steps[f"loop_iteration_decode_batch_{n}"] = summarize(
            samples, f"µs per decode step (recv_requests empty + run_batch{{forward, sample}}, batch {n})"
        )
    out = worker_result(results, to_handoff, steps, background, checks)
    if args.leave_out:
        out["leave_out"] = leave_out(
            {"image_request": SCHEDULER_HOOKS, "text_request": SCHEDULER_TEXT_HOOKS},
            lambda skip: build_scheduler(True, skip)[0],
            plain_prefill,
            args,
            collect,
            "µs per request up to stream_output",
        )
    if args.switched_off:
        out["switched_off"] = switched_off(
            lambda: build_scheduler(True)[0], plain_prefill, args, "µs per request up to stream_output"
        )
    if args.after_flip:
        out["after_flip"] = after_flip(
            lambda: build_scheduler(True)[0], args, "µs per request up to stream_output, after a flip"
        )
    return out


def leave_out(
    hooks_by_kind: dict[str, tuple[str, ...]],
    traced_without: Callable[[str | None], Callable[[bool], Callable[[], Any]]],
    plain: Callable[[bool], Callable[[], Any]],
    args: argparse.Namespace,
    after_block: Callable[[], None],
    unit: str,
) -> dict[str, dict[str, Any]]:
    """Per request kind (``KINDS``), a request up to the hand-off with every hook (``none``) and with each
    hook the kind meets left out in turn (``traced_without(hook_id)`` builds that arm), all arms and the
    plain one interleaved in each repetition. Each arm is summarized against the plain arm; each hook's
    ``marginal`` is the median over repetitions of ``none`` minus that arm (paired within a repetition,
    so the machine's drift cancels), with a bootstrap 95% interval: what that one hooked call costs
    where it stands. A hook that creates the request's or the batch's state (``match``, ``run_batch``;
    the API's middleware and ``init_req_state``) takes the later hooks' work with it, so the marginals
    do not add up to the whole."""
    out: dict[str, dict[str, Any]] = {}
    for kind, image in KINDS:
        hook_ids = hooks_by_kind[kind]
        arms: dict[str, Arm] = {"plain": functools.partial(plain, image)}
        for skip in (None, *hook_ids):
            arms[skip or "none"] = functools.partial(traced_without(skip), image)
        samples = interleave(arms, args.reps, args.warmup, seed=6, after_block=after_block, block=256)
        base = samples["plain@handoff"]
        full = np.asarray(samples["none@handoff"]) / 1000.0
        per_kind: dict[str, Any] = {}
        for name in ("none", *hook_ids):
            timed = samples[f"{name}@handoff"]
            per_kind[name] = summarize({"plain@handoff": base, "traced@handoff": timed}, unit, "@handoff")
            if name != "none":
                marginal = full - np.asarray(timed) / 1000.0
                lo, hi = bootstrap_median_ci(marginal, n_boot=1000)
                per_kind[name]["marginal_median_us"] = round(float(np.median(marginal)), 3)
                per_kind[name]["marginal_ci95_us"] = [round(lo, 3), round(hi, 3)]
        out[kind] = per_kind
    return out


# ---------------------------------------------------------------------------------------------
# detokenizer process


def build_detokenizer(traced: bool) -> tuple[Callable[[], Callable[[], Any]], Callable[[int], Callable[[], Any]]]:
    from sglang_mmtrace import runtime

    class DetokenizerManager:
        def __init__(self) -> None:
            self.decode_status: dict[str, Any] = {}

        def handle_batch_token_id_out(self, recv_obj):
            for r in recv_obj.rids:
                if r not in self.decode_status:
                    self.decode_status[r] = True
            return None

    if traced:
        wrap_method(DetokenizerManager, "handle_batch_token_id_out", "detokenizer.handle_batch", "sync")
    dm = DetokenizerManager()

    def first() -> Callable[[], Any]:
        recv_obj = NS(rids=[rid()])
        if len(dm.decode_status) > 4096:
            dm.decode_status.clear()
        if traced and runtime.outbox is not None:
            # untimed: in a server the previous request's event left with its own next batch, so a
            # first output finds the queue empty (the send is on that next step's path, not on TTFT)
            runtime.outbox.flush_pending()
        return lambda: dm.handle_batch_token_id_out(recv_obj)

    def decode(n: int) -> Callable[[], Callable[[], Any]]:
        recv_obj = NS(rids=[rid() for _ in range(n)])
        dm.handle_batch_token_id_out(NS(rids=list(recv_obj.rids)))  # already seen: steady decode

        def sample() -> Callable[[], Any]:
            def call() -> None:
                h = dm.handle_batch_token_id_out
                for _ in range(STEP_BLOCK):
                    h(recv_obj)

            return call

        return sample

    return first, decode


def run_detokenizer(args: argparse.Namespace) -> dict[str, Any]:
    from sglang_mmtrace import runtime, telemetry
    from sglang_mmtrace.join.outbox import Outbox

    sock, address = bind_pull()
    runtime.outbox = Outbox(address, "detokenizer")
    runtime.outbox.start()
    runtime.role = "detokenizer"
    plain_first, plain_decode = build_detokenizer(False)
    traced_first, traced_decode = build_detokenizer(True)
    samples = interleave(
        {"plain": plain_first, "traced": traced_first},
        args.reps,
        args.warmup,
        seed=6,
        after_block=lambda: drain(sock),
        block=1024,
    )
    results = {"first_output": summarize(samples, "µs per request (its first output batch)")}
    steps: dict[str, Any] = {}
    for n in args.batch_sizes:
        s = interleave(
            {"plain": plain_decode(n), "traced": traced_decode(n)},
            args.step_reps,
            args.step_reps // 10,
            seed=7,
            divisor=STEP_BLOCK,
        )
        steps[f"handle_batch_{n}_rids"] = summarize(s, f"µs per decode step (handle_batch_token_id_out, {n} rids)")
    drain(sock)
    return {"per_request": results, "per_decode_step": steps, "checks": {"contained_errors": dict(telemetry.errors)}}


# ---------------------------------------------------------------------------------------------
# driver

WORKERS = {"api": run_api, "scheduler": run_scheduler, "detokenizer": run_detokenizer}


def worker_main(args: argparse.Namespace) -> None:
    global COLD
    COLD = args.cold
    os.environ.pop("SGLANG_MMTRACE_TEST_RAISE", None)
    os.environ["SGLANG_MMTRACE"] = "1"
    # a real run's records complete when the remote stages arrive; keep a short grace anyway
    os.environ.setdefault("SGLANG_MMTRACE_GRACE_S", "0.2")
    gc.collect()
    t0 = time.perf_counter()
    out = WORKERS[args.worker](args)
    out["wall_s"] = round(time.perf_counter() - t0, 2)
    Path(args.out).write_text(json.dumps(out))


def fmt_row(proc: str, name: str, s: dict[str, Any]) -> str:
    ci = s["paired_diff_median_ci95_us"]
    return (
        f"| {proc} | {name} | {s['plain_median_us']:.2f} | {s['traced_median_us']:.2f} | "
        f"**{s['extra_median_us']:.2f}** | {s['extra_p90_us']:.2f} | {s['paired_diff_median_us']:.2f} [{ci[0]:.2f}, {ci[1]:.2f}] |"
    )


def table(result: dict[str, Any]) -> str:
    lines = [
        "| process | measurement | plain median µs | traced median µs | extra median µs | extra p90 µs | paired diff median µs [95% CI] |",
        "|---|---|---:|---:|---:|---:|---:|",
    ]
    for proc, body in result["processes"].items():
        for name, s in body["per_request"].items():
            lines.append(fmt_row(proc, f"per request: {name}", s))
        for name, s in body.get("per_request_to_handoff", {}).items():
            lines.append(fmt_row(proc, f"per request, up to the hand-off (TTFT path): {name}", s))
    for proc, body in result["processes"].items():
        for name, s in body["per_decode_step"].items():
            lines.append(fmt_row(proc, f"per step: {name}", s))
    for proc, body in result["processes"].items():
        for kind, arms in body.get("leave_out", {}).items():
            for name, s in arms.items():
                lines.append(fmt_row(proc, f"{kind}, up to the hand-off, without {name}", s))
    for proc, body in result["processes"].items():
        for name, s in body.get("switched_off", {}).items():
            lines.append(fmt_row(proc, f"switch off, hooks left in place, up to the hand-off: {name}", s))
        for name, s in body.get("after_flip", {}).items():
            lines.append(
                fmt_row(proc, f"right after a flip off and on, against unflipped, up to the hand-off: {name}", s)
            )
    marginals = [
        f"| {proc} | {kind} | {name} | **{s['marginal_median_us']:.2f}** "
        f"[{s['marginal_ci95_us'][0]:.2f}, {s['marginal_ci95_us'][1]:.2f}] |"
        for proc, body in result["processes"].items()
        for kind, arms in body.get("leave_out", {}).items()
        for name, s in arms.items()
        if "marginal_median_us" in s
    ]
    if marginals:
        lines += [
            "",
            "| process | kind | hook left out | marginal µs up to the hand-off, median [95% CI] |",
            "|---|---|---|---:|",
            *marginals,
        ]
    bg = [
        f"- {proc} background thread `{b['thread']}`: {b['cpu_us_per_traced_request']:.2f} µs CPU per traced request "
        f"(idle: {b['idle_cpu_us_per_s']:.0f} µs CPU per s)"
        for proc, body in result["processes"].items()
        if (b := body.get("background"))
    ]
    return "\n".join(lines + [""] + bg)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--reps", type=int, default=DEFAULT_REPS, help="timed requests per arm and request kind")
    ap.add_argument("--warmup", type=int, default=DEFAULT_WARMUP)
    ap.add_argument("--steps", type=int, default=DEFAULT_STEPS, help="output steps per API request")
    ap.add_argument(
        "--step-reps", type=int, default=DEFAULT_STEP_REPS, help=f"decode-step blocks ({STEP_BLOCK} steps each) per arm"
    )
    ap.add_argument("--batch-sizes", type=int, nargs="+", default=[1, 8, 64], help="rids per decode step")
    ap.add_argument("--processes", nargs="+", default=list(WORKERS), choices=list(WORKERS))
    ap.add_argument("--json", default="hotpath.json", help="where to write the result (default: %(default)s)")
    ap.add_argument("--cold", action="store_true", help="evict the CPU caches before every sample (see COLD_BYTES)")
    ap.add_argument(
        "--leave-out",
        action="store_true",
        help="api, scheduler: also time image and text requests up to the hand-off with each hook left out in "
        "turn, all arms interleaved (--reps samples each), and each hook's paired marginal cost",
    )
    ap.add_argument(
        "--switched-off",
        action="store_true",
        help="api, scheduler: also time requests with the hooks in place and the switch off, against plain",
    )
    ap.add_argument(
        "--after-flip",
        action="store_true",
        help="api, scheduler: also time requests right after the switch was flipped off and on, against unflipped",
    )
    ap.add_argument("--worker", choices=list(WORKERS), help=argparse.SUPPRESS)
    ap.add_argument("--out", help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.worker:
        worker_main(args)
        return 0

    info = machine()
    result: dict[str, Any] = {
        "benchmark": "hotpath",
        "machine": info,
        "config": {
            "reps": args.reps,
            "warmup": args.warmup,
            "steps_per_request": args.steps,
            "step_reps": args.step_reps,
            "step_block": STEP_BLOCK,
            "batch_sizes": args.batch_sizes,
            "cold": args.cold,
            "leave_out": args.leave_out,
            "switched_off": args.switched_off,
            "after_flip": args.after_flip,
        },
        "method": (
            "stand-ins of the hooked SGLang targets, wrapped with the real hook wrappers (registry.HOOKS[id].make(kind)) "
            "via patch.hooked; plain vs traced interleaved per repetition in random order; perf_counter_ns; "
            "extra = quantile(traced) - quantile(plain); each process kind in its own interpreter with the real "
            "Collector (api) or Outbox (scheduler, detokenizer) running"
        ),
        "processes": {},
    }
    for proc in args.processes:
        with tempfile.NamedTemporaryFile(suffix=".json", delete=False) as fh:
            out = fh.name
        cmd = [sys.executable, "-m", "benchmarks.hotpath", "--worker", proc, "--out", out]
        cmd += ["--reps", str(args.reps), "--warmup", str(args.warmup), "--steps", str(args.steps)]
        cmd += ["--step-reps", str(args.step_reps), "--batch-sizes", *map(str, args.batch_sizes)]
        cmd += ["--cold"] if args.cold else []
        cmd += ["--leave-out"] if args.leave_out and proc in ("api", "scheduler") else []
        cmd += ["--switched-off"] if args.switched_off and proc in ("api", "scheduler") else []
        cmd += ["--after-flip"] if args.after_flip and proc in ("api", "scheduler") else []
        print(f"[hotpath] {proc} ...", flush=True)
        subprocess.run(cmd, check=True, cwd=Path(__file__).resolve().parents[1])
        result["processes"][proc] = json.loads(Path(out).read_text())
        os.unlink(out)
    result["machine"]["loadavg_at_end"] = list(os.getloadavg())
    text = table(result)
    print(text)
    path = Path(args.json)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(result, indent=2) + "\n")
    print(f"[hotpath] wrote {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
