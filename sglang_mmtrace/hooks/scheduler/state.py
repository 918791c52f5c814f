"""Scheduler-process state: per-request timestamps on ``Req`` and the current prefill forward.

Per-request state lives on the ``Req`` object (``req._mmtrace``), so it dies with the request.
The forward context is shared by the traces of its requests until its result is processed, where GPU
events are read: ``copy_done`` has been synchronized there, so reading them adds no host sync. It
holds those traces, never the ``Req`` objects: a ``Req -> trace -> forward -> Req`` cycle would keep a
request aborted mid-prefill (and its image tensors) alive until Python's cyclic GC ran.
"""

from __future__ import annotations

import time
from typing import Any

from ... import config, runtime, switch
from .. import cuda_marks

now = time.perf_counter
_ship = switch.gate("ship")
_cuda = switch.gate("cuda_events")


class ReqTrace:
    """One request's scheduler timestamps. Before the first token's hand-off the hooks only store
    times and the few values that change later; the events are built after it (``batch_result``)."""

    __slots__ = (
        "rid",
        "t_recv",
        "t_enqueue",
        "t_match0",
        "t_match1",
        "admitted",
        "admission",
        "first_token",
        "fwd",
        "fwd_next",
        "vit_skipped",
    )

    def __init__(self, t_recv: float, t_enqueue: float, rid: str) -> None:
        self.rid = rid
        self.t_recv = t_recv
        self.t_enqueue = t_enqueue
        self.t_match0: float | None = None
        self.t_match1: float | None = None
        self.admitted = False
        self.admission: tuple[int, int] | None = None
        """(cached tokens, prefix length) as read at admission, until its ``scheduler.queue`` and
        ``scheduler.prefix_match`` events are built (the match's times are ``t_match0``/``t_match1``)."""
        self.first_token = False
        self.fwd: FwdCtx | None = None  # the oldest prefill forward whose result is not processed yet
        self.fwd_next: FwdCtx | None = None
        """A chunked prefill's next chunk, launched before the last chunk's result was processed (the
        overlap scheduler): results come in launch order, so it becomes ``fwd`` when that one's does."""
        self.vit_skipped = 0  # images whose encoder run the radix prefix made unnecessary


class Clock:
    """Host timestamps, or CUDA event marks on the current stream when the forward runs on a GPU.

    Each CUDA call costs the scheduler thread's CPU, the first after the GPU idled the most, and sits
    on the request's way to its first token, so a forward makes as few as its stages need (see
    docs/design/hot-path.md). Marks are placed on the host timeline by their GPU offset
    from a reference mark (``cuda_marks.Reference``). A forward that finds its device's reference
    recent (``Marks.reference``) adopts it, and its start (``start``) is then the host time at its
    launch, not a mark: only the stage ends cost CUDA calls. Otherwise its first mark becomes the
    device's reference, read with the host time right after it (the GPU is idle when a forward
    launches on an idle server). No mark of the forward can have run before its launch, which keeps an
    adopted reference in check (``Reference.host``). ``mark_on`` lets a stage that starts where the
    last one ended share its mark.
    """

    __slots__ = ("marks", "ref", "t_start", "first", "last", "fwd_end", "_host")

    def __init__(self, t_launch: float) -> None:
        self.marks: cuda_marks.Marks | None = None
        self.ref: cuda_marks.Reference | None = None
        self.t_start = t_launch
        """Before any GPU work of the forward: ``run_batch``'s start, then the forward's (``start``)."""
        self.first: int | None = None
        """This forward's first CUDA mark."""
        self.last: int | float | None = None
        """The last mark, until ``run_batch`` returns (``mark_on``)."""
        self.fwd_end: int | float | None = None
        """The end mark of the forward's first model call (``after_forward``)."""
        self._host: dict[int, float] | None = None
        # ``absent``: the CPU server's forwards ask ``device_marks`` no more.
        if _cuda.on and not cuda_marks.absent() and config.get().gpu_timing != "0":
            marks = self.marks = cuda_marks.device_marks()
            if marks is not None:
                self.ref = marks.reference(t_launch)

    def start(self) -> int | float:
        """The forward's start: the host time now when it adopted a reference, else its first mark."""
        if self.ref is not None:
            self.last = t = self.t_start = now()
            return t
        return self.mark()

    def mark(self) -> int | float:
        marks = self.marks
        if marks is not None:
            if self.ref is None:  # the forward's first mark, made the device's reference
                ref = self.ref = marks.mark_reference(now)
                m = ref.seq if ref is not None else None
            else:
                m = marks.mark()
            if m is not None:
                if self.first is None:
                    self.first = m
                self.last = m
                return m
            if self.first is None:
                # no mark of its own (graph capture, a failed call): the forward is host-timed
                self.marks = self.ref = None
        self.last = t = now()
        return t

    def mark_on(self, prev: int | float | None) -> int | float:
        """``prev`` again when it is still the last mark (no other stage marked since, and the forward
        has not returned): a stage that starts where ``prev``'s ended, with no GPU work launched between
        them, needs no mark of its own. A new mark otherwise."""
        return prev if prev is not None and prev is self.last else self.mark()

    def after_forward(self) -> int | float:
        """Sampling right after the forward starts on the forward's end mark (``mark_on``): SGLang
        launches nothing on the GPU between the two, so a second event there would mark the same point."""
        return self.mark_on(self.fwd_end)

    def host(self, mark: int | float) -> float:
        """A mark on the host timeline (CUDA marks: from the reference, read once each; the forward's
        first mark is read first, so that a move of the reference it causes applies to all of them)."""
        if isinstance(mark, float):
            return mark
        known = self._host
        if known is None:
            known = self._host = {}
            if self.first is not None:
                known[self.first] = self._read(self.first)
        t = known.get(mark)
        if t is None:
            t = known[mark] = self._read(mark)
        return t

    def _read(self, mark: int) -> float:
        ref = self.ref
        assert ref is not None
        t = ref.host(mark, self.t_start)
        if isinstance(t, str):
            raise ValueError(f"CUDA mark {t}")  # contained and counted by the hook's guard
        return t

    @property
    def name(self) -> str:
        return "cuda" if self.marks is not None else "host"


class FwdCtx:
    """What the hooks inside one prefill forward measured."""

    __slots__ = (
        "rids",
        "traces",
        "t0",
        "t1",
        "clock",
        "fwd",
        "sample",
        "t_sample_end",
        "embed",
        "vit",
        "needs_embed",
        "hash_to_rids",
        "lookups",
        "batch_size",
    )

    def __init__(self, traces: list[ReqTrace], t0: float, batch_size: int) -> None:
        self.traces = traces  # the requests' traces, not the Req objects (see the module docstring)
        self.batch_size = batch_size
        self.rids = tuple([tr.rid for tr in traces])  # a comprehension runs inline, a generator in a frame
        self.t0 = t0
        self.t1 = t0
        self.clock = Clock(t0)
        self.fwd: tuple[Any, Any] | None = None
        self.sample: tuple[Any, Any] | None = None
        self.t_sample_end: float | None = None  # host time; sampling may run after run_batch (overlap)
        self.embed: tuple[Any, Any] | None = None
        self.vit: list[tuple[Any, Any, list[int], str]] = []  # (start, end mark, item hashes, modality)
        self.needs_embed: dict[
            str, list[tuple[Any, str]]
        ] = {}  # rid -> (hash, modality) of its items overlapping this extend
        self.hash_to_rids: dict[int, list[str]] = {}
        self.lookups: dict[Any, bool] = {}  # item hash -> whether its first embedding-cache lookup found an entry


current: FwdCtx | None = None
"""The last prefill forward launched on the scheduler thread; reset by every ``run_batch``.

It outlives ``run_batch`` because the overlap scheduler samples after ``run_batch`` returns."""

last_recv_start = 0.0
last_stream_end = 0.0
"""When the scheduler last finished handing outputs to the detokenizer (``stream_output``)."""


def emit(rids: Any, stage: str, t0: float, t1: float, clock: str = "host", attrs: dict[str, Any] | None = None) -> None:
    box = runtime.outbox
    if box is not None and _ship.on:
        box.add(rids, stage, t0, t1, clock, attrs)


ENCODER_HOOKS: dict[str, str] = {
    "mm_embedding.vision_encoder": "image",
    "mm_embedding.video_encoder": "video",
    "mm_embedding.audio_encoder": "audio",
    "mm_embedding.llava_encoder": "image",
    "mm_embedding.hf_image_encoder": "image",
    "mm_embedding.hf_video_encoder": "video",
    "mm_embedding.hf_audio_encoder": "audio",
}
"""The hooks that see every call of the served model's embedder of a modality (applied late, on its
class; the embedder ``embed_mm_inputs`` resolves as ``get_<modality>_feature``)."""


def encoded_modalities() -> frozenset[str]:
    """The modalities whose encoder calls this process sees: only for those does a lookup that found an
    entry prove a hit (a discarded entry would be encoded again, and that call would be seen)."""
    return frozenset(ENCODER_HOOKS[a.hook_id] for a in runtime.applied if a.hook_id in ENCODER_HOOKS)
