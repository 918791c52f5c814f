"""Multimodal processor, the base processor's generic path (api process; every release): load,
decode, HF processor, expand.

Every family's processor overrides ``process_mm_data_async``, and most of them then go through the
base class's ``load_mm_data`` and ``process_and_combine_mm_data`` (so does Qwen-VL without its
artifact cache, and every Qwen-VL request on 0.5.17, which has no artifact pipeline):

    EL    <Family>Processor.process_mm_data_async   (hooked on the class SGLang built)
    IO      _load_single_item (classmethod)     -> load_image -> _load_image -> get_image_bytes, PIL/nvJPEG
    PROC    process_and_combine_mm_data          (MultimodalProcessorExecutor thread)
    PROC      process_mm_data                    the HF processor: tokenize, expand, resize, normalize
    PROC      offsets + per-image split
    PROC      _wrap_tensor_for_cuda_ipc          per GPU feature (cuda_ipc transport)
    EL      tail: the family's own (padded ids, M-RoPE positions for Qwen-VL)

IO and PROC threads get the caller's context through the executors wrapped by ``mm_processor.init``.
A request's state lives in ``_MmReq``, held by a context variable that the IO/PROC context copies
share by reference; per-call state on a worker thread lives in a thread-local.

Stages: ``mm.process`` (the request scope, ``process_mm_data_async`` as a whole), ``mm.load``
(base64/HTTP fetch, from ``get_image_bytes``), ``mm.download`` (inside it: SGLang's HTTP(S) download
of an image, video or audio URL, ``download_remote_media``; on 0.5.17, which has none, an image
URL's ``get_image_bytes``), ``mm.decode`` (the rest of ``_load_single_item``),
``mm.resize_normalize`` (``process_mm_data``; host-timed, or with ``SGLANG_MMTRACE_GPU_TIMING=all``,
when the fast processor runs on the GPU, ending where its GPU work does: a CUDA event mark
(``cuda_marks``) read when the request has finished, ``ApiTrace.add_gpu``, never waited for),
``mm.expand`` (once per request: the padded ids and M-RoPE positions on EL; the offsets and
per-image split before it on PROC are its ``split_s`` attribute, their time inside ``mm.process``,
because the ``cuda_ipc`` copies come between the two parts) and ``transport.prepare``
(``cuda_ipc``: the pool slice copies, host-timed or marked the same way). On this path the TM
computes no content hash (the scheduler hashes pixels), so ``images[].content_hash`` is empty.

Why the API's marks are not the default: they cost an image request TTFT on the PROC thread, its
critical path (the marks' own time and SGLang's processor slowed behind them), more than the GPU tails
they would add to two stages' ends, a small part of the processor call (figures:
docs/performance.md).
"""

from __future__ import annotations

import contextvars
import threading
from typing import Any

from ... import config, switch
from ...join.context import ApiTrace, current_trace
from ...stages import (
    MM_DECODE,
    MM_DOWNLOAD,
    MM_EXPAND,
    MM_LOAD,
    MM_PROCESS,
    MM_RESIZE_NORMALIZE,
    TRANSPORT_PREPARE,
)
from .. import cuda_marks
from ..base import HookSpec, arg, interval, now
from .mm_processor import image_size

_tls = threading.local()


class _MmReq:
    """One ``process_mm_data_async`` call (one request's images)."""

    __slots__ = ("trace", "loaded", "t_combined", "split", "tiled")

    def __init__(self, trace: ApiTrace) -> None:
        self.trace = trace
        self.loaded: dict[int, tuple[int, int, int]] = {}  # id(loaded image) -> (bytes, width, height)
        self.t_combined: float | None = None  # process_and_combine_mm_data_async (or the last tiling) returned
        self.split: tuple[float, float, dict[str, Any]] | None = None  # the PROC part of mm.expand
        self.tiled: list[tuple[int, int]] = []  # (width, height) of each image InternVL tiled, in order


class _Media:
    """The media item an IO thread is loading (``_load_single_item``, or a ``get_image_bytes`` call
    outside one): its modality for ``mm.download``, whether a download was timed inside the current
    ``get_image_bytes`` call, and whether a failure of the item was already filed (the innermost call
    that raised files it: the stage that failed, and the class it raised before SGLang re-wraps it)."""

    __slots__ = ("modality", "downloaded", "failed")

    def __init__(self, modality: str) -> None:
        self.modality = modality
        self.downloaded = False
        self.failed = False


class _Combine:
    """One ``process_and_combine_mm_data`` call on a PROC (or EL) thread."""

    __slots__ = ("t_resize_end", "ipc")

    def __init__(self) -> None:
        self.t_resize_end: float | None = None
        self.ipc: list[tuple[float, float, int, str, Any, Any]] = []  # (t0, t1, bytes, outcome, reference, end mark)


current_mm: contextvars.ContextVar[_MmReq | None] = contextvars.ContextVar("mmtrace_mm_legacy", default=None)


def _trace() -> ApiTrace | None:
    req = current_mm.get()
    return req.trace if req is not None else current_trace.get()


def _traced_rid(instance: Any, args: tuple, kwargs: dict) -> str | None:
    trace = _trace()
    return trace.rid if trace is not None else None


def _fetch_rid(instance: Any, args: tuple, kwargs: dict) -> str | None:
    return _traced_rid(instance, args, kwargs) if getattr(_tls, "fetch", None) is not None else None


def _ipc_rid(instance: Any, args: tuple, kwargs: dict) -> str | None:
    tensor = arg(args, kwargs, 0, "tensor")
    return _traced_rid(instance, args, kwargs) if getattr(tensor, "is_cuda", False) else None


def _nv(stage: str, detail: Any = _traced_rid) -> tuple[str, Any]:
    return (stage, detail)


# -- request scope: <Family>Processor.process_mm_data_async --------------------------------


def _request_enter(instance: Any, args: tuple, kwargs: dict) -> Any:
    trace = current_trace.get()
    # the TokenizerManager passes its arguments by name (positions differ between processors)
    obj = kwargs.get("request_obj")
    media = arg(args, kwargs, 0, "image_data") or getattr(obj, "video_data", None) or getattr(obj, "audio_data", None)
    if trace is None or not media:
        return None
    req = _MmReq(trace)
    return req, current_mm.set(req)


def _request_exit(st, t0, t1, instance, args, kwargs, result, exc) -> None:
    if st is None:
        return
    req, token = st
    current_mm.reset(token)
    req.trace.add(MM_PROCESS, t0, t1)
    tail = exc is None and req.t_combined is not None and req.t_combined <= t1
    if req.split is not None:
        s0, s1, attrs = req.split
        if tail:  # one mm.expand per request: the EL tail, the PROC part as an attribute
            req.trace.add(MM_EXPAND, req.t_combined, t1, {**attrs, "split_s": round(s1 - s0, 9)})
        else:
            req.trace.add(MM_EXPAND, s0, s1, attrs)
    elif tail:
        req.trace.add(MM_EXPAND, req.t_combined, t1)
    if tail and req.tiled and not req.trace.images:
        req.trace.images = _tiled_images(req.tiled, result)


def _tiled_images(sizes: list[tuple[int, int]], output: Any) -> list[dict[str, Any]]:
    """The record's ``images`` of a processor that tiles images itself (InternVL): sizes as tiled,
    visual tokens from the output's image items, both in the request's order."""
    items = [i for i in getattr(output, "mm_items", None) or () if getattr(i.modality, "name", None) == "IMAGE"]
    if len(items) != len(sizes):
        return []  # the pairing is unknown: claim nothing
    return [
        {
            "width": w,
            "height": h,
            "visual_tokens": sum(e - s + 1 for s, e in (item.offsets or ())),
            "bytes": 0,
            "content_hash": "",
        }
        for (w, h), item in zip(sizes, items, strict=True)
    ]


def _gpu_stage(stage: str, t0: float, t1: float, ref: Any, end: Any, attrs: dict[str, Any]) -> None:
    """File a stage that ran on the GPU: its end mark is read when the request has finished
    (``ApiTrace.add_gpu``); without a reference and an end mark it is host-timed now."""
    trace = _trace()
    if trace is None:
        return
    if ref is not None and end is not None:
        trace.add_gpu(stage, t0, t1, attrs, ref, end)
    else:
        trace.add(stage, t0, t1, attrs)


# -- IO threads: _load_single_item and get_image_bytes ----------------------------------------


def _load_enter(instance: Any, args: tuple, kwargs: dict) -> Any:
    prev = getattr(_tls, "fetch", None), getattr(_tls, "media", None)
    _tls.fetch = []
    modality = getattr(arg(args, kwargs, 1, "modality"), "name", None)
    _tls.media = _Media(modality.lower()) if isinstance(modality, str) else None
    return prev


def _load_exit(st, t0, t1, instance, args, kwargs, result, exc) -> None:
    fetched = getattr(_tls, "fetch", None) or []
    media = getattr(_tls, "media", None)
    _tls.fetch, _tls.media = st
    modality = getattr(arg(args, kwargs, 1, "modality"), "name", None)
    if modality not in ("IMAGE", "VIDEO", "AUDIO") or isinstance(result, dict):
        return  # already-preprocessed input (returned as is)
    trace = _trace()
    if trace is None:
        return
    if exc is not None:
        if media is not None and not media.failed:
            # not the download's nor get_image_bytes' (they filed theirs): an image's decode once its
            # bytes were read, an audio clip's read-and-decode, else the item's load (a video's source
            # read and container opened, an image input SGLang could not read)
            decoding = modality == "AUDIO" or (modality == "IMAGE" and bool(fetched))
            trace.fail(MM_DECODE if decoding else MM_LOAD, modality.lower(), exc)
        return
    if modality == "VIDEO":  # the source read and the container opened: its frames decode later
        trace.add(MM_LOAD, t0, t1, {"modality": "video"})
        return
    if modality == "AUDIO":
        # SGLang's load_audio reads the source (base64 or file), decodes and resamples in one call
        # with no seam between: one mm.decode, its read included (with_read)
        samples = getattr(result, "shape", (0,))[-1] if getattr(result, "shape", None) else 0
        trace.add(MM_DECODE, t0, t1, {"modality": "audio", "with_read": True, "samples": int(samples)})
        return
    size = image_size(result)
    nbytes = sum(n for _, _, n in fetched)
    decode_from = t0
    if fetched:
        f1 = max(b for _, b, _ in fetched)
        trace.add(MM_LOAD, t0, f1, {"bytes": nbytes})
        decode_from = f1
    attrs: dict[str, Any] = {"gpu": True} if hasattr(result, "is_cuda") and result.is_cuda else {}
    if size is not None:
        attrs.update(width=size[0], height=size[1])
    trace.add(MM_DECODE, decode_from, t1, attrs)
    req = current_mm.get()
    if req is not None and size is not None:
        req.loaded[id(result)] = (nbytes, size[0], size[1])


def _fetch_enter(instance: Any, args: tuple, kwargs: dict) -> Any:
    media = getattr(_tls, "media", None)
    own = media is None  # outside _load_single_item: Qwen-VL's artifact path (its content snapshot)
    if own:
        media = _tls.media = _Media("image")
    was, media.downloaded = media.downloaded, False
    return media, own, was


def _fetch_exit(st, t0, t1, instance, args, kwargs, result, exc) -> None:
    media, own, was = st
    downloaded = media.downloaded
    media.downloaded = was or downloaded
    if own:
        _tls.media = None
    fetched = getattr(_tls, "fetch", None)
    if fetched is not None and isinstance(result, bytes | bytearray):
        fetched.append((t0, t1, len(result)))
    if downloaded:
        return  # the download hook filed mm.download (or its failure)
    source = arg(args, kwargs, 0, "image_file")
    url = isinstance(source, str) and source.startswith(("http://", "https://"))  # never kept: content
    trace = _trace()
    if trace is None:
        return
    if exc is not None:
        if not media.failed:
            media.failed = True
            trace.fail(MM_DOWNLOAD if url else MM_LOAD, media.modality, exc)
    elif url and isinstance(result, bytes | bytearray):
        # a release without download_remote_media (0.5.17): this call's URL branch is the download
        trace.add(MM_DOWNLOAD, t0, t1, {"bytes": len(result), "modality": media.modality})


def _download_exit(st, t0, t1, instance, args, kwargs, result, exc) -> None:
    """SGLang's HTTP(S) download of one media URL (``download_remote_media``, 0.5.18+): called by the
    image, video and audio loaders, whose item (``_Media``) gives the modality; ``unknown`` for a
    family's own loader that calls it outside them. The URL is never read."""
    media = getattr(_tls, "media", None)
    if media is not None:
        media.downloaded = True
    trace = _trace()
    if trace is None:
        return
    modality = media.modality if media is not None else "unknown"
    if exc is not None:
        if media is None or not media.failed:
            trace.fail(MM_DOWNLOAD, modality, exc)
        if media is not None:
            media.failed = True
    elif isinstance(result, bytes | bytearray):
        trace.add(MM_DOWNLOAD, t0, t1, {"bytes": len(result), "modality": modality})


# -- PROC threads: process_and_combine_mm_data, process_mm_data, _wrap_tensor_for_cuda_ipc ---------


def _frames_exit(st, t0, t1, instance, args, kwargs, result, exc) -> None:
    """A video's sampled frames decoded (``VideoDecoderWrapper``, every family's video decoder)."""
    trace = _trace()
    if trace is not None and exc is None:
        trace.add(MM_DECODE, t0, t1, {"modality": "video", "frames": len(arg(args, kwargs, 0, "indices") or ())})


def _tiles_exit(st, t0, t1, instance, args, kwargs, result, exc) -> None:
    """InternVL's own resize of one normalized image (or video frame) into 448 px tiles: its
    ``mm.resize_normalize`` (a per-model hook: this family's processor calls no generic one). Its
    placeholder expansion follows the last tiling, so ``mm.expand`` runs from there to the end."""
    req = current_mm.get()
    if req is None or exc is not None:
        return
    tensor = arg(args, kwargs, 0, "tensor")
    shape = getattr(tensor, "shape", None)
    req.trace.add(MM_RESIZE_NORMALIZE, t0, t1, {"tiles": int(getattr(result, "shape", (0,))[0])})
    if shape is not None and len(shape) == 3:
        req.tiled.append((int(shape[2]), int(shape[1])))
    req.t_combined = t1


def _combine_enter(instance: Any, args: tuple, kwargs: dict) -> Any:
    prev = getattr(_tls, "combine", None)
    _tls.combine = _Combine()
    return prev


def _combine_exit(st, t0, t1, instance, args, kwargs, result, exc) -> None:
    c = getattr(_tls, "combine", None)
    _tls.combine = st
    trace = _trace()
    if trace is None or c is None or exc is None and not isinstance(result, tuple):
        return
    if c.ipc:
        nbytes = sum(e[2] for e in c.ipc)
        outcomes = {e[3] for e in c.ipc}
        mode = "cuda_ipc" if outcomes == {"cuda_ipc"} else "cuda_ipc+cpu_fallback"
        attrs = {"mode": mode, "bytes": nbytes, "tensors": len(c.ipc)}
        # the pool copies are non-blocking launches: their GPU work ends at the last one's end mark
        timed = all(e[4] is not None and e[5] is not None for e in c.ipc)
        ref, end = (c.ipc[-1][4], c.ipc[-1][5]) if timed else (None, None)
        _gpu_stage(TRANSPORT_PREPARE, c.ipc[0][0], c.ipc[-1][1], ref, end, attrs)
        trace.transport_bytes += nbytes
        trace.transport_mode = "cuda_ipc"
    if exc is not None or c.t_resize_end is None:
        return
    every = [it for it in (result[0] or ()) if getattr(getattr(it, "modality", None), "name", None)]
    if not every:
        return
    items = [it for it in every if it.modality.name == "IMAGE"]
    expand_end = c.ipc[0][0] if c.ipc else t1
    visual = [sum(e - s + 1 for s, e in (getattr(it, "offsets", None) or ())) for it in items]
    split_attrs: dict[str, Any] = {"images": len(items), "visual_tokens": sum(visual)}
    audio = [it for it in every if it.modality.name == "AUDIO"]
    if audio:
        split_attrs["audios"] = len(audio)
        split_attrs["audio_tokens"] = sum(e - s + 1 for it in audio for s, e in (getattr(it, "offsets", None) or ()))
    split = (c.t_resize_end, max(c.t_resize_end, expand_end), split_attrs)
    req = current_mm.get()
    if req is not None:
        req.split = split  # joined with the EL tail into one mm.expand when the request scope ends
    else:
        trace.add(MM_EXPAND, *split)
    base_output = arg(args, kwargs, 0, "base_output")
    loaded = list(getattr(base_output, "images", None) or ())
    images = []
    for i, tokens in enumerate(visual):
        img = loaded[i] if i < len(loaded) else None
        known = req.loaded.get(id(img)) if req is not None and img is not None else None
        size = (known[1], known[2]) if known else (image_size(img) or (0, 0))
        images.append(
            {
                "width": size[0],
                "height": size[1],
                "visual_tokens": tokens,
                "bytes": known[0] if known else 0,
                "content_hash": "",  # the scheduler hashes pixels on this path; the TM has no identity
            }
        )
    trace.images = images


def _combine_async_exit(st, t0, t1, instance, args, kwargs, result, exc) -> None:
    req = current_mm.get()
    if req is not None and exc is None:
        req.t_combined = t1


def _end_mark(ref: Any) -> tuple[Any, Any]:
    """(reference, end mark) for a call whose enter step found or made ``ref`` (``_events_start``)."""
    if ref is None:
        return None, None
    return ref, ref.marks.mark()


def _resize_start(instance: Any, args: tuple, kwargs: dict) -> Any:
    return _events_start(instance)


def _ipc_start(instance: Any, args: tuple, kwargs: dict) -> Any:
    tensor = arg(args, kwargs, 0, "tensor")
    return _events_start(instance) if getattr(tensor, "is_cuda", False) and getattr(_tls, "combine", None) else None


def _events_start(instance: Any) -> Any:
    """With the API's GPU timing on (``SGLANG_MMTRACE_GPU_TIMING=all``), the reference that will place
    the call's end mark: the device's recent one (the call's start is then its host time, with no
    mark), else a mark taken now and made the device's reference; None (host-timed) otherwise. Each
    mark is a CUDA call holding the GIL on a PROC thread (the first after the GPU idled costs the
    most), so most image requests make one per stage."""
    if not (config.get().gpu_timing == "all" and switch.on("cuda_events")) or _trace() is None:
        return None
    marks = cuda_marks.device_marks(int(getattr(getattr(instance, "server_args", None), "base_gpu_id", 0) or 0))
    if marks is None:
        return None
    return marks.reference(now()) or marks.mark_reference(now)


def _resize_done(ev, t0, t1, instance, args, kwargs, result, exc) -> None:
    c = getattr(_tls, "combine", None)
    if c is not None:
        c.t_resize_end = t1
    images, videos = arg(args, kwargs, 1, "images"), arg(args, kwargs, 2, "videos")
    audios = arg(args, kwargs, 3, "audios")
    trace = _trace()
    if exc is not None and trace is not None:  # the HF processor raised: one failure per modality it had
        for modality, items in (("image", images), ("video", videos), ("audio", audios)):
            if items:
                trace.fail(MM_RESIZE_NORMALIZE, modality, exc)
    attrs = {"images": len(images or ())}
    if videos:
        attrs["videos"] = len(videos)
    if audios:
        attrs["audios"] = len(audios)  # for audio, the processor's feature extraction (log-mel)
    _gpu_stage(MM_RESIZE_NORMALIZE, t0, t1, *_end_mark(ev), attrs)


def _ipc_done(ev, t0, t1, instance, args, kwargs, result, exc) -> None:
    c = getattr(_tls, "combine", None)
    tensor = arg(args, kwargs, 0, "tensor")
    if c is None or exc is not None or not getattr(tensor, "is_cuda", False):
        return  # CPU tensors pass through untouched
    outcome = "cpu_fallback" if type(result).__name__ == "Tensor" else "cuda_ipc"  # pool full -> tensor.cpu()
    c.ipc.append((t0, t1, int(tensor.nbytes), outcome, *_end_mark(ev)))


# -- the transformers backend's processor (TransformersAutoMultimodalProcessor), its own three calls -----


def _auto_load_enter(instance: Any, args: tuple, kwargs: dict) -> Any:
    prev = getattr(_tls, "fetch", None), getattr(_tls, "media", None)
    _tls.fetch, _tls.media = [], _Media("image")
    return prev


def _auto_load_exit(st, t0, t1, instance, args, kwargs, result, exc) -> None:
    """``_load_images``: every image of the request in turn, each its read (``get_image_bytes``, seen
    by the fetch hook) then its decode, on the event loop. Where the reads cannot be paired with the
    images (an item given already decoded), one ``mm.decode`` with its reads inside."""
    fetched = getattr(_tls, "fetch", None) or []
    _tls.fetch, _tls.media = st
    trace = _trace()
    if trace is None or exc is not None or not isinstance(result, list) or not result:
        return
    if len(fetched) != len(result):
        trace.add(MM_DECODE, t0, t1, {"images": len(result), "with_read": True})
        return
    req = current_mm.get()
    ends = [a for a, _, _ in fetched[1:]] + [t1]
    for (a, b, nbytes), end, img in zip(fetched, ends, result, strict=True):
        trace.add(MM_LOAD, a, b, {"bytes": nbytes})
        size = image_size(img)
        trace.add(MM_DECODE, b, end, {"width": size[0], "height": size[1]} if size else {})
        if req is not None and size is not None:
            req.loaded[id(img)] = (nbytes, size[0], size[1])


def _auto_hf_processor_exit(st, t0, t1, instance, args, kwargs, result, exc) -> None:
    """``_apply_hf_processor``: the HF processor on the text and the images in one call, which
    resizes, normalizes and also expands the placeholders (``with_expand``)."""
    trace = _trace()
    if trace is None or exc is not None:
        return
    attrs: dict[str, Any] = {"images": len(arg(args, kwargs, 1, "images") or ()), "with_expand": True}
    videos = arg(args, kwargs, 2, "videos")
    if videos:
        attrs["videos"] = len(videos)
    trace.add(MM_RESIZE_NORMALIZE, t0, t1, attrs)


def _auto_items_exit(st, t0, t1, instance, args, kwargs, result, exc) -> None:
    """``_build_mm_items``: the items and their places in the expanded prompt (SGLang's part of the
    expansion: the HF processor inserted the tokens), and the record's images from them."""
    trace = _trace()
    if trace is None or exc is not None or not isinstance(result, list):
        return
    images = [it for it in result if getattr(getattr(it, "modality", None), "name", None) == "IMAGE"]
    spans = [(s, e) for it in images for s, e in (getattr(it, "offsets", None) or ())]
    trace.add(MM_EXPAND, t0, t1, {"images": len(spans), "visual_tokens": sum(e - s + 1 for s, e in spans)})
    req = current_mm.get()
    loaded = list(req.loaded.values()) if req is not None else []  # (bytes, width, height), in load order
    if len(loaded) == len(spans) and not trace.images:
        trace.images = [
            {"width": w, "height": h, "visual_tokens": e - s + 1, "bytes": nbytes, "content_hash": ""}
            for (nbytes, w, h), (s, e) in zip(loaded, spans, strict=True)
        ]


PART = "mm"  # the switch part that gates these hooks

HOOKS: dict[str, HookSpec] = {
    # also files mm.process
    "mm_processor_generic.request": interval(
        "mm_processor_generic.request", _request_exit, _request_enter, nvtx=_nv(MM_PROCESS)
    ),
    "mm_processor_generic.load_decode": interval(
        "mm_processor_generic.load_decode", _load_exit, _load_enter, nvtx=_nv(MM_DECODE)
    ),
    "mm_processor_generic.fetch": interval(
        "mm_processor_generic.fetch", _fetch_exit, _fetch_enter, nvtx=_nv(MM_LOAD, _fetch_rid)
    ),
    "mm_processor_generic.download": interval("mm_processor_generic.download", _download_exit, nvtx=_nv(MM_DOWNLOAD)),
    "mm_processor_generic.video_frames": interval(
        "mm_processor_generic.video_frames", _frames_exit, nvtx=_nv(MM_DECODE)
    ),
    "mm_processor_generic.video_frames_tensor": interval(
        "mm_processor_generic.video_frames_tensor", _frames_exit, nvtx=_nv(MM_DECODE)
    ),
    "mm_processor_generic.internvl_tiles": interval(
        "mm_processor_generic.internvl_tiles", _tiles_exit, nvtx=_nv(MM_RESIZE_NORMALIZE)
    ),
    "mm_processor_generic.combine": interval("mm_processor_generic.combine", _combine_exit, _combine_enter),
    # the transformers backend's processor (every HF model SGLang serves with --model-impl transformers)
    "mm_processor_generic.auto_load": interval(
        "mm_processor_generic.auto_load", _auto_load_exit, _auto_load_enter, nvtx=_nv(MM_DECODE)
    ),
    "mm_processor_generic.auto_hf_processor": interval(
        "mm_processor_generic.auto_hf_processor", _auto_hf_processor_exit, nvtx=_nv(MM_RESIZE_NORMALIZE)
    ),
    "mm_processor_generic.auto_items": interval(
        "mm_processor_generic.auto_items", _auto_items_exit, nvtx=_nv(MM_EXPAND)
    ),
    "mm_processor_generic.combine_async": interval("mm_processor_generic.combine_async", _combine_async_exit),
    # CUDA events bracket these calls: the enter step records the first, the exit step the second
    "mm_processor_generic.resize_normalize": interval(
        "mm_processor_generic.resize_normalize", _resize_done, _resize_start, nvtx=_nv(MM_RESIZE_NORMALIZE)
    ),
    "mm_processor_generic.cuda_ipc": interval(
        "mm_processor_generic.cuda_ipc", _ipc_done, _ipc_start, nvtx=_nv(TRANSPORT_PREPARE, _ipc_rid)
    ),
}

# the arguments each hook reads from its target (registry.READS_OF)
READS: dict[str, tuple[tuple[int | None, str | None], ...]] = {
    "mm_processor_generic.request": ((0, "image_data"), (None, "request_obj")),
    "mm_processor_generic.load_decode": ((1, "modality"),),
    "mm_processor_generic.fetch": ((0, "image_file"),),
    "mm_processor_generic.video_frames": ((0, "indices"),),
    "mm_processor_generic.video_frames_tensor": ((0, "indices"),),
    "mm_processor_generic.internvl_tiles": ((0, "tensor"),),
    "mm_processor_generic.combine": ((0, "base_output"),),
    "mm_processor_generic.auto_hf_processor": ((1, "images"), (2, "videos")),
    "mm_processor_generic.resize_normalize": ((1, "images"), (2, "videos"), (3, "audios")),
    "mm_processor_generic.cuda_ipc": ((0, "tensor"),),
}
