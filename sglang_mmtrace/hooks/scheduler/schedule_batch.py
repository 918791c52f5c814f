"""Req (scheduler process): a request's trace and its adopted radix prefix match, and what admission reads."""

from __future__ import annotations

from typing import Any

from ... import switch
from ...stages import SCHEDULER_PREFIX_MATCH
from ..base import HookSpec, interval
from . import state as ss

_on = switch.gate("scheduler")


def _match_exit(st, t0, t1, instance, args, kwargs, result, exc) -> None:
    tr = getattr(instance, "_mmtrace", None)
    if tr is None:
        tr = new_trace(instance, t0)
        if tr is None:
            return
    if not tr.admitted:
        tr.t_match0, tr.t_match1 = t0, t1  # the last match before admission is the adopted one


def new_trace(req: Any, t_match: float) -> ss.ReqTrace | None:
    """A request's trace, made at its first radix match (the first time the scheduler's hooks see it).

    Its receive and queue entry are what SGLang noted itself (``req.time_stats``: set in ``Req``'s
    constructor and in ``_add_request_to_queue``, ``perf_counter`` as ours): the receive starts where
    the ``recv_requests`` call that brought it did, when that call is still the last one to bring
    requests (else at SGLang's own receive time). Without those times (a release that notes none) it
    was queued at the match's start. None for a request queued before the scheduler's hooks were last
    switched on: its receive was not watched, and its API side is not recorded either.
    """
    stats = getattr(req, "time_stats", None)
    t_queue = getattr(stats, "wait_queue_entry_time", 0.0) or t_match
    if t_queue < _on.since:
        return None
    t_recv = getattr(stats, "scheduler_recv_time", 0.0) or t_queue
    if 0 < ss.last_recv_start <= t_recv:
        t_recv = ss.last_recv_start
    tr = req._mmtrace = ss.ReqTrace(t_recv, t_queue, req.rid)
    return tr


def modality(item: Any) -> str:
    """An item's modality as the record names it (``Modality.IMAGE`` -> ``image``)."""
    return str(getattr(getattr(item, "modality", None), "name", "image")).lower()


def item_spans(req: Any, item: Any) -> list[tuple[int, int]] | None:
    """Where an item lies in the prompt (inclusive token spans): its ``offsets``, or where a model sets
    none (SGLang's LLaVA), the runs of its ``pad_value`` in the prompt's ids, the value SGLang's
    ``pad_input_ids`` wrote there and the radix key matches on. None when neither is known."""
    offsets = getattr(item, "offsets", None)
    if offsets:
        return [(int(s), int(e)) for s, e in offsets]
    pad = getattr(item, "pad_value", None)
    ids = getattr(req, "origin_input_ids", None)
    if pad is None or not ids:
        return None
    spans: list[tuple[int, int]] = []
    start = -1
    for i, tok in enumerate(ids):
        if tok == pad:
            if start < 0:
                start = i
        elif start >= 0:
            spans.append((start, i - 1))
            start = -1
    if start >= 0:
        spans.append((start, len(ids) - 1))
    return spans or None


def placement(req: Any, prefix: int) -> dict[str, list[int]]:
    """Per modality, [items, items inside a prefix of ``prefix`` tokens, items not placed]: the evidence
    of ``cache.image_prefix_hit`` and of an embedding the prefix made unnecessary (``join.outcomes``)."""
    mm = getattr(req, "multimodal_inputs", None)
    out: dict[str, list[int]] = {}
    for item in getattr(mm, "mm_items", None) or () if mm is not None else ():
        counts = out.setdefault(modality(item), [0, 0, 0])
        counts[0] += 1
        spans = item_spans(req, item)
        if spans is None:
            counts[2] += 1
        elif all(e < prefix for _, e in spans):
            counts[1] += 1
    return out


def vision_in_prefix(placed: dict[str, list[int]]) -> int:
    """Images and videos of a request whose items all lie inside its prefix (else 0): the encoder runs
    the prefix made unnecessary (``model.vision_encoder``'s ``skipped`` marker)."""
    if not placed or any(c[2] or c[1] < c[0] for c in placed.values()):
        return 0
    return sum(c[0] for m, c in placed.items() if m != "audio")


def admit(req: Any, tr: ss.ReqTrace, t: float) -> None:
    """Admission into a prefill forward (``scheduler.run_batch``): fix the adopted match's times and read
    what the prefill will change (the cached tokens, the prefix length), as ``prepare_for_extend`` left
    them; the events are built after the first token's hand-off (``batch_result``). Read at the forward's
    launch rather than from a hook on ``prepare_for_extend``: one hooked call less before the first token."""
    tr.admitted = True
    if tr.t_match0 is None:
        tr.t_match0 = t
    if tr.t_match1 is None:
        tr.t_match1 = t
    prefix = getattr(req, "prefix_len", None)  # the prefix length: an int, or SGLang's prefix indices
    if not isinstance(prefix, int):
        indices = getattr(req, "prefix_indices", None)
        prefix = len(indices) if indices is not None else 0
    tr.admission = (getattr(req, "cached_tokens", 0), prefix)


def scan_images(ctx: ss.FwdCtx, batch: Any) -> None:
    """Which requests of a prefill batch need media embeddings (``ctx.needs_embed``: rid -> (hash,
    modality) of its items overlapping this extend) and which rid owns which item hash (``ctx.hash_to_rids``), read from the
    ``ScheduleBatch`` at the forward's launch (``scheduler.run_batch``). Its per-request lists (the
    multimodal inputs, prefix and extend lengths, every release 0.5.17-0.5.23) are what SGLang builds the
    forward batch from, so no hook on the model's embedding routine is needed to read them: one hooked
    call less in every forward. Called for a batch with an image (``run_batch`` tests that inline)."""
    mm_inputs = batch.multimodal_inputs
    reqs = batch.reqs
    prefix_lens = getattr(batch, "prefix_lens", None) or ()
    extend_lens = getattr(batch, "extend_lens", None) or ()
    for i, mm in enumerate(mm_inputs):
        if mm is None or i >= len(reqs):
            continue
        rid = reqs[i].rid
        lo = prefix_lens[i] if i < len(prefix_lens) else 0
        hi = lo + (extend_lens[i] if i < len(extend_lens) else 0)
        overlapping = []
        for item in getattr(mm, "mm_items", None) or ():
            ctx.hash_to_rids.setdefault(item.hash, []).append(rid)
            if any(s < hi and e >= lo for s, e in (item_spans(reqs[i], item) or ())):
                overlapping.append((item.hash, modality(item)))
        if overlapping:
            ctx.needs_embed[rid] = overlapping


def _match_detail(instance: Any, args: tuple, kwargs: dict) -> str | None:
    # pushed before the call: a request's first match has no trace yet (its exit step makes it)
    tr = getattr(instance, "_mmtrace", None)
    return instance.rid if tr is None or not tr.admitted else None


PART = "scheduler"  # the switch part that gates these hooks

HOOKS: dict[str, HookSpec] = {
    "schedule_batch.match": interval("schedule_batch.match", _match_exit, nvtx=(SCHEDULER_PREFIX_MATCH, _match_detail)),
}

# the arguments each hook reads from its target (registry.READS_OF)
READS: dict[str, tuple[tuple[int | None, str | None], ...]] = {}
