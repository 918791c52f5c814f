"""Multimodal processor, Qwen-VL's media-artifact pipeline (api process; 0.5.20+): load,
preprocess-cache lookup, decode, resize, expand. The other families, and Qwen-VL without its
artifact cache, take the base processor's path (``mm_processor_generic``); the processor's set-up
hook here serves both.

Per-image work runs on SGLang's ``sglang-mm-io`` threads, where contextvars do not follow by
themselves: the processor's executors are made to submit under a copy of the caller's context.
"""

from __future__ import annotations

import collections
import contextvars
import threading
from dataclasses import replace
from typing import Any

from ... import runtime
from ...join.context import ApiTrace, current_trace
from ...stages import MM_DECODE, MM_EXPAND, MM_LOAD, MM_PREPROCESS_CACHE, MM_RESIZE_NORMALIZE
from ..base import HookSpec, arg, interval

HASH_PREFIX = 16  # "sha256:" + 9 hex: a short prefix of SGLang's own content identity

_sizes: collections.OrderedDict[str, tuple[int, int]] = collections.OrderedDict()
_sizes_lock = threading.Lock()
_SIZES_MAX = 4096
"""content digest -> decoded (width, height); bounded, so preprocess-cache hits still report a size."""


def _remember_size(digest: str, size: tuple[int, int]) -> None:
    with _sizes_lock:
        _sizes[digest] = size
        _sizes.move_to_end(digest)
        while len(_sizes) > _SIZES_MAX:
            _sizes.popitem(last=False)


def _known_size(digest: str) -> tuple[int, int] | None:
    with _sizes_lock:
        return _sizes.get(digest)


def _propagating(executor: Any) -> None:
    """Make ``executor.submit`` run callables in a copy of the submitter's context."""
    if executor is None or getattr(executor, "_mmtrace_ctx", False):
        return
    submit = executor.submit

    def submit_in_context(fn, /, *args, **kwargs):
        return submit(contextvars.copy_context().run, fn, *args, **kwargs)

    executor.submit = submit_in_context
    executor._mmtrace_ctx = True


def _init_exit(st, t0, t1, instance, args, kwargs, result, exc) -> None:
    """The processor SGLang built: its executors carry the caller's context, and its class's
    ``process_mm_data_async`` (each family overrides it) gets the request-scope hook."""
    if exc is not None:
        return
    _propagating(getattr(instance, "io_executor", None))
    mpe = getattr(instance, "mm_processor_executor", None)
    _propagating(getattr(mpe, "_executor", None))
    runtime.apply_late("processor", type(instance))


def _trace() -> ApiTrace | None:
    return current_trace.get()


def _load_exit(st, t0, t1, instance, args, kwargs, result, exc) -> None:
    trace = _trace()
    if trace is None:
        return
    attrs: dict[str, Any] = {}
    if result is not None:
        digest = str(result.content_digest)
        attrs = {"bytes": int(result.size_bytes), "source": str(result.source)}
        trace.image_meta[digest] = {"bytes": int(result.size_bytes), "content_hash": digest[:HASH_PREFIX]}
    trace.add(MM_LOAD, t0, t1, attrs)


def _cache_exit(st, t0, t1, instance, args, kwargs, result, exc) -> None:
    trace = _trace()
    if trace is None:
        return
    outcome = "hit" if result is not None else "miss"
    trace.preprocess.append(outcome)
    trace.add(MM_PREPROCESS_CACHE, t0, t1, {"result": outcome})


def _decode_exit(st, t0, t1, instance, args, kwargs, result, exc) -> None:
    trace = _trace()
    if trace is None:
        return
    if exc is not None:
        trace.fail(MM_DECODE, "image", exc)  # the artifact path takes images only
    attrs: dict[str, Any] = {}
    size = image_size(result)
    if size is not None:
        attrs = {"width": size[0], "height": size[1]}
        snapshot = arg(args, kwargs, 0, "snapshot")
        digest = getattr(snapshot, "content_digest", None)
        if digest:
            _remember_size(str(digest), size)
    trace.add(MM_DECODE, t0, t1, attrs)


def image_size(media: Any) -> tuple[int, int] | None:
    """(width, height) of a decoded image: a PIL image, or a CHW tensor from a GPU (nvJPEG) decode.

    Shared with ``mm_processor_generic``: both SGLang paths decode to the same kinds of object."""
    size = getattr(media, "size", None)
    if isinstance(size, tuple) and len(size) == 2:
        return int(size[0]), int(size[1])
    shape = getattr(media, "shape", None)  # CHW tensor from a GPU decode
    if shape is not None and len(shape) == 3:
        return int(shape[2]), int(shape[1])
    return None


def _resize_exit(st, t0, t1, instance, args, kwargs, result, exc) -> None:
    trace = _trace()
    if trace is None:
        return
    if exc is not None:
        trace.fail(MM_RESIZE_NORMALIZE, "image", exc)
    entries = arg(args, kwargs, 0, "entries") or ()
    trace.add(MM_RESIZE_NORMALIZE, t0, t1, {"images": len(entries)})


def _expand_exit(st, t0, t1, instance, args, kwargs, result, exc) -> None:
    trace = _trace()
    if trace is None:
        return
    artifacts = arg(args, kwargs, 1, "artifacts") or ()
    items = getattr(result, "mm_items", None) or ()
    images = []
    for artifact, item in zip(artifacts, items, strict=False):
        digest = str(getattr(artifact, "content_digest", ""))
        meta = trace.image_meta.get(digest, {})
        size = _known_size(digest) or (0, 0)
        images.append(
            {
                "width": size[0],
                "height": size[1],
                "visual_tokens": sum(e - s + 1 for s, e in (getattr(item, "offsets", None) or ())),
                "bytes": meta.get("bytes", 0),
                "content_hash": meta.get("content_hash", digest[:HASH_PREFIX]),
            }
        )
    trace.images = images
    trace.add(MM_EXPAND, t0, t1, {"images": len(images), "visual_tokens": sum(i["visual_tokens"] for i in images)})


def _traced_rid(instance: Any, args: tuple, kwargs: dict) -> str | None:
    trace = current_trace.get()
    return trace.rid if trace is not None else None


def _nv(stage: str) -> tuple[str, Any]:
    return (stage, _traced_rid)


PART = "mm"  # the switch part that gates these hooks

HOOKS: dict[str, HookSpec] = {
    "mm_processor.init": replace(interval("mm_processor.init", _init_exit), gated=False),
    "mm_processor.load": interval("mm_processor.load", _load_exit, nvtx=_nv(MM_LOAD)),
    "mm_processor.preprocess_cache": interval(
        "mm_processor.preprocess_cache", _cache_exit, nvtx=_nv(MM_PREPROCESS_CACHE)
    ),
    "mm_processor.decode": interval("mm_processor.decode", _decode_exit, nvtx=_nv(MM_DECODE)),
    "mm_processor.resize_normalize": interval(
        "mm_processor.resize_normalize", _resize_exit, nvtx=_nv(MM_RESIZE_NORMALIZE)
    ),
    "mm_processor.expand": interval("mm_processor.expand", _expand_exit, nvtx=_nv(MM_EXPAND)),
}

# the arguments each hook reads from its target (registry.READS_OF)
READS: dict[str, tuple[tuple[int | None, str | None], ...]] = {
    "mm_processor.decode": ((0, "snapshot"),),
    "mm_processor.resize_normalize": ((0, "entries"),),
    "mm_processor.expand": ((1, "artifacts"),),
}
