"""The request plans of the experiments: what is sent, in which (interleaved) order, under which
variant. Each plan starts with warm-up requests (excluded from the output) that also prime what
the measured requests expect to find cached (the repeated image).

Images are new per run: every one is labelled with the run's nonce, so "new" stays new on a
long-lived server that served earlier runs; questions start with a random word so that a
question-first prompt shares only the chat template with earlier prompts.
"""

from __future__ import annotations

import random
import zlib
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from ..harness import data_url, image_message, make_image
from ..harness.images import ImageFormat
from ..switch import PARTS

QUESTION = "What is in this image?"
STEMS = (
    "what colour dominates this picture?",
    "which shape is the largest?",
    "how many shapes can you see?",
    "is there any text in the image?",
    "describe the picture in five words.",
    "where is the brightest region?",
    "what does the background look like?",
    "name one object you can see.",
)
# Per-target experiments run against any one server (a --url, or each --launch configuration in
# turn); the switch experiments among them flip the plugin's runtime switch of that one instance.
# The rest launch their own server configurations.
SWITCHED = ("overhead", "ablation", "throughput")
PER_TARGET = ("new-vs-repeat", "order", "resolution", "concurrency", *SWITCHED)
LAUNCHED = ("caches", "transport", "overhead-crossover")
ALL = (*PER_TARGET, *LAUNCHED)
CONCURRENCY_DEFAULT = (1, 4, 16, 64)
THROUGHPUT_CLIENTS = 64
# Rounds (rounds per level, rounds per launch, ...) when --n is not given.
DEFAULT_N = {"ablation": 60, "overhead-crossover": 50, "resolution": 10}
# overhead: rounds per kind when --n is not given. On a GPU: the run length its targets are judged at
# (``overhead.TARGET_ROUNDS``). The CPU server's TTFT moves by far more than those targets from one
# request to the next, so no affordable run resolves them there: its run checks the method and the
# A/A, and fewer rounds keep its much slower run short.
OVERHEAD_ROUNDS_GPU = 400
OVERHEAD_ROUNDS_CPU = 100
# resolution: the images' long edges (px) and aspect ratios (width:height) when not given.
RESOLUTION_SIZES = (256, 384, 512, 768, 1024, 1536, 2048)
RESOLUTION_ASPECTS = ("1:1", "16:9", "9:16")
RESOLUTION_KINDS = ("new", "repeated")
# The overhead experiments' images: 640x480 JPEG; resolution: JPEG (a large PNG takes several times
# as long to encode as a JPEG, and photos arrive as JPEG); the others: --size, 512x512 PNG.
OVERHEAD_SIZE = (640, 480)


@dataclass
class Options:
    """The bench's knobs; ``None`` means the experiment's own default (``n_for``, ``size_for``, ...)."""

    n: int | None = None
    questions: int = 100
    size: tuple[int, int] | None = None
    warmup: int = 2
    max_tokens: int | None = None
    seed: int = 0
    concurrency: tuple[int, ...] | None = None
    sizes: tuple[int, ...] | None = None  # resolution: long edges in px
    aspects: tuple[str, ...] | None = None  # resolution: "W:H" ratios
    timeout: float = 120.0
    segment_s: float = 25.0  # throughput: seconds per segment
    segments: int = 3  # throughput: segments per arm
    settle_s: float = 2.0  # throughput: excluded after each flip
    on_parts: tuple[str, ...] = PARTS  # throughput: the parts its 'on' segments enable (bisecting its cost)
    gap_s: float = 0.1  # overhead / ablation: idle gap between a response's end and the next request
    keep_records: bool = False  # overhead / ablation: after a request with records on, wait until its record is built
    control: bool = True  # overhead: also the same-instance A/A control arm (a second 'off' request per round and kind)
    lead_in: bool = False  # overhead: an untimed request of the same arm and kind before each timed one (paired_plan)
    peer: bool = (
        False  # overhead: also SGLang's own tracing as an arm (plugin off, its trace level flipped per request)
    )
    between: bool = False  # overhead: also an arm served between tracing windows (the switch handed to closed windows)
    ablation_parts: tuple[str, ...] = PARTS  # ablation levels in order; "a+b" adds a group of parts at one level
    launches: int = 2  # overhead-crossover: launches per orientation (A/B unless ab is False, A/A unless aa is)
    ab: bool = True  # overhead-crossover: the A/B launches (one server SGLANG_MMTRACE=1, one =0)
    aa: bool = True  # overhead-crossover: also the A/A control (both servers SGLANG_MMTRACE=0)
    deadline: float | None = None  # wall-clock epoch seconds: stop sending new requests after it

    @property
    def nonce(self) -> str:
        return f"{self.seed & 0xFFFFFFFF:08x}"

    def n_for(self, experiment: str, gpu: bool = True) -> int:
        """``n`` if given, else the experiment's default (``overhead``: by whether the server is on a ``gpu``)."""
        if self.n is not None:
            return self.n
        if experiment == "overhead":
            return OVERHEAD_ROUNDS_GPU if gpu else OVERHEAD_ROUNDS_CPU
        return DEFAULT_N.get(experiment, 20)

    def size_for(self, experiment: str) -> tuple[int, int]:
        if self.size is not None:
            return self.size
        return OVERHEAD_SIZE if experiment in (*SWITCHED, "overhead-crossover") else (512, 512)

    def max_tokens_for(self, experiment: str) -> int:
        if self.max_tokens is not None:
            return self.max_tokens
        return 256 if experiment == "throughput" else 8

    def concurrency_levels(self) -> tuple[int, ...]:
        return self.concurrency or CONCURRENCY_DEFAULT

    def resolution_shapes(self) -> list[tuple[int, int, str]]:
        """(width, height, aspect) per long edge and aspect ratio, in order of pixels."""
        shapes = {
            image_shape(edge, aspect) + (aspect,)
            for edge in self.sizes or RESOLUTION_SIZES
            for aspect in self.aspects or RESOLUTION_ASPECTS
        }
        return sorted(shapes, key=lambda s: (s[0] * s[1], s[0]))

    def throughput_clients(self) -> int:
        """``--concurrency`` if given (its largest value), else 64."""
        return max(self.concurrency) if self.concurrency else THROUGHPUT_CLIENTS


@dataclass
class Planned:
    """One request of a plan; ``variants`` of one ``group`` are compared (index 0 = baseline)."""

    experiment: str
    variant: str
    variant_index: int
    group: str
    messages: list[dict[str, Any]] | Callable[[], list[dict[str, Any]]]
    """The chat messages, or what makes them when the request is about to be sent: a plan of many
    rounds of new images would otherwise encode every image before its first request, and a run that
    a deadline ends early would have paid for them all (minutes of a GPU call's time)."""
    round: int
    warmup: bool = False
    extra: dict[str, Any] = field(default_factory=dict)

    def chat(self) -> list[dict[str, Any]]:
        """The messages to send (made now if they were planned as a maker)."""
        return self.messages() if callable(self.messages) else self.messages


class Images:
    """Distinct labelled images for one plan, from one seed stream."""

    def __init__(self, opts: Options, tag: str) -> None:
        self.opts, self.tag, self.i = opts, tag, 0

    def new(self) -> str:
        w, h = self.opts.size or (512, 512)
        return data_url(self.encoded(w, h))

    def encoded(self, width: int, height: int, fmt: ImageFormat = "PNG") -> bytes:
        """The next distinct image of this stream at this size, encoded as ``fmt``."""
        self.i += 1
        seed = (self.opts.seed * 7919 + zlib.crc32(self.tag.encode()) % 100_003 + self.i) & 0x7FFFFFFF
        return make_image(width, height, seed, fmt=fmt, label=f"{self.opts.nonce} {self.tag} {self.i}")


def image_shape(long_edge: int, aspect: str) -> tuple[int, int]:
    """``aspect`` "W:H" at ``long_edge`` px on its longer side (the shorter side rounded, at least 1 px)."""
    w, _, h = aspect.partition(":")
    rw, rh = float(w), float(h or w)
    if rw <= 0 or rh <= 0 or long_edge <= 0:
        raise ValueError(f"bad image shape: long edge {long_edge}, aspect {aspect!r}")
    if rw >= rh:
        return long_edge, max(1, round(long_edge * rh / rw))
    return max(1, round(long_edge * rw / rh)), long_edge


def question(rng: random.Random, i: int) -> str:
    """A question whose first word is random, so question-first prompts share only the template."""
    return f"{rng.getrandbits(24):06x} {STEMS[i % len(STEMS)]}"


def new_vs_repeat(opts: Options) -> list[Planned]:
    """N distinct images vs one image repeated (same question, image first), interleaved."""
    rng = random.Random(opts.seed + 1)
    imgs = Images(opts, "nvr")
    same = imgs.new()
    exp, variants = "new-vs-repeat", ("new image", "repeated image")
    plan = [Planned(exp, variants[1], 1, "image", [image_message(QUESTION, [same])], -1, warmup=True)]
    plan += [
        Planned(exp, variants[0], 0, "image", [image_message(QUESTION, [imgs.new()])], -1, warmup=True)
        for _ in range(opts.warmup)
    ]
    for r in range(opts.n_for(exp)):
        pair = [
            Planned(exp, variants[0], 0, "image", [image_message(QUESTION, [imgs.new()])], r),
            Planned(exp, variants[1], 1, "image", [image_message(QUESTION, [same])], r),
        ]
        rng.shuffle(pair)
        plan += pair
    return plan


def order(opts: Options) -> list[Planned]:
    """One image, ``questions`` different questions, each asked image-first and question-first."""
    rng = random.Random(opts.seed + 2)
    img = Images(opts, "order").new()
    exp, variants = "order", ("image first", "question first")
    plan = [
        Planned(exp, variants[i % 2], i % 2, "order", [image_message(question(rng, i), [img], i % 2 == 0)], -1, True)
        for i in range(max(1, opts.warmup))
    ]
    for r in range(opts.questions):
        q = question(rng, r)
        pair = [
            Planned(exp, variants[0], 0, "order", [image_message(q, [img], image_first=True)], r),
            Planned(exp, variants[1], 1, "order", [image_message(q, [img], image_first=False)], r),
        ]
        rng.shuffle(pair)
        plan += pair
    return plan


def resolution(opts: Options) -> list[Planned]:
    """Per image shape (long edge x aspect ratio): a new image and one repeated image (same question,
    image first), every round all shapes and both kinds in a shuffled order, so that the machine's
    drift falls on every size alike. The warm-up sends each repeated image once (the repeats then
    find it cached) and ``warmup`` new images of the smallest shape. ``extra`` carries the shape
    and the encoded image's bytes, so the sizes are known without the server's records."""
    rng = random.Random(opts.seed + 4)
    exp = "resolution"
    imgs = Images(opts, "res")

    def image(w: int, h: int) -> tuple[str, int]:
        data = imgs.encoded(w, h, "JPEG")
        return data_url(data, "JPEG"), len(data)

    shapes = opts.resolution_shapes()
    repeated = {(w, h): image(w, h) for w, h, _ in shapes}

    def req(w: int, h: int, aspect: str, kind: str, r: int, warm: bool = False) -> Planned:
        url, size = repeated[(w, h)] if kind == "repeated" else image(w, h)
        extra = {"width": w, "height": h, "aspect": aspect, "kind": kind, "image_bytes": size}
        i = order[(w, h)] * len(RESOLUTION_KINDS) + RESOLUTION_KINDS.index(kind)  # tables list by pixels
        return Planned(exp, f"{w}x{h} {kind}", i, f"{w}x{h}", [image_message(QUESTION, [url])], r, warm, extra)

    order = {(w, h): i for i, (w, h, _) in enumerate(shapes)}
    w0, h0, a0 = shapes[0]
    plan = [req(w, h, a, "repeated", -1, True) for w, h, a in shapes]
    plan += [req(w0, h0, a0, "new", -1, True) for _ in range(opts.warmup)]
    for r in range(opts.n_for(exp)):
        cells = [(w, h, a, kind) for w, h, a in shapes for kind in RESOLUTION_KINDS]
        rng.shuffle(cells)
        plan += [req(w, h, a, kind, r) for w, h, a, kind in cells]
    return plan


def concurrency_levels(opts: Options) -> tuple[list[Planned], list[tuple[int, list[Planned]]]]:
    """Warm-up, then per level ``c``: ``max(n, c)`` requests, each with a new image."""
    imgs = Images(opts, "conc")
    exp = "concurrency"
    warm = [
        Planned(exp, "warm-up", 0, exp, [image_message(QUESTION, [imgs.new()])], -1, True) for _ in range(opts.warmup)
    ]
    levels = []
    for idx, c in enumerate(opts.concurrency_levels()):
        reqs = [
            Planned(exp, f"{c} clients", idx, exp, [image_message(QUESTION, [imgs.new()])], r, extra={"concurrency": c})
            for r in range(max(opts.n_for(exp), c))
        ]
        levels.append((c, reqs))
    return warm, levels


CACHE_KINDS = ("new image", "same image again", "same image, new question first")


def cache_requests(opts: Options, exp: str, config_label: str, config_index: int) -> list[Planned]:
    """The same request set for every server configuration: a new image; a repeated image
    (radix prefix hit when the radix cache is on); the repeated image after a new question
    (prefix miss: the preprocess and embedding caches are what can save work)."""
    rng = random.Random(opts.seed + 3)  # the same questions and order under every configuration
    imgs = Images(opts, f"{exp}{config_index}")
    same = imgs.new()

    def req(kind: str, r: int, warm: bool = False) -> Planned:
        if kind == CACHE_KINDS[0]:
            msg = image_message(QUESTION, [imgs.new()])
        elif kind == CACHE_KINDS[1]:
            msg = image_message(QUESTION, [same])
        else:
            msg = image_message(question(rng, r), [same], image_first=False)
        return Planned(
            exp, f"{config_label}: {kind}", config_index, kind, [msg], r, warm, extra={"config": config_label}
        )

    plan = [req(CACHE_KINDS[1], -1, True)] + [req(CACHE_KINDS[0], -1, True) for _ in range(opts.warmup)]
    for r in range(opts.n_for(exp)):
        kinds = list(CACHE_KINDS)
        rng.shuffle(kinds)
        plan += [req(k, r) for k in kinds]
    return plan
