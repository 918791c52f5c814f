"""The stage catalogue: the single source of truth for stage names.

Hooks record stages by these names, sinks label spans/metrics/NVTX ranges with them, and the docs
and dashboards are generated from this table. ``docs/contract.md`` ("Stages") is the user-facing copy.
"""

from __future__ import annotations

from dataclasses import dataclass

API = "api"
SCHEDULER = "scheduler"
DETOKENIZER = "detokenizer"

# The stage names, one constant per catalogue entry, named after its stage (dots as underscores).
# Code names a stage by its constant, never by a string literal (tests/test_unit_stage_names.py), so
# a search for the constant finds every place that measures, files or reads the stage, and a misspelt
# name fails at import. A module-level constant costs the hot path a global load, as a literal a
# constant load: no per-call lookup.
REQUEST = "request"
HTTP_PARSE = "http.parse"
OPENAI_CONVERT = "openai.convert"
TOKENIZE = "tokenize"
MM_PROCESS = "mm.process"
MM_LOAD = "mm.load"
MM_DOWNLOAD = "mm.download"
MM_PREPROCESS_CACHE = "mm.preprocess_cache"
MM_DECODE = "mm.decode"
MM_RESIZE_NORMALIZE = "mm.resize_normalize"
MM_EXPAND = "mm.expand"
TRANSPORT_PREPARE = "transport.prepare"
DISPATCH = "dispatch"
SCHEDULER_INBOX_WAIT = "scheduler.inbox_wait"
SCHEDULER_ENCODER_WAIT = "scheduler.encoder_wait"
SCHEDULER_RECV = "scheduler.recv"
SCHEDULER_QUEUE = "scheduler.queue"
SCHEDULER_PREFIX_MATCH = "scheduler.prefix_match"
SCHEDULER_BATCH = "scheduler.batch"
MODEL_FORWARD = "model.forward"
MODEL_VISION_ENCODER = "model.vision_encoder"
MODEL_AUDIO_ENCODER = "model.audio_encoder"
MODEL_EMBED = "model.embed"
MODEL_PREFILL = "model.prefill"
MODEL_SAMPLE = "model.sample"
SCHEDULER_OVERLAP_WAIT = "scheduler.overlap_wait"
SCHEDULER_OUTPUT = "scheduler.output"
DETOKENIZE_INBOX_WAIT = "detokenize.inbox_wait"
DETOKENIZE = "detokenize"
RESPONSE_INBOX_WAIT = "response.inbox_wait"
RESPONSE_FIRST_CHUNK = "response.first_chunk"


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
    carried images, video or audio), ``visual`` (images or video: an audio clip's read has no seam of its
    own), ``media_new`` (and some item missed the preprocessing cache),
    ``encoder`` (an image or video whose embeddings were not proved a cache hit or in the radix
    prefix), ``audio_encoder`` (the same for an audio clip)."""
    stored_by: tuple[str, ...] = ()
    """The hooks (manifest hook ids) that take a time the stage is built from: around the call they
    wrap, or read from SGLang's own notes. Empty for a stage the join builds from other stages' ends."""
    emitted_by: tuple[str, ...] = ()
    """Where the stage is filed as an event: hook ids, or a module of this package (``join.collector``)
    that builds it from the stored times. Each one names the stage's constant in its code."""

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
        REQUEST,
        API,
        "root: request bytes arrived -> first streamed chunk written (server-side TTFT); offline Engine:"
        " generate call -> first output received",
        stored_by=("http_server.app", "engine.generate", "engine.async_generate", "tokenizer_manager.batch_output"),
        emitted_by=("join.collector",),
    ),
    Stage(
        HTTP_PARSE,
        API,
        "body read, JSON parse, validation",
        parent=REQUEST,
        stored_by=("http_server.app", "tokenizer_manager.init_req_state"),
        emitted_by=("join.collector",),
    ),
    Stage(
        OPENAI_CONVERT,
        API,
        "OpenAI request -> internal request, chat-template rendering",
        parent=REQUEST,
        stored_by=("tokenizer_manager.init_req_state",),
        emitted_by=("join.collector",),
    ),
    Stage(
        TOKENIZE,
        API,
        "TokenizerManager tokenization of the text (and, for VLMs, the processor)",
        parent=REQUEST,
        stored_by=("tokenizer_manager.tokenize",),
        emitted_by=("tokenizer_manager.tokenize",),
    ),
    Stage(
        MM_PROCESS,
        API,
        "the multimodal processor as a whole (process_mm_data_async)",
        parent=TOKENIZE,
        expected="media",
        stored_by=("mm_processor_generic.request",),
        emitted_by=("mm_processor_generic.request",),
    ),
    Stage(
        MM_LOAD,
        API,
        "per image or video: fetch or base64-decode, content hash (an audio clip's read is inside its mm.decode)",
        parent=MM_PROCESS,
        per_image=True,
        expected="visual",
        stored_by=(
            "mm_processor.load",
            "mm_processor_generic.fetch",
            "mm_processor_generic.load_decode",
            "mm_processor_generic.auto_load",
        ),
        emitted_by=("mm_processor.load", "mm_processor_generic.load_decode", "mm_processor_generic.auto_load"),
    ),
    Stage(
        MM_DOWNLOAD,
        API,
        "per image, video or audio clip given by http(s) URL: SGLang's download of it (download_remote_media;"
        " 0.5.17: get_image_bytes on a URL, images only); attrs bytes, modality",
        parent=MM_LOAD,
        per_image=True,
        extra=True,
        stored_by=("mm_processor_generic.download", "mm_processor_generic.fetch"),
        emitted_by=("mm_processor_generic.download", "mm_processor_generic.fetch"),
    ),
    Stage(
        MM_PREPROCESS_CACHE,
        API,
        "preprocessing-artifact cache lookup (attr result: hit, miss, off)",
        parent=MM_PROCESS,
        per_image=True,
        stored_by=("mm_processor.preprocess_cache",),
        emitted_by=("mm_processor.preprocess_cache",),
    ),
    Stage(
        MM_DECODE,
        API,
        "per image: PNG/JPEG decode",
        parent=MM_PROCESS,
        per_image=True,
        expected="media_new",
        stored_by=(
            "mm_processor.decode",
            "mm_processor_generic.load_decode",
            "mm_processor_generic.video_frames",
            "mm_processor_generic.video_frames_tensor",
            "mm_processor_generic.auto_load",
        ),
        emitted_by=(
            "mm_processor.decode",
            "mm_processor_generic.load_decode",
            "mm_processor_generic.video_frames",
            "mm_processor_generic.video_frames_tensor",
            "mm_processor_generic.auto_load",
        ),
    ),
    Stage(
        MM_RESIZE_NORMALIZE,
        API,
        "resize, rescale, normalize (GPU-timed when it runs on the GPU)",
        parent=MM_PROCESS,
        gpu_timed=True,
        per_image=True,
        expected="media_new",
        stored_by=(
            "mm_processor.resize_normalize",
            "mm_processor_generic.resize_normalize",
            "mm_processor_generic.internvl_tiles",
            "mm_processor_generic.auto_hf_processor",
        ),
        emitted_by=(
            "mm_processor.resize_normalize",
            "mm_processor_generic.resize_normalize",
            "mm_processor_generic.internvl_tiles",
            "mm_processor_generic.auto_hf_processor",
        ),
    ),
    Stage(
        MM_EXPAND,
        API,
        "placeholder expansion into visual positions, M-RoPE positions",
        parent=MM_PROCESS,
        expected="media",
        stored_by=(
            "mm_processor.expand",
            "mm_processor_generic.combine",
            "mm_processor_generic.combine_async",
            "mm_processor_generic.internvl_tiles",
            "mm_processor_generic.request",
            "mm_processor_generic.auto_items",
        ),
        emitted_by=(
            "mm_processor.expand",
            "mm_processor_generic.combine",
            "mm_processor_generic.request",
            "mm_processor_generic.auto_items",
        ),
    ),
    Stage(
        TRANSPORT_PREPARE,
        API,
        "feature hand-off preparation: shared memory (cpu), IPC handles (cuda_ipc)",
        parent=DISPATCH,
        stored_by=("transport.wrap_shm_features", "mm_processor_generic.cuda_ipc", "mm_processor_generic.combine"),
        emitted_by=("transport.wrap_shm_features", "mm_processor_generic.combine"),
    ),
    Stage(
        DISPATCH,
        API,
        "send to the scheduler",
        parent=REQUEST,
        stored_by=("tokenizer_manager.init_req_state",),
        emitted_by=("join.context",),
    ),
    Stage(
        SCHEDULER_INBOX_WAIT,
        SCHEDULER,
        "dispatched, waiting in the scheduler's socket while its loop is busy "
        "(joined: API send end -> scheduler receive start)",
        parent=REQUEST,
        extra=True,
        stored_by=(),
        emitted_by=("join.collector",),
    ),
    Stage(
        SCHEDULER_ENCODER_WAIT,
        SCHEDULER,
        "encoder disaggregation, a language-only server whose scheduler receives the embeddings "
        "(zmq_to_scheduler, mooncake): dispatched -> the scheduler took the request with its embeddings: "
        "the encoder server's work and the transfer, the scheduler's own inbox wait inside "
        "(joined: API send end -> scheduler receive start, in place of scheduler.inbox_wait)",
        parent=REQUEST,
        extra=True,
        stored_by=(),
        emitted_by=("join.collector",),
    ),
    Stage(
        SCHEDULER_RECV,
        SCHEDULER,
        "receive, deserialize, materialize features",
        parent=REQUEST,
        stored_by=("scheduler.recv_requests", "schedule_batch.match"),
        emitted_by=("batch_result.prefill",),
    ),
    Stage(
        SCHEDULER_QUEUE,
        SCHEDULER,
        "waiting until admitted to a prefill batch",
        parent=REQUEST,
        stored_by=("schedule_batch.match", "scheduler.run_batch"),
        emitted_by=("batch_result.prefill",),
    ),
    Stage(
        SCHEDULER_PREFIX_MATCH,
        SCHEDULER,
        "radix prefix match",
        parent=REQUEST,
        stored_by=("schedule_batch.match", "scheduler.run_batch"),
        emitted_by=("batch_result.prefill",),
    ),
    Stage(
        SCHEDULER_BATCH,
        SCHEDULER,
        "prefill batch formation: admission, KV allocation, input preparation",
        parent=REQUEST,
        batch=True,
        extra=True,
        stored_by=("schedule_batch.match", "scheduler.run_batch"),
        emitted_by=("batch_result.prefill",),
    ),
    Stage(
        MODEL_FORWARD,
        SCHEDULER,
        "the prefill forward of the batch holding the request, as the host sees it",
        parent=REQUEST,
        batch=True,
        extra=True,
        stored_by=("scheduler.run_batch",),
        emitted_by=("batch_result.prefill",),
    ),
    Stage(
        MODEL_VISION_ENCODER,
        SCHEDULER,
        "vision encoder forward (GPU-timed); attr modality (image, video)",
        parent=MODEL_FORWARD,
        gpu_timed=True,
        batch=True,
        expected="encoder",
        stored_by=(
            "mm_embedding.vision_encoder",
            "mm_embedding.video_encoder",
            "mm_embedding.llava_encoder",
            "mm_embedding.hf_image_encoder",
            "mm_embedding.hf_video_encoder",
        ),
        emitted_by=("batch_result.prefill",),
    ),
    Stage(
        MODEL_AUDIO_ENCODER,
        SCHEDULER,
        "audio encoder forward (GPU-timed; the model's get_audio_feature); attr modality (audio)",
        parent=MODEL_FORWARD,
        gpu_timed=True,
        batch=True,
        extra=True,
        expected="audio_encoder",
        stored_by=("mm_embedding.audio_encoder", "mm_embedding.hf_audio_encoder"),
        emitted_by=("batch_result.prefill",),
    ),
    Stage(
        MODEL_EMBED,
        SCHEDULER,
        "visual embedding injection into the LM input embeddings",
        parent=MODEL_FORWARD,
        gpu_timed=True,
        batch=True,
        stored_by=("mm_embedding.prepare", "mm_embedding_legacy.embed"),
        emitted_by=("batch_result.prefill",),
    ),
    Stage(
        MODEL_PREFILL,
        SCHEDULER,
        "LM prefill forward (GPU-timed)",
        parent=MODEL_FORWARD,
        gpu_timed=True,
        batch=True,
        stored_by=("model_runner.forward",),
        emitted_by=("batch_result.prefill",),
    ),
    Stage(
        MODEL_SAMPLE,
        SCHEDULER,
        "first-token sampling",
        parent=MODEL_FORWARD,
        gpu_timed=True,
        batch=True,
        stored_by=("model_runner.sample",),
        emitted_by=("batch_result.prefill",),
    ),
    Stage(
        SCHEDULER_OVERLAP_WAIT,
        SCHEDULER,
        "forward done, result waiting while the overlap scheduler runs the next batch",
        parent=REQUEST,
        batch=True,
        extra=True,
        stored_by=("scheduler.run_batch", "model_runner.sample", "batch_result.prefill"),
        emitted_by=("batch_result.prefill",),
    ),
    Stage(
        SCHEDULER_OUTPUT,
        SCHEDULER,
        "result processing and hand-off to the detokenizer",
        parent=REQUEST,
        batch=True,
        stored_by=("batch_result.prefill", "batch_result.stream_output"),
        emitted_by=("batch_result.prefill",),
    ),
    Stage(
        DETOKENIZE_INBOX_WAIT,
        DETOKENIZER,
        "first token handed off, waiting for the detokenizer's loop (joined: scheduler hand-off end -> detokenize start)",
        parent=REQUEST,
        extra=True,
        stored_by=(),
        emitted_by=("join.collector",),
    ),
    Stage(
        DETOKENIZE,
        DETOKENIZER,
        "first output detokenized",
        parent=REQUEST,
        batch=True,
        stored_by=("detokenizer.handle_batch",),
        emitted_by=("detokenizer.handle_batch",),
    ),
    Stage(
        RESPONSE_INBOX_WAIT,
        API,
        "detokenized, waiting for the API process's output loop (joined: detokenize end -> output received)",
        parent=REQUEST,
        extra=True,
        stored_by=(),
        emitted_by=("join.collector",),
    ),
    Stage(
        RESPONSE_FIRST_CHUNK,
        API,
        "first output received -> first chunk written to the socket",
        parent=REQUEST,
        stored_by=("http_server.app", "tokenizer_manager.batch_output"),
        emitted_by=("join.collector",),
    ),
)

STAGES: dict[str, Stage] = {s.name: s for s in _CATALOGUE}
ROOT = REQUEST
ORDER: dict[str, int] = {s.name: i for i, s in enumerate(_CATALOGUE)}


def unobserved(
    present: set[str], media: dict[str, int], preprocess: str | None, embedding: dict[str, str | None]
) -> list[str]:
    """The stages a finished request should have had and did not get (``Stage.expected``), in catalogue
    order: ``media`` items per modality in the request, the record's preprocessing outcome and its
    embedding outcome per modality (``join.outcomes``: ``None`` where unproved, which expects the
    encoder: a run that was not seen is not a run that was not needed)."""
    carried = {m for m, n in media.items() if n}

    def encodes(modalities: set[str]) -> bool:
        return any(embedding.get(m) not in ("hit", "off") for m in carried & modalities)

    when = {
        "media": bool(carried),
        "visual": bool(carried & {"image", "video"}),
        "media_new": bool(carried) and preprocess != "hit",
        "encoder": encodes({"image", "video"}),
        "audio_encoder": encodes({"audio"}),
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
