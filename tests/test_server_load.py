"""Load: 64 concurrent streaming clients, 500 mixed requests, on the session's real server.

The small CI version of ``python -m benchmarks.soak`` (same plan and client code): new and repeated
images, text, disconnects after the first chunk, connections closed before it, and aborts through
SGLang's ``/abort_request``. Afterwards the plugin is at rest (nothing live, finishing or pending),
every finished request has exactly one ``ok`` record, no rid has two, and nothing was counted as
a contained error or a drop.
"""

from __future__ import annotations

import json
import time

import pytest
from conftest import read_records, records, server_context
from reliability import at_rest_problems, settled_state

from benchmarks.soak import FINISHED, drive, plan, record_check, tally
from sglang_mmtrace.config import Config

pytestmark = pytest.mark.server

CLIENTS = 64
REQUESTS = 500


@pytest.fixture(scope="module")
def load(server):
    items = plan(REQUESTS, seed=int(time.time()) % 100000)
    outcomes, gauge = drive(server.port, items, CLIENTS)
    finished = [o.rid for o in outcomes if o.kind in FINISHED and o.status == 200 and o.done]
    records(server, finished, timeout=120)
    st = settled_state(server, limit_s=Config.from_env().grace_s + 30)
    time.sleep(Config.from_env().grace_s + 1)  # late records of cut requests
    recs = [r for r in read_records(server.jsonl_path) if r["rid"].startswith(items[0][1].rsplit("-", 2)[0])]
    return {"outcomes": outcomes, "gauge": gauge, "state": st, "records": recs}


def test_every_finished_request_served(load, server):
    t = tally(load["outcomes"])
    failed = {k: v.get("failed", 0) for k, v in t.items() if v.get("failed")}
    assert not failed, f"{t}" + server_context(server)
    assert sum(v["sent"] for v in t.values()) == REQUESTS


def test_64_clients_were_held_at_once(load):
    assert load["gauge"].max == CLIENTS, load["gauge"].max


def test_one_record_per_finished_request(load):
    check = record_check(load["outcomes"], load["records"], None)
    n_finished = sum(1 for o in load["outcomes"] if o.kind in FINISHED and o.status == 200 and o.done)
    assert check["records_per_finished_request"] == {1: n_finished}, check
    assert check["finished_requests_not_ok"] == 0 and check["rids_with_several_records"] == 0, check
    # a connection closed before the first byte may be answered 400 by SGLang (recorded as that error)
    assert set(check["cut_request_record_status"]) <= {"aborted", "error", "ok", "(none)"}, check


def test_plugin_state_back_to_rest_without_errors(load):
    st = load["state"]
    assert not at_rest_problems(st), json.dumps(st, indent=1)
    assert st["api"]["errors"] == {} and st["api"]["dropped"] == {}, json.dumps(st["api"], indent=1)
    assert all(not p.get("errors") and not p.get("dropped") for p in st["peers"].values()), json.dumps(st, indent=1)
