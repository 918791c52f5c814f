"""TokenizerManager (api process): rid birth, tokenization, dispatch and the first output back."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

from ... import config, runtime, telemetry
from ...join.context import LIVE, ApiTrace, current_call, current_http, current_trace
from ...join.outcomes import MODALITIES
from ...stages import DISPATCH, TOKENIZE
from ..base import HookSpec, arg, before, error_class, interval, now, ranged


def _init_exit(st, t0, t1, instance, args, kwargs, result, exc) -> None:
    http = current_http.get()
    call = current_call.get() if http is None else None  # the offline Engine: its generate call
    owner = http or call
    if owner is None or exc is not None:
        return  # neither an HTTP request nor an Engine call (e.g. a streamed Engine request): untraced
    obj = arg(args, kwargs, 0, "obj")
    if http is not None and http.t_handle is None:
        # SGLang noted the OpenAI handler's start (perf_counter): where HTTP parsing ended. None on the
        # native endpoints, whose parsing then ends at the trace's creation (``build_record``).
        received = getattr(obj, "received_time", None)
        if isinstance(received, float) and received >= http.t_arrival:
            http.t_handle = received
    rids = obj.rid if isinstance(obj.rid, list) else [obj.rid]
    model = getattr(instance, "served_model_name", None) or ""
    states = getattr(instance, "rid_to_state", None) or {}
    capture = config.get().capture_content
    # SGLang's own start-up request runs while its server status is still "Starting"
    warmup = (http is not None and http.warmup) or getattr(
        getattr(instance, "server_status", None), "name", None
    ) == "Starting"
    for i, rid in enumerate(rids):
        if rid is None or rid in LIVE:
            continue
        trace = ApiTrace(rid, http, model, t1 if call is None else call.t_call)
        state = trace.sglang_state = states.get(rid)  # read at the hand-over: dispatch's times
        if getattr(instance, "enable_trace", True):  # SGLang's own tracing (a release without the flag: look)
            trace.sglang_trace_headers = _sglang_trace_headers(getattr(state, "time_stats", None))
        trace.warmup = warmup
        if capture:
            trace.content = _content(instance, obj, i if isinstance(obj.rid, list) else None)
        LIVE[rid] = trace
        owner.traces.append(trace)


def _content(instance: Any, obj: Any, i: int | None) -> dict[str, Any]:
    """Opt-in (``SGLANG_MMTRACE_CAPTURE_CONTENT=1``): the prompt as SGLang received it and the image URLs.

    ``data:`` URLs are shortened to their media type and size: the image bytes never leave the process.
    """

    def pick(value: Any) -> Any:
        return value[i] if i is not None and isinstance(value, list) else value

    prompt = pick(getattr(obj, "text", None))
    if prompt is None and getattr(obj, "input_ids", None) is not None:
        prompt = instance.tokenizer.decode(pick(obj.input_ids))
    images = pick(getattr(obj, "image_data", None)) or []
    urls = []
    for image in images if isinstance(images, list) else [images]:
        url = image if isinstance(image, str) else getattr(image, "url", None)
        if isinstance(url, str):
            head, sep, data = url.partition(",")
            urls.append(f"{head},<{len(data)} chars>" if url.startswith("data:") and sep else url)
    return {"prompt": prompt if isinstance(prompt, str) else None, "image_urls": urls}


def _sglang_trace_headers(stats: Any) -> dict[str, str] | None:
    """With SGLang's --enable-trace on, our spans join its trace under its root span."""
    trace_ctx = getattr(stats, "trace_ctx", None)
    if not getattr(trace_ctx, "tracing_enable", False) or getattr(trace_ctx, "root_span_context", None) is None:
        return None
    from opentelemetry import propagate

    carrier: dict[str, str] = {}
    propagate.inject(carrier, context=trace_ctx.root_span_context)
    return carrier or None


def _tokenize_enter(instance: Any, args: tuple, kwargs: dict) -> Any:
    """Make the request's trace current while SGLang tokenizes it, so hooks deeper in the call (the
    multimodal processor) find it."""
    obj = arg(args, kwargs, 0, "obj")
    rid = getattr(obj, "rid", None)
    trace = LIVE.get(rid) if isinstance(rid, str) else None
    if trace is not None:
        media = {m: _count(getattr(obj, f"{m}_data", None)) for m in MODALITIES}
        trace.media = {m: n for m, n in media.items() if n}
    return trace, current_trace.set(trace)


def _remote_encoder(instance: Any, obj: Any) -> str | None:
    """The encoder transfer backend when this language-only server sent the request's media to an
    encoder server (SGLang's ``need_wait_for_mm_inputs``), else None: SGLang's own flags, read once
    the request is tokenized."""
    server_args = getattr(instance, "server_args", None)
    if not getattr(server_args, "language_only", False) or not getattr(obj, "need_wait_for_mm_inputs", False):
        return None
    return str(getattr(server_args, "encoder_transfer_backend", None) or "unknown")


def _count(data: Any) -> int:
    """Items in one of a request's media fields (a list, a single item, or None)."""
    return len(data) if isinstance(data, list) else int(data is not None)


def _tokenize_exit(st, t0, t1, instance, args, kwargs, result, exc) -> None:
    """The scope ends; ``tokenize`` is filed, with the class of the exception that failed the request."""
    if st is None:
        return
    trace, token = st
    current_trace.reset(token)
    if trace is not None:
        trace.add(TOKENIZE, t0, t1)
        trace.remote_encoder = _remote_encoder(instance, arg(args, kwargs, 0, "obj"))
        if exc is not None:
            trace.error_class = error_class(exc)


def _batch_output(instance: Any, args: tuple, kwargs: dict) -> None:
    recv_obj = arg(args, kwargs, 0, "recv_obj")
    rids = getattr(recv_obj, "rids", None)
    if not rids or not LIVE:
        return
    t = now()
    finished = getattr(recv_obj, "finished_reasons", None)
    for i, rid in enumerate(rids):
        trace = LIVE.get(rid)
        if trace is None:
            continue
        if trace.t_first_output is None:
            trace.t_first_output = t
        if finished is not None and finished[i] is not None:
            trace.t_finished = t
            trace.finish_reason = finished[i]
            trace.output_tokens = _item(recv_obj, "completion_tokens", i, 0)
            trace.meta_prompt_tokens = _item(recv_obj, "prompt_tokens", i, None)
            trace.meta_cached_tokens = _item(recv_obj, "cached_tokens", i, None)


def _item(obj: Any, name: str, i: int, default: Any) -> Any:
    seq = getattr(obj, name, None)
    try:
        return seq[i] if seq is not None else default
    except (IndexError, TypeError):
        return default


def _abort(instance: Any, args: tuple, kwargs: dict) -> None:
    rid = arg(args, kwargs, 0, "rid")
    if rid not in getattr(instance, "rid_to_state", {rid: None}):
        return  # a cleanup abort of a finished request (0.5.17 sends one after every stream): not an abort
    trace = LIVE.get(rid) if rid else None
    if trace is not None and trace.tm_error is None:
        trace.tm_error = "aborted"
        if trace.http is None and runtime.collector is not None:
            runtime.collector.finish(trace)


def _tm_init_exit(st, t0, t1, instance, args, kwargs, result, exc) -> None:
    """SGLang's server args are known once the TokenizerManager is built: start the metrics there."""
    cfg = config.get()
    if exc is None and cfg.metrics and runtime.collector is not None:
        server_args = getattr(instance, "server_args", None)
        enable_metrics = bool(getattr(server_args, "enable_metrics", False))
        try:
            # Exemplars need the collector's own registry: then our metrics leave SGLang's /metrics.
            runtime.collector.start_metrics(enable_metrics and not cfg.exemplars, cfg.metrics_port, instance)
        except Exception as err:  # e.g. the collector did not answer: metrics off, serving goes on
            telemetry.warn("metrics disabled: %r", err)


def _rid_of(index: int, name: str):
    def detail(instance: Any, args: tuple, kwargs: dict) -> str | None:
        rid = getattr(arg(args, kwargs, index, name), "rid", None)
        return rid if isinstance(rid, str) and rid in LIVE else None

    return detail


PART = "tokenizer"  # the switch part that gates these hooks

HOOKS: dict[str, HookSpec] = {
    "tokenizer_manager.init": replace(interval("tokenizer_manager.init", _tm_init_exit), gated=False),
    "tokenizer_manager.init_req_state": interval("tokenizer_manager.init_req_state", _init_exit),
    "tokenizer_manager.tokenize": interval(
        "tokenizer_manager.tokenize",
        _tokenize_exit,
        _tokenize_enter,
        nvtx=(TOKENIZE, _rid_of(0, "obj")),
    ),
    # dispatch's times are SGLang's own (ApiTrace.read_sglang_notes): this hook is its NVTX range only
    "tokenizer_manager.dispatch": ranged("tokenizer_manager.dispatch", (DISPATCH, _rid_of(0, "tokenized_obj"))),
    "tokenizer_manager.batch_output": before("tokenizer_manager.batch_output", _batch_output),
    "tokenizer_manager.abort": before("tokenizer_manager.abort", _abort),
}

# the arguments each hook reads from its target (registry.READS_OF)
READS: dict[str, tuple[tuple[int | None, str | None], ...]] = {
    "tokenizer_manager.init_req_state": ((0, "obj"),),
    "tokenizer_manager.tokenize": ((0, "obj"),),
    "tokenizer_manager.dispatch": ((0, "tokenized_obj"),),
    "tokenizer_manager.batch_output": ((0, "recv_obj"),),
    "tokenizer_manager.abort": ((0, "rid"),),
}
