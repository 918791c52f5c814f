"""Prefill batch results (scheduler process): first token to the detokenizer; the forward's events built.

By the time ``process_batch_result_prefill`` returns, SGLang has synchronized the batch's copy-done
event, so the CUDA events of the forward can be read without adding a host sync, and it has handed
the first tokens on (``stream_output``). So the scheduler's events of a prefill forward are built
here, from the times the earlier hooks stored (admission, ``run_batch``, the model's marks): that
work runs after the hand-off, off the first token's way to the client.
"""

from __future__ import annotations

from typing import Any

from ...join.outcomes import Embedding, Placement, combine, modality_embedding, prefix_hit_of
from ...stages import (
    MODEL_AUDIO_ENCODER,
    MODEL_EMBED,
    MODEL_FORWARD,
    MODEL_PREFILL,
    MODEL_SAMPLE,
    MODEL_VISION_ENCODER,
    SCHEDULER_BATCH,
    SCHEDULER_OUTPUT,
    SCHEDULER_OVERLAP_WAIT,
    SCHEDULER_PREFIX_MATCH,
    SCHEDULER_QUEUE,
    SCHEDULER_RECV,
)
from ..base import HookSpec, arg, interval
from . import state as ss
from .schedule_batch import placement, vision_in_prefix


def _emit_admission(req: Any, tr: ss.ReqTrace) -> None:
    """``scheduler.recv``, ``scheduler.queue`` and ``scheduler.prefix_match`` from what the trace's
    creation and admission fixed (once per request; before ``_emit_forward``, which clears ``t_match1``)."""
    cached, prefix = tr.admission
    tr.admission = None
    placed = placement(req, prefix)
    tr.vit_skipped = vision_in_prefix(placed)
    m0, m1 = tr.t_match0, tr.t_match1
    ss.emit(tr.rid, SCHEDULER_RECV, tr.t_recv, tr.t_enqueue)
    ss.emit(tr.rid, SCHEDULER_QUEUE, tr.t_enqueue, m0)
    attrs = {
        "cached_tokens": int(cached or 0),
        "prompt_tokens": len(req.origin_input_ids),
        "image_prefix_hit": prefix_hit_of({m: Placement(*c) for m, c in placed.items()}),
        "placement": placed,
    }
    ss.emit(tr.rid, SCHEDULER_PREFIX_MATCH, m0, m1, attrs=attrs)


def _emit_forward(ctx: ss.FwdCtx) -> None:
    """``scheduler.batch`` (each request's first forward) and ``model.forward``: host-timed."""
    attrs = {"batch_size": ctx.batch_size}
    for tr in ctx.traces:
        if tr.t_match1 is not None:
            ss.emit(tr.rid, SCHEDULER_BATCH, tr.t_match1, ctx.t0, attrs=attrs)
            tr.t_match1 = None  # emitted once: later chunks go straight from result to forward
    ss.emit(ctx.rids, MODEL_FORWARD, ctx.t0, ctx.t1, attrs=attrs)


def _emit_model_stages(ctx: ss.FwdCtx, batch_size: int) -> None:
    clock, rids = ctx.clock, ctx.rids
    name = clock.name
    base = {"batch_size": batch_size}
    encoded: set[Any] = set()  # item hashes an encoder call took in this forward
    vit_end = None
    for m0, m1, hashes, modality in ctx.vit:
        owners: dict[str, int] = {}
        for h in hashes:
            encoded.add(h)
            for rid in ctx.hash_to_rids.get(h, ()):
                owners[rid] = owners.get(rid, 0) + 1
        t0, t1 = clock.host(m0), clock.host(m1)
        vit_end = t1 if vit_end is None else max(vit_end, t1)
        if owners:
            audio = modality == "audio"
            ss.emit(
                tuple(owners),
                MODEL_AUDIO_ENCODER if audio else MODEL_VISION_ENCODER,
                t0,
                t1,
                name,
                {
                    **base,
                    "items" if audio else "images": len(hashes),
                    "requests": len(owners),
                    "modality": modality,
                    "embedding_cache": "miss",
                    "skipped": False,
                },
            )
    _emit_skipped_encoder(ctx, base)
    embed_end = None
    if ctx.embed is not None and ctx.needs_embed:
        e0, e1 = clock.host(ctx.embed[0]), clock.host(ctx.embed[1])
        embed_end = e1
        start = vit_end if vit_end is not None and e0 <= vit_end <= e1 else e0
        seen = ss.encoded_modalities()
        for rid, items in ctx.needs_embed.items():
            evidence = _embedding_evidence(items, encoded, ctx.lookups, seen)
            cache = combine([modality_embedding(None, Embedding(*c))[0] for c in evidence.values()])
            ss.emit(rid, MODEL_EMBED, start, e1, name, {**base, "embedding_cache": cache, "items": evidence})
    if ctx.fwd is not None:
        f0, f1 = clock.host(ctx.fwd[0]), clock.host(ctx.fwd[1])
        # the LM's part starts where the media embedding ended: the generic routine's model.embed, or,
        # for a model that encodes inside its own forward (LLaVA, the transformers backend), its encoder
        done = embed_end if embed_end is not None else vit_end
        start = done if done is not None and f0 <= done <= f1 else f0
        ss.emit(rids, MODEL_PREFILL, start, f1, name, base)
    if ctx.sample is not None:
        ss.emit(rids, MODEL_SAMPLE, clock.host(ctx.sample[0]), clock.host(ctx.sample[1]), name, base)


def _embedding_evidence(
    items: list[tuple[Any, str]], encoded: set[Any], lookups: dict[Any, bool], seen: frozenset[str]
) -> dict[str, list[int]]:
    """Per modality, [items overlapping the extend, proved hits, proved misses] of one request in one
    forward (``join.outcomes.Embedding``): an item an encoder call took missed; else its first lookup
    decides, a found entry only where the modality's encoder calls are seen."""
    out: dict[str, list[int]] = {}
    for h, modality in items:
        counts = out.setdefault(modality, [0, 0, 0])
        counts[0] += 1
        if h in encoded:
            counts[2] += 1
        elif h in lookups:
            if not lookups[h]:
                counts[2] += 1
            elif modality in seen:
                counts[1] += 1
    return out


def _emit_skipped_encoder(ctx: ss.FwdCtx, base: dict[str, Any]) -> None:
    """A zero-length ``model.vision_encoder`` with ``skipped`` for requests whose images were all in
    the radix prefix: the contract's marker that the encoder did not need to run (no time is claimed)."""
    at = ctx.clock.host(ctx.fwd[0]) if ctx.fwd is not None else ctx.t0
    for tr in ctx.traces:
        if tr.vit_skipped:
            attrs = {**base, "images": tr.vit_skipped, "embedding_cache": "off", "skipped": True}
            ss.emit(tr.rid, MODEL_VISION_ENCODER, at, at, ctx.clock.name, attrs)
            tr.vit_skipped = 0  # once per request, also when a chunked prefill spans several forwards


def _result_exit(st, t0, t1, instance, args, kwargs, result, exc) -> None:
    batch = arg(args, kwargs, 0, "batch")
    ctxs: dict[int, ss.FwdCtx] = {}
    first = []
    for req in batch.reqs:
        tr = getattr(req, "_mmtrace", None)
        if tr is None or tr.fwd is None:
            continue
        if tr.admission is not None:
            _emit_admission(req, tr)
        ctxs[id(tr.fwd)] = tr.fwd
        tr.fwd, tr.fwd_next = tr.fwd_next, None
        if not tr.first_token and _has_output(req):
            tr.first_token = True
            first.append(req.rid)
    for ctx in ctxs.values():
        if ss.current is ctx:
            ss.current = None  # do not keep the batch's requests alive while the scheduler idles
        _emit_forward(ctx)
        _emit_model_stages(ctx, ctx.batch_size)
        ctx.traces = []  # read once; no trace -> forward -> trace cycle is left for the GC
        ready = max(ctx.t1, ctx.t_sample_end or ctx.t1)
        if t0 > ready:
            # Overlap scheduling: the result waits while the scheduler launches the next batch.
            ss.emit(ctx.rids, SCHEDULER_OVERLAP_WAIT, ready, t0, attrs={"batch_size": ctx.batch_size})
    if first:
        # The hand-off ends when stream_output returned; the function goes on with metrics reporting.
        end = ss.last_stream_end if t0 <= ss.last_stream_end <= t1 else t1
        ss.emit(tuple(first), SCHEDULER_OUTPUT, t0, end, attrs={"batch_size": len(batch.reqs)})


def _has_output(req: Any) -> bool:
    return bool(getattr(req, "output_ids", None)) or req.finished()


def _output_detail(instance: Any, args: tuple, kwargs: dict) -> tuple[str, ...] | None:
    batch = arg(args, kwargs, 0, "batch")
    rids = [r.rid for r in batch.reqs if getattr(getattr(r, "_mmtrace", None), "fwd", None) is not None]
    return tuple(rids) if rids else None


def _stream_exit(st, t0, t1, instance, args, kwargs, result, exc) -> None:
    """``stream_output`` (every decode step of every request): when the hand-off to the detokenizer ended."""
    ss.last_stream_end = t1


PART = "scheduler"  # the switch part that gates these hooks

HOOKS: dict[str, HookSpec] = {
    "batch_result.stream_output": interval("batch_result.stream_output", _stream_exit),
    "batch_result.prefill": interval("batch_result.prefill", _result_exit, nvtx=(SCHEDULER_OUTPUT, _output_detail)),
}

# the arguments each hook reads from its target (registry.READS_OF)
READS: dict[str, tuple[tuple[int | None, str | None], ...]] = {
    "batch_result.prefill": ((0, "batch"),),
}
