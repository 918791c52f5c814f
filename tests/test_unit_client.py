"""The API process's hand-over of finished requests to the collector (``join/client.py``), on a real
ZMQ socket: a PULL socket bound here stands where the collector process listens."""

from __future__ import annotations

import gc
import pickle
from collections.abc import Iterator

import pytest
import zmq

from sglang_mmtrace.join.client import CollectorClient
from sglang_mmtrace.join.collector import ipc_address
from sglang_mmtrace.join.context import ApiTrace, HttpCtx, from_wire


@pytest.fixture
def wired() -> Iterator[tuple[CollectorClient, zmq.Socket]]:
    addresses = (ipc_address("events"), ipc_address("control"), ipc_address("admin"))
    pull = zmq.Context.instance().socket(zmq.PULL)
    pull.setsockopt(zmq.LINGER, 0)
    pull.bind(addresses[0])
    client = CollectorClient.attach(*addresses)
    yield client, pull
    client.close()
    pull.close()


def exchange(rids: list[str]) -> HttpCtx:
    """An HTTP exchange with one trace per rid, linked both ways as the TokenizerManager hook links them."""
    http = HttpCtx(1.0, "/v1/chat/completions")
    for rid in rids:
        trace = ApiTrace(rid, http, "m", 1.0)
        trace.add("tokenize", 1.1, 1.2)
        http.traces.append(trace)
    return http


def alive(ids: set[int]) -> list[ApiTrace]:
    """Which of these traces the collector still tracks (the received copies are other objects)."""
    return [o for o in gc.get_objects() if type(o) is ApiTrace and id(o) in ids]


def test_a_finished_exchange_is_shipped_once_and_freed_without_the_garbage_collector(
    wired: tuple[CollectorClient, zmq.Socket],
) -> None:
    """Both traces arrive with their exchange; afterwards no reference cycle keeps them: with the
    collector disabled they are gone as soon as the last reference is dropped."""
    client, pull = wired
    gc.collect()
    gc.disable()
    try:
        http = exchange(["cyc-a", "cyc-b"])
        client.finish_http(http)
        client.finish_http(http)  # the middleware's ``finally`` calls it again: nothing more is sent
        assert pull.poll(5000), "nothing shipped"
        kind, _process, _pid, (wires, _health) = pickle.loads(pull.recv())
        assert kind == "api" and not pull.poll(200), "shipped twice"
        shipped = [from_wire(w) for w in wires]
        assert [t.rid for t in shipped] == ["cyc-a", "cyc-b"]
        assert all(t.http is not None and t.http.path == "/v1/chat/completions" for t in shipped)
        assert all(t.closed and t.http is None for t in http.traces)
        ids = {id(t) for t in http.traces}
        assert len(alive(ids)) == 2
        del http
        assert alive(ids) == [], "a reference cycle kept the finished traces alive"
    finally:
        gc.enable()
