"""The stage catalogue: the single source of truth for stage names.

Hooks record stages by these names, sinks label spans/metrics/NVTX ranges with them, and the docs
and dashboards are generated from this table. ``docs/contract.md`` ("Stages") is the user-facing copy.
"""

from __future__ import annotations

from dataclasses import dataclass

API = "api"
SCHEDULER = "scheduler"
DETOKENIZER = "detokenizer"


@dataclass(frozen=True, slots=True)
class Stage:
    name: str
    process: str
    covers: str
    parent: str | None = None
    gpu_timed: bool = False
    per_image: bool = False
    batch: bool = False
    extra: bool = False
    expected: str | None = None
    """When a record must have this stage, else it lists it as ``unobserved``: ``media`` (the request
    carried images, video or audio), ``media_new`` (and some item missed the preprocessing cache),
    ``encoder`` (and its embeddings were neither a cache hit nor in the radix prefix)."""

    @property
    def group(self) -> str:
        """NVTX colour group: the name's prefix (``mm``, ``transport``, ``scheduler``, ``model``...)."""
        return self.name.split(".", 1)[0] if "." in self.name else self.name

    @property
    def depth(self) -> int:
        depth, parent = 0, self.parent
        while parent is not None:
            depth += 1
            parent = STAGES[parent].parent
        return depth


_CATALOGUE: tuple[Stage, ...] = (
    Stage(
        "request",
        API,
        "root: request bytes arrived -> first streamed chunk written (server-side TTFT); offline Engine:"
        " generate call -> first output received",
    ),
    Stage("http.parse", API, "body read, JSON parse, validation", parent="request"),
    Stage("openai.convert", API, "OpenAI request -> internal request, chat-template rendering", parent="request"),
    Stage(
        "tokenize", API, "TokenizerManager tokenization of the text (and, for VLMs, the processor)", parent="request"
    ),
    Stage(
        "mm.process",
        API,
        "the multimodal processor as a whole (process_mm_data_async)",
        parent="tokenize",
        expected="media",
    ),
    Stage(
        "mm.load",
        API,
        "per image: fetch or base64-decode, content hash",
        parent="mm.process",
        per_image=True,
        expected="media",
    ),
    Stage(
        "mm.preprocess_cache",
        API,
        "preprocessing-artifact cache lookup (attr result: hit, miss, off)",
        parent="mm.process",
        per_image=True,
    ),
    Stage(
        "mm.decode",
        API,
        "per image: PNG/JPEG decode",
        parent="mm.process",
        per_image=True,
        expected="media_new",
    ),
    Stage(
        "mm.resize_normalize",
        API,
        "resize, rescale, normalize (GPU-timed when it runs on the GPU)",
        parent="mm.process",
        gpu_timed=True,
        per_image=True,
        expected="media_new",
    ),
    Stage(
        "mm.expand",
        API,
        "placeholder expansion into visual positions, M-RoPE positions",
        parent="mm.process",
        expected="media",
    ),
    Stage(
        "transport.prepare",
        API,
        "feature hand-off preparation: shared memory (cpu), IPC handles (cuda_ipc)",
        parent="dispatch",
    ),
    Stage("dispatch", API, "send to the scheduler", parent="request"),
    Stage(
        "scheduler.inbox_wait",
        SCHEDULER,
        "dispatched, waiting in the scheduler's socket while its loop is busy "
        "(joined: API send end -> scheduler receive start)",
        parent="request",
        extra=True,
    ),
    Stage("scheduler.recv", SCHEDULER, "receive, deserialize, materialize features", parent="request"),
    Stage("scheduler.queue", SCHEDULER, "waiting until admitted to a prefill batch", parent="request"),
    Stage("scheduler.prefix_match", SCHEDULER, "radix prefix match", parent="request"),
    Stage(
        "scheduler.batch",
        SCHEDULER,
        "prefill batch formation: admission, KV allocation, input preparation",
        parent="request",
        batch=True,
        extra=True,
    ),
    Stage(
        "model.forward",
        SCHEDULER,
        "the prefill forward of the batch holding the request, as the host sees it",
        parent="request",
        batch=True,
        extra=True,
    ),
    Stage(
        "model.vision_encoder",
        SCHEDULER,
        "vision encoder forward (GPU-timed); attr modality (image, video)",
        parent="model.forward",
        gpu_timed=True,
        batch=True,
        expected="encoder",
    ),
    Stage(
        "model.embed",
        SCHEDULER,
        "visual embedding injection into the LM input embeddings",
        parent="model.forward",
        gpu_timed=True,
        batch=True,
    ),
    Stage(
        "model.prefill", SCHEDULER, "LM prefill forward (GPU-timed)", parent="model.forward", gpu_timed=True, batch=True
    ),
    Stage("model.sample", SCHEDULER, "first-token sampling", parent="model.forward", gpu_timed=True, batch=True),
    Stage(
        "scheduler.overlap_wait",
        SCHEDULER,
        "forward done, result waiting while the overlap scheduler runs the next batch",
        parent="request",
        batch=True,
        extra=True,
    ),
    Stage(
        "scheduler.output", SCHEDULER, "result processing and hand-off to the detokenizer", parent="request", batch=True
    ),
    Stage(
        "detokenize.inbox_wait",
        DETOKENIZER,
        "first token handed off, waiting for the detokenizer's loop (joined: scheduler hand-off end -> detokenize start)",
        parent="request",
        extra=True,
    ),
    Stage("detokenize", DETOKENIZER, "first output detokenized", parent="request", batch=True),
    Stage(
        "response.inbox_wait",
        API,
        "detokenized, waiting for the API process's output loop (joined: detokenize end -> output received)",
        parent="request",
        extra=True,
    ),
    Stage("response.first_chunk", API, "first output received -> first chunk written to the socket", parent="request"),
)

STAGES: dict[str, Stage] = {s.name: s for s in _CATALOGUE}
ROOT = "request"
ORDER: dict[str, int] = {s.name: i for i, s in enumerate(_CATALOGUE)}


def unobserved(present: set[str], media: int, preprocess: str, embedding: str | None) -> list[str]:
    """The stages a finished request should have had and did not get (``Stage.expected``), in catalogue
    order: ``media`` items in the request, the record's preprocessing and embedding-cache outcomes."""
    when = {
        "media": media > 0,
        "media_new": media > 0 and preprocess != "hit",
        "encoder": media > 0 and embedding != "hit",
    }
    return [s.name for s in _CATALOGUE if s.expected is not None and when[s.expected] and s.name not in present]


def contract_stage_names() -> list[str]:
    """Every stage, in the contract table's order (extras included: the contract marks them)."""
    return [s.name for s in _CATALOGUE]


def core_stage_names() -> list[str]:
    """The stages the contract does not mark *(extra)*: the ones every run must show somewhere."""
    return [s.name for s in _CATALOGUE if not s.extra]


def _display_order() -> dict[str, int]:
    """Parents before their children (the catalogue keeps the contract's order instead)."""
    children: dict[str | None, list[str]] = {}
    for s in _CATALOGUE:
        children.setdefault(s.parent, []).append(s.name)
    out: list[str] = []

    def walk(name: str) -> None:
        out.append(name)
        for child in children.get(name, ()):
            walk(child)

    for root in children.get(None, ()):
        walk(root)
    return {name: i for i, name in enumerate(out)}


DISPLAY_ORDER: dict[str, int] = _display_order()
