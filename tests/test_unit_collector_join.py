"""The cross-process join in ``build_record``: hops and clamps that only the join can see.

Real-server records pin the same rules under load (``tests/test_server_robustness.py``'s causal
order check caught the regression this file pins: an image request's ``scheduler.recv`` starting
before ``dispatch`` because the transport join copied the event before the clamp moved it).
"""

from __future__ import annotations

import pytest

from sglang_mmtrace.join.collector import build_record
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
