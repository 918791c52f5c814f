"""The collector process's protocol without SGLang: the wire form of a finished request, records
joined from API and peer messages, the admin socket's state, and a switch flip confirmed by a peer.

The collector runs on a thread here (``Collector.start``) with its real ZMQ sockets; the peer is a
plain SUB + PUSH pair speaking the outbox's messages.
"""

from __future__ import annotations

import pickle
import time

import pytest
import zmq

from sglang_mmtrace import switch
from sglang_mmtrace.config import Config
from sglang_mmtrace.join.client import admin_request
from sglang_mmtrace.join.collector import Collector, build_record
from sglang_mmtrace.join.context import NOT_SHIPPED, ApiTrace, HttpCtx, from_wire, to_wire
from sglang_mmtrace.join.record import StageEvent


def _trace(rid: str, dispatched: bool) -> ApiTrace:
    http = HttpCtx(100.0, "/v1/chat/completions")
    http.t_handle, http.t_first_body, http.t_last_body, http.status_code = 100.001, 100.05, 100.06, 200
    trace = ApiTrace(rid, http, "tiny", 100.003)
    http.traces.append(trace)
    trace.add("tokenize", 100.003, 100.010)
    trace.add("dispatch", 100.010, 100.011)
    trace.dispatched = dispatched
    trace.t_first_output = 100.049
    trace.t_finished = 100.055
    trace.output_tokens = 3
    return trace


def test_wire_form_keeps_every_field():
    """The API side keeps its events as wire tuples; the collector gets ``StageEvent``s with the same fields."""
    trace = _trace("r1", True)
    back = from_wire(pickle.loads(pickle.dumps(to_wire(trace))))
    events = ("events",)
    for name in ApiTrace.__slots__:
        if name not in (*NOT_SHIPPED, *events):  # read into events before the hand-over
            assert getattr(back, name) == getattr(trace, name), name
    assert len(to_wire(trace)[0]) == len(ApiTrace.__slots__) - len(NOT_SHIPPED)
    for name in HttpCtx.__slots__:
        if name not in ("traces", *events):
            assert getattr(back.http, name) == getattr(trace.http, name), name
    assert back.events == [StageEvent(*e) for e in trace.events] and len(back.events) == 2
    assert all(type(e) is StageEvent for e in back.events)
    assert back.http.traces == [back]


class ListSink:
    PART = "jsonl"

    def __init__(self) -> None:
        self.records: list[dict] = []
        self.pids: list[dict[str, int]] = []

    def emit(self, record, ctx) -> None:
        self.records.append(record)
        self.pids.append(ctx.pids)


@pytest.fixture
def collector():
    sink = ListSink()
    col = Collector(Config(grace_s=5.0), [sink], "0.5.23")
    col.start()
    ctx = zmq.Context.instance()
    push = ctx.socket(zmq.PUSH)
    push.setsockopt(zmq.LINGER, 0)
    push.connect(col.address)
    yield col, sink, push
    push.close()
    switch.apply(switch.Setting(True, switch.PARTS), switch.generation + 1)


def _wait(cond, timeout: float = 5.0) -> None:
    deadline = time.monotonic() + timeout
    while not cond():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.01)


def test_record_joins_api_trace_and_peer_events(collector):
    col, sink, push = collector
    push.send(pickle.dumps(("hb", "scheduler", 7, {"errors": {}, "dropped": {"outbox": 2}})))
    push.send(pickle.dumps(("api", "api", 11, ([to_wire(_trace("r1", True))], {"errors": {"x": 1}, "dropped": {}}))))
    time.sleep(0.1)
    assert sink.records == []  # dispatched: waits for the scheduler's last stage
    events = [
        ("r1", "scheduler.recv", 100.012, 100.013, "host", {}),
        (("r1",), "scheduler.output", 100.040, 100.045, "host", {}),
    ]
    push.send(pickle.dumps(("ev", "scheduler", 7, events)))
    _wait(lambda: sink.records)
    (rec,) = sink.records
    assert rec["rid"] == "r1" and rec["status"] == "ok"
    names = [s["name"] for s in rec["stages"]]
    assert {
        "request",
        "http.parse",
        "openai.convert",
        "tokenize",
        "dispatch",
        "scheduler.recv",
        "scheduler.output",
    } <= set(names)
    assert "scheduler.inbox_wait" in names  # joined across the two processes
    st = admin_request(col.admin_address, ("state",))
    assert st["api"]["records"] == 1 and st["api"]["finishing"] == 0 and st["api"]["remote_pending"] == 0
    assert st["api"]["errors"] == {"x": 1} and st["peers"]["scheduler:7"]["dropped"] == {"outbox": 2}
    assert sink.pids == [{"api": 11, "scheduler": 7}]  # the pids of the processes that sent its parts


def test_each_record_names_the_api_process_that_served_it(collector):
    """Tokenizer workers (``--tokenizer-worker-num`` > 1): several API processes ship to one collector."""
    col, sink, push = collector
    for pid, rid in ((21, "w1"), (22, "w2"), (21, "w3")):
        push.send(pickle.dumps(("api", "api", pid, ([to_wire(_trace(rid, False))], None))))
    _wait(lambda: len(sink.records) == 3)
    assert {r["rid"]: p["api"] for r, p in zip(sink.records, sink.pids, strict=True)} == {"w1": 21, "w2": 22, "w3": 21}


def test_a_joined_workers_counters_come_from_its_heartbeats_only(collector):
    """A worker with an outbox (peer ``api:<pid>``) also sends its health with its requests: counted once."""
    col, sink, push = collector
    push.send(pickle.dumps(("hb", "api", 31, {"errors": {"w": 2}, "dropped": {}})))
    sample = {"preprocess": {"used_bytes": 5}}
    health = {"errors": {"w": 2}, "dropped": {}, "occupancy": sample}
    push.send(pickle.dumps(("api", "api", 31, ([to_wire(_trace("w4", False))], health))))
    _wait(lambda: sink.records)
    st = admin_request(col.admin_address, ("state",))
    assert st["api"]["errors"] == {} and st["peers"]["api:31"]["errors"] == {"w": 2}
    assert col._occupancy()[("api", "", "")]["preprocess"] == sample["preprocess"] and sink.pids == [{"api": 31}]


def test_occupancy_is_keyed_by_role_and_rank_never_by_pid(collector):
    """Schedulers by their ranks (their heartbeats'); the API process and its tokenizer workers summed as ``api``."""
    col, sink, push = collector
    emb = {"embedding": {"used_bytes": 10, "entries": 1}}
    for pid, dp in ((41, "0"), (42, "1")):
        push.send(pickle.dumps(("hb", "scheduler", pid, {"occupancy": emb, "ranks": {"dp_rank": dp, "tp_rank": "0"}})))
    push.send(pickle.dumps(("hb", "detokenizer", 43, {"errors": {}})))  # samples nothing
    for pid in (51, 52):  # two tokenizer workers with outboxes
        push.send(pickle.dumps(("hb", "api", pid, {"errors": {}, "dropped": {}})))
        health = {"occupancy": {"preprocess": {"used_bytes": pid, "entries": 1}}}
        push.send(pickle.dumps(("api", "api", pid, ([to_wire(_trace(f"w{pid}", False))], health))))
    _wait(lambda: len(sink.records) == 2)
    got = col._occupancy()
    assert set(got) == {("scheduler", "0", "0"), ("scheduler", "1", "0"), ("api", "", "")}, got
    assert got[("scheduler", "1", "0")] == emb
    assert got[("api", "", "")]["preprocess"] == {"used_bytes": 51 + 52, "entries": 2}


def test_discarded_request_leaves_no_record_and_no_pending_events(collector):
    col, sink, push = collector
    trace = _trace("r2", True)
    trace.discard = True
    push.send(pickle.dumps(("ev", "scheduler", 7, [("r2", "scheduler.recv", 100.012, 100.013, "host", {})])))
    push.send(pickle.dumps(("api", "api", 11, ([to_wire(trace)], None))))
    push.send(pickle.dumps(("ev", "scheduler", 7, [(("r2",), "scheduler.output", 100.04, 100.045, "host", {})])))
    _wait(lambda: admin_request(col.admin_address, ("state",))["api"]["switch_discarded"] == 1)
    st = admin_request(col.admin_address, ("state",))
    assert sink.records == [] and st["api"]["remote_pending"] == 0


def _control_subscriber(col):
    """A socket on the collector's control channel, where it publishes every flip to the processes."""
    sub = zmq.Context.instance().socket(zmq.SUB)
    sub.setsockopt(zmq.SUBSCRIBE, b"")
    sub.setsockopt(zmq.LINGER, 0)
    sub.connect(col.control_address)
    return sub


def test_flip_waits_for_the_peer_then_answers(collector):
    col, sink, push = collector
    sub = _control_subscriber(col)
    push.send(pickle.dumps(("hb", "scheduler", 7, {"switch": switch.snapshot()})))
    _wait(lambda: "scheduler:7" in col._peers)
    gen = switch.generation + 1
    import threading

    answer: dict = {}
    t = threading.Thread(
        target=lambda: answer.setdefault(
            "a", admin_request(col.admin_address, ("flip", gen, False, list(switch.PARTS), None))
        )
    )
    t.start()
    assert sub.poll(5000), "the flip was not published"
    got_gen, on, parts = pickle.loads(sub.recv())
    assert (got_gen, on) == (gen, False)
    assert "a" not in answer  # not confirmed yet
    push.send(pickle.dumps(("hb", "scheduler", 7, {"switch": {"on": False, "parts": [], "generation": gen}})))
    t.join(5)
    confirmed, processes, missing = answer["a"]
    assert confirmed and not missing
    assert processes["scheduler:7"]["generation"] == gen
    assert any(k.startswith("collector:") and v["on"] is False for k, v in processes.items())
    sub.close()


def test_a_request_that_ended_before_a_flip_is_exported_as_it_ran(collector):
    col, sink, push = collector
    on_gen = switch.generation + 1
    assert admin_request(col.admin_address, ("flip", on_gen, True, list(switch.PARTS), None))[0]
    trace = _trace("r3", False)
    trace.http.gen = on_gen  # served (and finished) while everything was on
    gen = on_gen + 1
    confirmed, _, _ = admin_request(col.admin_address, ("flip", gen, False, list(switch.PARTS), None))
    assert confirmed  # no peers to wait for
    push.send(pickle.dumps(("api", "api", 11, ([to_wire(trace)], None))))  # arrives after the flip
    _wait(lambda: sink.records)
    assert sink.records[0]["rid"] == "r3"
    later = _trace("r4", False)
    later.http.gen = gen  # served while off (it would not even be shipped): no record
    push.send(pickle.dumps(("api", "api", 11, ([to_wire(later)], None))))
    time.sleep(0.2)
    assert [r["rid"] for r in sink.records] == ["r3"]


def test_a_superseded_flip_is_answered_at_once_unconfirmed(collector):
    col, sink, push = collector
    push.send(pickle.dumps(("hb", "scheduler", 7, {"switch": switch.snapshot()})))  # never confirms
    _wait(lambda: "scheduler:7" in col._peers)
    import threading

    first: dict = {}
    gen = switch.generation + 1
    t = threading.Thread(
        target=lambda: first.setdefault("a", admin_request(col.admin_address, ("flip", gen, False, [], None)))
    )
    t.start()
    _wait(lambda: col._flip is not None)
    t0 = time.monotonic()
    second = threading.Thread(
        target=lambda: admin_request(col.admin_address, ("flip", gen + 1, True, list(switch.PARTS), None))
    )
    second.start()
    t.join(3)
    assert "a" in first and time.monotonic() - t0 < 3  # not left waiting until its own deadline
    confirmed, _, missing = first["a"]
    assert not confirmed and missing == ["scheduler:7"]
    second.join(10)


def test_a_long_forward_keeps_its_early_events(monkeypatch: pytest.MonkeyPatch) -> None:
    """A cold first request: its first scheduler events ride a heartbeat, then the forward runs for
    10 minutes (JIT compilation); they must still join its record (issue: the first request after
    start-up lost its scheduler stages, orphan-dropped while it ran). Driven on the caller's thread
    with a simulated clock; then events finished remotely but never claimed do expire."""
    from sglang_mmtrace.join import collector as collector_mod

    clock = [1000.0]
    monkeypatch.setattr(collector_mod.time, "perf_counter", lambda: clock[0])
    sink = ListSink()
    col = Collector(Config(grace_s=5.0), [sink], "0.5.23")
    early = [
        ("r1", "scheduler.recv", 100.012, 100.013, "host", {}),
        ("r1", "scheduler.queue", 100.013, 100.02, "host", {}),
    ]
    col._on_message(("ev", "scheduler", 7, early))
    col._on_message(("ev", "scheduler", 7, [("gone", "scheduler.recv", 100.0, 100.1, "host", {})]))
    for _ in range(600):  # ten minutes of collector loop turns, one a second
        clock[0] += 1.0
        col._flush_ready(clock[0])
    assert "r1" in col._remote and "gone" in col._remote  # nothing finished remotely yet: kept
    col._on_message(("ev", "scheduler", 7, [(("r1",), "scheduler.output", 700.0, 700.001, "host", {})]))
    col._on_message(("ev", "scheduler", 7, [(("gone",), "scheduler.output", 700.0, 700.001, "host", {})]))
    col._on_message(("api", "api", 11, ([to_wire(_trace("r1", True))], None)))
    clock[0] += 0.1
    col._flush_ready(clock[0])
    (rec,) = sink.records
    assert {"scheduler.recv", "scheduler.queue", "scheduler.output"} <= {s["name"] for s in rec["stages"]}
    clock[0] += collector_mod.ORPHAN_TTL_S + 1
    col._flush_ready(clock[0])
    assert "gone" not in col._remote and not col._remote_seen  # never claimed: dropped after the TTL


def test_a_lagging_collector_waits_for_its_peers_not_for_a_timer(monkeypatch: pytest.MonkeyPatch) -> None:
    """Under load the collector reads its socket seconds late, and may read a request's API side
    before the scheduler message sent earlier (issue: at 50 requests/s some records went out after
    the grace period with no scheduler stage). A record waits until every live peer's messages sent
    after the request ended were read (their watermarks), however late; a silent peer is not waited
    for beyond the grace period."""
    from sglang_mmtrace.join import collector as collector_mod

    clock = [1000.0]
    monkeypatch.setattr(collector_mod.time, "perf_counter", lambda: clock[0])
    sink = ListSink()
    col = Collector(Config(grace_s=2.0), [sink], "0.5.23")
    col._on_message(("hb", "scheduler", 7, {}, 50.0))
    col._on_message(("hb", "detokenizer", 8, {}, 50.0))
    trace = _trace("r1", True)  # its last body byte: 100.06 on the shared clock
    col._on_message(("api", "api", 11, ([to_wire(trace)], None)))
    for step in range(10):  # ten seconds behind: the peers' older messages trickle in
        clock[0] += 1.0
        col._on_message(("hb", "scheduler", 7, {}, 60.0 + step))
        col._on_message(("hb", "detokenizer", 8, {}, 60.0 + step))
        col._flush_ready(clock[0])
    assert sink.records == []  # far past the grace period, but the peers have not caught up
    events = [
        ("r1", "scheduler.recv", 100.012, 100.013, "host", {}),
        (("r1",), "scheduler.output", 100.04, 100.045, "host", {}),
    ]
    col._on_message(("ev", "scheduler", 7, events, 100.045))
    col._on_message(("hb", "scheduler", 7, {}, 100.5))
    col._flush_ready(clock[0])
    assert sink.records == []  # the detokenizer's messages up to the request's end are still unread
    col._on_message(("hb", "detokenizer", 8, {}, 100.3))
    col._flush_ready(clock[0])
    (rec,) = sink.records  # caught up: no ``detokenize`` can still come
    assert {"scheduler.recv", "scheduler.output"} <= {s["name"] for s in rec["stages"]}
    # a peer that falls silent is not waited for beyond the grace period
    late = _trace("r2", True)
    late.http.t_last_body = 102.0  # ended after every message read so far
    col._on_message(("api", "api", 11, ([to_wire(late)], None)))
    col._flush_ready(clock[0])
    assert len(sink.records) == 1
    clock[0] += 2.5
    col._on_message(("hb", "scheduler", 7, {}, 102.5))  # the scheduler is alive; the detokenizer is gone
    col._flush_ready(clock[0])
    assert [r["rid"] for r in sink.records] == ["r1", "r2"]


def test_openai_convert_runs_from_the_handlers_start_until_the_tokenizer_manager_holds_the_request():
    """``openai.convert`` is SGLang's own times: the OpenAI handler's start (``received_time``, noted
    before the conversion is called) to the trace's creation (after it has returned); ``http.parse``
    ends where it starts. A native endpoint notes no handler's start: no ``openai.convert``, and
    ``http.parse`` runs to the trace's creation."""
    trace = _trace("r1", True)  # arrival 100.0, the handler's start 100.001, the trace made at 100.003
    stages = {s["name"]: s for s in build_record(_received(trace), [], "0.5.23", 0.0)["stages"]}
    convert = stages["openai.convert"]
    assert convert["start_s"] == pytest.approx(0.001) and convert["dur_s"] == pytest.approx(0.002)
    assert convert["attrs"] == {}
    assert stages["http.parse"]["start_s"] == 0.0 and stages["http.parse"]["dur_s"] == pytest.approx(0.001)

    native = _trace("r2", True)
    native.http.path, native.http.t_handle = "/generate", None
    stages = {s["name"]: s for s in build_record(_received(native), [], "0.5.23", 0.0)["stages"]}
    assert "openai.convert" not in stages
    assert stages["http.parse"]["start_s"] == 0.0 and stages["http.parse"]["dur_s"] == pytest.approx(0.003)


def _received(trace: ApiTrace) -> ApiTrace:
    """The trace as the collector process gets it."""
    return from_wire(pickle.loads(pickle.dumps(to_wire(trace))))


def test_a_window_s_records_carry_it_and_a_user_flip_s_do_not(collector):
    """The collector marks the records of a generation a tracing window opened (``windows.py``) with
    the record field ``window``, and sets the Prometheus gauge's state; a user's flip marks nothing."""
    col, sink, push = collector
    window = {"window_s": 10.0, "period_s": 60.0}
    gen = switch.generation + 1
    assert admin_request(col.admin_address, ("flip", gen, True, list(switch.PARTS), {**window, "open": True}))[0]
    assert col.window == ("10s/60s", True)
    inside = _trace("w-in", False)
    inside.http.gen = gen
    push.send(pickle.dumps(("api", "api", 11, ([to_wire(inside)], None))))
    _wait(lambda: sink.records)
    assert sink.records[0]["rid"] == "w-in" and sink.records[0]["window"] == window
    closed = gen + 1
    assert admin_request(col.admin_address, ("flip", closed, False, list(switch.PARTS), {**window, "open": False}))[0]
    assert col.window == ("10s/60s", False)
    user = closed + 1
    assert admin_request(col.admin_address, ("flip", user, True, list(switch.PARTS), None))[0]
    assert col.window is None
    after = _trace("w-user", False)
    after.http.gen = user
    push.send(pickle.dumps(("api", "api", 11, ([to_wire(after)], None))))
    _wait(lambda: len(sink.records) == 2)
    assert sink.records[1]["rid"] == "w-user" and "window" not in sink.records[1]


def test_a_peer_that_starts_after_the_last_flip_is_sent_the_setting(collector):
    """A scheduler spawned after a window closed starts with every part on: its heartbeat shows the
    older generation, and the collector publishes the latest setting again until it catches up."""
    col, sink, push = collector
    sub = _control_subscriber(col)
    gen = switch.generation + 1
    assert admin_request(col.admin_address, ("flip", gen, False, list(switch.PARTS), None))[0]  # no peers yet
    time.sleep(0.1)
    while sub.poll(0):
        sub.recv()  # the flip's own publication, if the subscription was in time for it
    push.send(
        pickle.dumps(("hb", "scheduler", 8, {"switch": {"on": True, "parts": list(switch.PARTS), "generation": 0}}))
    )
    assert sub.poll(5000), "the latest setting was not published again for the late peer"
    assert pickle.loads(sub.recv()) == (gen, False, tuple(switch.PARTS))
    sub.close()
