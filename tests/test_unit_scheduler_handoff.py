"""Before a request's first token is handed to the detokenizer, the scheduler's hooks only store times.

Its events (``scheduler.queue``, ``scheduler.prefix_match``, ``scheduler.batch``, ``model.forward``
and the model stages) are built when the prefill result has been processed, after ``stream_output``:
that work is then off the first token's way to the client. What admission reads must still be what
it was at admission (the prefill changes the cached tokens and the prefix). The real hook wrappers
run around stand-ins of SGLang's ``Req``, ``ScheduleBatch`` and scheduler methods.
"""

from __future__ import annotations

from collections.abc import Iterator
from types import SimpleNamespace
from typing import Any

import pytest

from sglang_mmtrace import runtime, switch
from sglang_mmtrace.hooks.scheduler import batch_result, schedule_batch, scheduler
from sglang_mmtrace.hooks.scheduler import state as ss


class Box:
    def __init__(self) -> None:
        self.sent: list[tuple[Any, ...]] = []

    def add(self, rids: Any, stage: str, t0: float, t1: float, clock: str = "host", attrs: Any = None) -> None:
        self.sent.append((rids, stage, t0, t1, clock, attrs or {}))

    def one(self, stage: str) -> tuple[Any, ...]:
        (ev,) = [e for e in self.sent if e[1] == stage]
        return ev


class Req:
    """The attributes of SGLang's ``Req`` the scheduler hooks read: one image at tokens 2-9."""

    def __init__(self, rid: str) -> None:
        self.rid = rid
        self.output_ids: list[int] = []
        self.origin_input_ids = list(range(20))
        self.cached_tokens = 0
        self.prefix_indices: list[int] = []
        self.multimodal_inputs = SimpleNamespace(mm_items=[SimpleNamespace(offsets=[(2, 9)])])
        t = ss.now()  # SGLang's own notes: received (``Req.__init__``), queued (``_add_request_to_queue``)
        self.time_stats = SimpleNamespace(scheduler_recv_time=t, wait_queue_entry_time=t + 1e-6)

    def init_next_round_input(self) -> None:  # the radix match: the first 12 tokens are cached
        self.prefix_indices = list(range(12))
        self.cached_tokens = 12

    def finished(self) -> bool:
        return False


@pytest.fixture
def box(monkeypatch: pytest.MonkeyPatch) -> Iterator[Box]:
    b = Box()
    monkeypatch.setattr(runtime, "outbox", b)
    monkeypatch.setattr(ss, "current", None)
    monkeypatch.setattr(ss, "last_stream_end", 0.0)
    yield b


def hook(hook_id: str, module: Any) -> Any:
    return module.HOOKS[hook_id].make("sync")


def matched(req: Req) -> None:
    """The request's first radix match, where its trace is made."""
    hook("schedule_batch.match", schedule_batch)(lambda: None, req, (), {})


def test_admission_is_read_before_the_prefill_and_filed_after_the_hand_off(box: Box) -> None:
    req = Req("A")
    hook("schedule_batch.match", schedule_batch)(lambda: req.init_next_round_input(), req, (), {})
    sb = SimpleNamespace(reqs=[req], forward_mode=SimpleNamespace(is_extend=lambda: True))
    assert hook("scheduler.run_batch", scheduler)(lambda b: "result", None, (sb,), {}) == "result"
    assert box.sent == []  # nothing before the hand-off

    # what the prefill changes after admission: the whole prompt is in the radix cache now
    req.prefix_indices, req.cached_tokens = list(range(20)), 99
    req.output_ids = [7]

    def process_batch_result_prefill(b: Any, res: Any) -> Any:
        scheduler_stream = hook("batch_result.stream_output", batch_result)
        scheduler_stream(lambda reqs: None, None, (b.reqs,), {})
        assert box.sent == []  # handing the first token on: still nothing
        return res

    assert hook("batch_result.prefill", batch_result)(process_batch_result_prefill, None, (sb, "r"), {}) == "r"
    stages = [e[1] for e in box.sent]
    assert stages[:5] == [
        "scheduler.recv",
        "scheduler.queue",
        "scheduler.prefix_match",
        "scheduler.batch",
        "model.forward",
    ]
    assert stages[-1] == "scheduler.output"

    recv, queue, match = box.one("scheduler.recv"), box.one("scheduler.queue"), box.one("scheduler.prefix_match")
    batch, forward = box.one("scheduler.batch"), box.one("model.forward")
    assert recv[3] <= queue[2] and queue[3] == match[2] and match[3] == batch[2] and batch[3] == forward[2]
    assert match[5] == {  # as at admission
        "cached_tokens": 12,
        "prompt_tokens": 20,
        "image_prefix_hit": True,
        "placement": {"image": [1, 1, 0]},  # one image, inside the prefix, placed by its offsets
    }
    assert batch[5] == forward[5] == {"batch_size": 1} and forward[0] == ("A",)
    skipped = box.one("model.vision_encoder")  # the image was in the matched prefix: the encoder's marker
    assert skipped[2] == skipped[3] and skipped[5]["skipped"] is True and skipped[5]["images"] == 1
    assert req._mmtrace.admission is None and req._mmtrace.t_match1 is None  # filed once


def test_the_trace_takes_its_receive_and_queue_times_from_sglangs_own_notes(box: Box, monkeypatch) -> None:
    """No hook on ``_add_request_to_queue``: the first match makes the trace from ``req.time_stats``.
    The receive starts where the ``recv_requests`` call that brought the request started, as long as
    no later call has brought others (else at SGLang's receive time)."""
    recv = hook("scheduler.recv_requests", scheduler)
    recv(lambda: ["msg"], None, (), {})
    first = Req("A")  # received by that call
    matched(first)
    assert first._mmtrace.t_recv == ss.last_recv_start < first.time_stats.scheduler_recv_time
    assert first._mmtrace.t_enqueue == first.time_stats.wait_queue_entry_time
    late = Req("B")  # queued before that call, matched after a later call brought other requests
    recv(lambda: ["other"], None, (), {})
    matched(late)
    assert late._mmtrace.t_recv == late.time_stats.scheduler_recv_time < ss.last_recv_start
    bare = Req("C")  # a release whose Req notes no times: queued at the match's start
    del bare.time_stats
    matched(bare)
    assert bare._mmtrace.t_recv == ss.last_recv_start < bare._mmtrace.t_enqueue
    assert box.sent == []


def test_a_request_queued_before_the_scheduler_hooks_went_back_in_gets_no_trace(box: Box, monkeypatch) -> None:
    """While off, the hooks are out: a request queued then and matched after the flip is not picked up
    half-way (its API side is not recorded either); one queued after the flip is."""
    gate = switch.gate("scheduler")
    monkeypatch.setattr(gate, "since", 0.0)
    before = Req("A")
    gate.set(False)
    try:
        gate.set(True)
        after = Req("B")
        matched(before)
        matched(after)
    finally:
        gate.set(True)
    assert getattr(before, "_mmtrace", None) is None
    assert after._mmtrace.rid == "B"


def test_a_chunked_prefill_files_its_admission_once_and_each_chunks_forward(box: Box) -> None:
    req = Req("A")
    matched(req)
    sb = SimpleNamespace(reqs=[req], forward_mode=SimpleNamespace(is_extend=lambda: True))
    for chunk in range(2):
        hook("scheduler.run_batch", scheduler)(lambda b: "result", None, (sb,), {})
        req.output_ids = [7] if chunk == 1 else []  # the last chunk samples the first token
        hook("batch_result.prefill", batch_result)(lambda b, res: res, None, (sb, "r"), {})
    stages = [e[1] for e in box.sent if e[1] != "scheduler.overlap_wait"]  # result processed after run_batch
    assert stages == [
        "scheduler.recv",
        "scheduler.queue",
        "scheduler.prefix_match",
        "scheduler.batch",
        "model.forward",
        "model.forward",
        "scheduler.output",
    ]
    first, second = [e for e in box.sent if e[1] == "model.forward"]
    assert first[3] <= second[2]


def test_the_overlap_scheduler_launches_the_next_chunk_before_the_last_ones_result(box: Box) -> None:
    """SGLang 0.5.23's overlap scheduler on the CPU: a 6228-token prompt, chunks of 4096 and 2128, ran
    the second chunk's ``run_batch`` before the first chunk's result was processed. A single slot per
    request lost the first chunk (its encoder, embedding and forward) and, with it, the hand-off."""
    req = Req("A")
    matched(req)
    sb = SimpleNamespace(reqs=[req], forward_mode=SimpleNamespace(is_extend=lambda: True))
    run, result = hook("scheduler.run_batch", scheduler), hook("batch_result.prefill", batch_result)
    run(lambda b: "result", None, (sb,), {})
    first_ctx = req._mmtrace.fwd
    run(lambda b: "result", None, (sb,), {})
    assert req._mmtrace.fwd is first_ctx and req._mmtrace.fwd_next is not first_ctx
    result(lambda b, res: res, None, (sb, "r"), {})  # the first chunk's result: no token yet
    assert [e[1] for e in box.sent if e[1] == "scheduler.output"] == []
    req.output_ids = [7]  # the last chunk samples the first token
    result(lambda b, res: res, None, (sb, "r"), {})
    forwards = [e for e in box.sent if e[1] == "model.forward"]
    assert len(forwards) == 2 and forwards[0][3] <= forwards[1][2]
    assert forwards[0][2] == first_ctx.t0  # the first chunk's forward, filed with the first result
    assert [e[1] for e in box.sent].count("scheduler.output") == 1
    assert req._mmtrace.fwd is None and req._mmtrace.fwd_next is None and req._mmtrace.first_token


def test_a_mixed_batch_decode_step_is_no_part_of_the_prefill(box: Box) -> None:
    """``--enable-mixed-chunk`` on the CPU server: the last chunk's sampled token was not on record
    yet (its result comes after the next launch) when a mixed batch decoded the request, and the
    record had a third forward, with an ``overlap_wait`` past the request's TTFT."""
    req = Req("A")
    matched(req)
    mode = SimpleNamespace(is_extend=lambda: True)
    last_chunk = SimpleNamespace(reqs=[req], forward_mode=mode, decoding_reqs=None)
    run, result = hook("scheduler.run_batch", scheduler), hook("batch_result.prefill", batch_result)
    run(lambda b: "result", None, (last_chunk,), {})
    other = Req("B")
    matched(other)
    mixed = SimpleNamespace(reqs=[other, req], forward_mode=mode, decoding_reqs=[req])
    run(lambda b: "result", None, (mixed,), {})
    assert req._mmtrace.fwd_next is None and other._mmtrace.fwd.rids == ("B",)
    req.output_ids = [7]
    result(lambda b, res: res, None, (last_chunk, "r"), {})
    assert [e[0] for e in box.sent if e[1] == "model.forward"] == [("A",)]
    assert req._mmtrace.fwd is None and req._mmtrace.first_token


def test_the_prefix_match_range_names_a_request_from_its_first_match(box: Box) -> None:
    """The range is pushed before the call, when a request's first match has no trace yet (its exit
    step makes it): it still names the rid, and no longer once the request is admitted."""
    req = Req("A")
    assert schedule_batch._match_detail(req, (), {}) == "A"
    matched(req)
    assert schedule_batch._match_detail(req, (), {}) == "A"
    req._mmtrace.admitted = True
    assert schedule_batch._match_detail(req, (), {}) is None


def test_the_forwards_image_owners_are_read_from_the_batch_at_its_launch(box: Box) -> None:
    """No hook on the model's embedding routine: which requests a prefill embeds (an image overlapping
    its extend range) and which rid owns which image are read from the ScheduleBatch's per-request
    lists when ``run_batch`` starts. A request whose image lies in its cached prefix embeds nothing;
    an untraced request of the batch still owns its image (the encoder's NVTX range names it)."""
    new, cached, text, untraced = Req("new"), Req("cached"), Req("text"), Req("untraced")
    for r in (new, cached, text):
        matched(r)
    items = {r.rid: SimpleNamespace(hash=i, offsets=[(2, 9)]) for i, r in enumerate((new, cached, untraced))}
    batch = SimpleNamespace(
        reqs=[new, cached, text, untraced],
        forward_mode=SimpleNamespace(is_extend=lambda: True),
        decoding_reqs=None,
        multimodal_inputs=[
            SimpleNamespace(mm_items=[items[r.rid]]) if r.rid in items else None for r in (new, cached, text, untraced)
        ],
        prefix_lens=[0, 12, 0, 0],  # "cached": its image's tokens (2-9) are in the radix prefix
        extend_lens=[20, 8, 5, 20],
    )
    seen: list[ss.FwdCtx] = []
    hook("scheduler.run_batch", scheduler)(lambda b: seen.append(ss.current), None, (batch,), {})
    (ctx,) = seen
    assert ctx.rids == ("new", "cached", "text")
    assert ctx.needs_embed == {"new": [(0, "image")], "untraced": [(2, "image")]}
    assert ctx.hash_to_rids == {0: ["new"], 1: ["cached"], 2: ["untraced"]}

    # a text prefill: no image anywhere in the batch, nothing read past the list
    other = Req("plain")
    matched(other)
    plain = SimpleNamespace(reqs=[other], forward_mode=batch.forward_mode, decoding_reqs=None, multimodal_inputs=[None])
    hook("scheduler.run_batch", scheduler)(lambda b: seen.append(ss.current), None, (plain,), {})
    assert seen[-1].needs_embed == {} and seen[-1].hash_to_rids == {}
