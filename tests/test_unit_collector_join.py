"""The cross-process join in ``build_record``: hops and clamps that only the join can see.

Real-server records pin the same rules under load (``tests/test_server_robustness.py``'s causal
order check caught the regression this file pins: an image request's ``scheduler.recv`` starting
before ``dispatch`` because the transport join copied the event before the clamp moved it).
"""

from __future__ import annotations

import pytest

from sglang_mmtrace.join.collector import build_record, fold_parallel_sampling
from sglang_mmtrace.join.context import ApiTrace
from sglang_mmtrace.join.record import StageEvent


def trace_with_dispatch(transport_bytes: int) -> ApiTrace:
    tr = ApiTrace("rid-1", None, "m", t_created=100.0)
    tr.events = [
        StageEvent("tokenize", "api", 100.001, 100.020),
        StageEvent("dispatch", "api", 100.021, 100.024),
        StageEvent("transport.prepare", "api", 100.0215, 100.0225, attrs={"mode": "cpu", "bytes": transport_bytes}),
    ]
    tr.transport_mode = "cpu" if transport_bytes else None
    tr.transport_bytes = transport_bytes
    tr.dispatched = True
    tr.t_first_output = 100.060
    tr.t_finished = 100.070
    return tr


@pytest.mark.parametrize("transport_bytes", [0, 1572864])
def test_scheduler_recv_starts_no_earlier_than_the_request_was_sent(transport_bytes: int) -> None:
    # recv_requests started polling at 100.019, before the API sent the request (prepared until 100.0225)
    remote = [
        StageEvent("scheduler.recv", "scheduler", 100.019, 100.030),
        StageEvent("scheduler.queue", "scheduler", 100.030, 100.031),
    ]
    rec = build_record(trace_with_dispatch(transport_bytes), remote, "0.5.23", 0.0)
    (recv,) = [s for s in rec["stages"] if s["name"] == "scheduler.recv"]
    (dispatch,) = [s for s in rec["stages"] if s["name"] == "dispatch"]
    assert recv["start_s"] >= dispatch["start_s"]
    assert recv["start_s"] == pytest.approx(0.0225, abs=1e-9)
    assert recv["dur_s"] == pytest.approx(0.0075, abs=1e-9)
    assert recv["attrs"]["poll_started_s"] == pytest.approx(0.0035, abs=1e-9)
    if transport_bytes:
        assert (recv["attrs"]["mode"], recv["attrs"]["bytes"]) == ("cpu", transport_bytes)


def test_a_chunked_prefill_gives_each_stage_one_interval() -> None:
    """SGLang's CPU server chunks at 4096 tokens: CI's 64-client load test batched a new image
    request's first chunk with 63 others and ran its second chunk alone, and the record carried
    ``model.forward`` (and each ``model.*``) twice. The contract: once per request, parts as attrs."""
    shared = {"batch_size": 64}  # one dict for every request of the batch: must not be edited
    remote = [
        StageEvent("scheduler.recv", "scheduler", 100.025, 100.030),
        StageEvent("model.forward", "scheduler", 100.030, 100.050, attrs=shared),
        StageEvent(
            "model.embed",
            "scheduler",
            100.040,
            100.041,
            attrs={**shared, "embedding_cache": "miss", "items": {"image": [1, 0, 1]}},
        ),
        StageEvent("model.prefill", "scheduler", 100.041, 100.050, attrs=shared),
        StageEvent("model.forward", "scheduler", 100.052, 100.056, attrs={"batch_size": 1}),
        StageEvent(
            "model.embed",
            "scheduler",
            100.052,
            100.0525,
            attrs={"batch_size": 1, "embedding_cache": "hit", "items": {"image": [1, 1, 0]}},
        ),
        StageEvent("model.prefill", "scheduler", 100.0525, 100.056, attrs={"batch_size": 1}),
        StageEvent("scheduler.output", "scheduler", 100.056, 100.058),
    ]
    trace = trace_with_dispatch(1572864)
    trace.media = {"image": 1}
    rec = build_record(trace, remote, "0.5.23", 0.0)
    got = {s["name"]: s for s in rec["stages"]}
    assert [s["name"] for s in rec["stages"]].count("model.forward") == 1
    assert len(rec["stages"]) == len(got)
    fwd = got["model.forward"]
    assert (fwd["start_s"], fwd["dur_s"]) == (pytest.approx(0.030, abs=1e-9), pytest.approx(0.026, abs=1e-9))
    assert fwd["attrs"] == {"batch_size": 64, "chunks": 2, "chunks_s": pytest.approx(0.024, abs=1e-9)}
    embed = got["model.embed"]  # where the request entered: the first chunk computed the embedding
    assert embed["attrs"]["embedding_cache"] == "miss" and embed["attrs"]["chunks"] == 2
    assert rec["cache"]["embedding"] == "miss"
    assert got["model.prefill"]["start_s"] == pytest.approx(0.041, abs=1e-9)
    assert "chunks" not in got["scheduler.recv"]["attrs"] and "chunks" not in got["scheduler.output"]["attrs"]
    assert shared == {"batch_size": 64}


def test_per_image_stages_keep_one_interval_per_image() -> None:
    tr = trace_with_dispatch(0)
    tr.events += [StageEvent("mm.decode", "api", 100.002, 100.004), StageEvent("mm.decode", "api", 100.004, 100.007)]
    remote = [StageEvent("scheduler.recv", "scheduler", 100.025, 100.030)]
    rec = build_record(tr, remote, "0.5.23", 0.0)
    decodes = [s for s in rec["stages"] if s["name"] == "mm.decode"]
    assert [round(s["dur_s"], 6) for s in decodes] == [0.002, 0.003] and all(not s["attrs"] for s in decodes)


def _trace(rid: str, dispatched: bool, tokenized: bool, t_created: float) -> ApiTrace:
    tr = ApiTrace(rid, None, "m", t_created=t_created)
    tr.dispatched = dispatched
    if tokenized:
        tr.events = [StageEvent("tokenize", "api", t_created, t_created + 0.005)]
        tr.images = [{"width": 256, "height": 256}]
        tr.preprocess = ["miss"]
    if dispatched:
        tr.events.append(StageEvent("dispatch", "api", t_created + 0.01, t_created + 0.011))
    return tr


def test_parallel_sampling_folds_the_prompt_into_its_prefix_request_and_samples() -> None:
    """``n=2`` on SGLang 0.5.23, as the API process ships it: the prompt's rids (one tokenized, both
    never sent), the prefix request, then the two samples, in that order."""
    p0, p1 = _trace("u_0", False, True, 1.0), _trace("u_1", False, False, 1.0)
    warm, s1, s2 = _trace("w", True, False, 1.02), _trace("s1", True, False, 1.08), _trace("s2", True, False, 1.08)
    kept, prompts = fold_parallel_sampling([p0, p1, warm, s1, s2])
    assert kept == [warm, s1, s2] and prompts == [p0, p1]
    assert warm.warmup and not s1.warmup and not s2.warmup
    for tr in kept:
        assert [e.name for e in tr.events] == ["tokenize", "dispatch"]
        assert tr.t_created == 1.0 and tr.images == p0.images and tr.preprocess == ["miss"]


def test_two_prompts_with_two_samples_each_map_in_sending_order() -> None:
    prompts = [_trace(f"p{i}", False, True, float(i)) for i in range(2)] + [_trace("p2", False, False, 0.0)]
    prompts += [_trace("p3", False, False, 0.0)]
    sent = [_trace(r, True, False, 5.0) for r in ("w0", "w1", "a0", "a1", "b0", "b1")]
    kept, dropped = fold_parallel_sampling(prompts + sent)
    assert kept == sent and dropped == prompts
    assert [tr.t_created for tr in kept] == [0.0, 1.0, 0.0, 0.0, 1.0, 1.0]
    assert [tr.warmup for tr in kept] == [True, True, False, False, False, False]


def test_other_exchanges_are_left_as_they_are() -> None:
    batch = [_trace("a", True, True, 1.0), _trace("b", True, True, 1.0)]  # a batch of two prompts, n=1
    assert fold_parallel_sampling(batch) == (batch, [])
    failed = _trace("c", False, True, 1.0)
    failed.error_class = "ValueError"  # tokenization failed: the prompts after it were never reached
    late = [_trace("a", True, True, 1.0), failed, _trace("d", False, False, 1.0)]
    assert fold_parallel_sampling(late) == (late, [])
    assert not any(tr.warmup for tr in late)
    one = [_trace("x", False, True, 1.0)]
    assert fold_parallel_sampling(one) == (one, [])


def test_a_language_only_servers_wait_for_the_encoder_is_its_own_stage() -> None:
    """Encoder disaggregation (zmq_to_scheduler): the language scheduler takes the request only once the
    encoder server's embeddings arrived. That second is remote work: filed as scheduler.encoder_wait,
    never as the local inbox's wait (issue 53: 1.0 s of a 1.09 s TTFT had been scheduler.inbox_wait)."""
    remote = [
        StageEvent("scheduler.recv", "scheduler", 100.040, 100.045),
        StageEvent("scheduler.output", "scheduler", 100.050, 100.051),
    ]
    local = build_record(trace_with_dispatch(0), list(remote), "0.5.23", 0.0)
    names = {s["name"] for s in local["stages"]}
    assert "scheduler.inbox_wait" in names and "scheduler.encoder_wait" not in names
    epd = trace_with_dispatch(0)
    epd.remote_encoder = "zmq_to_scheduler"
    rec = build_record(epd, [StageEvent(e.name, e.process, e.t0, e.t1) for e in remote], "0.5.23", 0.0)
    (wait,) = [s for s in rec["stages"] if s["name"] == "scheduler.encoder_wait"]
    assert "scheduler.inbox_wait" not in {s["name"] for s in rec["stages"]}
    assert wait["dur_s"] == pytest.approx(0.040 - 0.024, abs=1e-9)  # dispatch end -> the scheduler's receive
    # zmq_to_tokenizer waits in the API process (inside tokenize): the hop stays the inbox's
    tok = trace_with_dispatch(0)
    tok.remote_encoder = "zmq_to_tokenizer"
    rec = build_record(tok, [StageEvent(e.name, e.process, e.t0, e.t1) for e in remote], "0.5.23", 0.0)
    assert "scheduler.inbox_wait" in {s["name"] for s in rec["stages"]}
