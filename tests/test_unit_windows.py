"""Tracing windows (``windows.py``): the schedule's arithmetic on an injected clock, its syntax, the
environment variable, the driver's flips and the span attribute of a record served in a window."""

from __future__ import annotations

import pytest

from sglang_mmtrace import environment_variables as ev
from sglang_mmtrace.sinks.semconv import ATTR_PREFIX
from sglang_mmtrace.windows import Driver, Schedule, duration


@pytest.mark.parametrize(
    ("raw", "seconds"), [("10s", 10.0), ("10", 10.0), ("1.5m", 90.0), ("250ms", 0.25), ("2h", 7200.0), (" 5 s ", 5.0)]
)
def test_durations(raw, seconds):
    assert duration(raw) == seconds


@pytest.mark.parametrize("raw", ["", "10x", "-1s", "s", "1e3s", "ten"])
def test_bad_durations(raw):
    with pytest.raises(ValueError):
        duration(raw)


def test_schedule_parse_and_spec_round_trip():
    s = Schedule.parse("10s/1m")
    assert (s.window_s, s.period_s) == (10.0, 60.0)
    assert s.spec == "10s/60s" and Schedule.parse(s.spec) == s
    assert s.field == {"window_s": 10.0, "period_s": 60.0}
    assert s.describe() == "10 s every 60 s"


@pytest.mark.parametrize("raw", ["10s", "60s/10s", "10s/10s", "0.1s/10s", "10s/", "/60s", "a/b"])
def test_bad_schedules(raw):
    with pytest.raises(ValueError):
        Schedule.parse(raw)


def test_windows_align_to_multiples_of_the_period():
    s = Schedule(10.0, 60.0)
    t0 = 1_700_000_040.0  # a multiple of 60
    assert s.is_open(t0) and s.is_open(t0 + 9.999) and not s.is_open(t0 + 10.0) and not s.is_open(t0 - 0.001)
    assert s.next_edge(t0) == t0 + 10.0
    assert s.next_edge(t0 + 10.0) == t0 + 60.0
    assert s.next_edge(t0 + 59.0) == t0 + 60.0
    assert s.next_open(t0) == t0 + 60.0 and s.next_open(t0 + 30.0) == t0 + 60.0
    # two servers that start at different times share their windows
    assert all(s.is_open(t) == Schedule.parse("10s/60s").is_open(t) for t in (t0 + 5, t0 + 15, t0 + 65))


def test_the_variable_parses_and_a_bad_value_means_always_on():
    var = next(v for v in ev.VARIABLES if v.name == ev.SGLANG_MMTRACE_WINDOW)
    assert var.value({}) is None
    assert var.value({ev.SGLANG_MMTRACE_WINDOW: "10s/60s"}) == Schedule(10.0, 60.0)
    assert var.value({ev.SGLANG_MMTRACE_WINDOW: "60s/10s"}) is None
    assert var.value({ev.SGLANG_MMTRACE_WINDOW: ""}) is None
    assert ev.from_env({ev.SGLANG_MMTRACE_WINDOW: "30s/5m"})["window"] == Schedule(30.0, 300.0)


class Clock:
    def __init__(self, t: float) -> None:
        self.t = t

    def __call__(self) -> float:
        return self.t


def test_the_driver_flips_at_each_edge_only():
    clock = Clock(1_700_000_040.0 + 5.0)  # 5 s into a window
    flips: list[bool] = []
    errors: list[str] = []
    d = Driver(Schedule(10.0, 60.0), lambda on: flips.append(on) is None, lambda c, e: errors.append(c), clock)
    assert d.tick() == pytest.approx(5.0) and flips == [True] and d.open
    clock.t += 2.0
    assert d.tick() == pytest.approx(3.0) and flips == [True]  # still open: no flip
    clock.t += 3.0  # the window's end
    assert d.tick() == pytest.approx(50.0) and flips == [True, False]
    clock.t += 50.0
    assert d.tick() == pytest.approx(10.0) and flips == [True, False, True]
    assert d.state() == {
        "schedule": "10s/60s",
        "window_s": 10.0,
        "period_s": 60.0,
        "running": True,
        "open": True,
        "next_open_unix_s": 1_700_000_040.0 + 120.0,
    }
    assert errors == []


def test_the_driver_stops_when_its_flip_is_refused():
    """``flip`` returns False once a user's flip took the switch over: the driver stops for good."""
    clock = Clock(1_700_000_040.0 + 20.0)
    flips: list[bool] = []

    def refuse(on: bool) -> bool:
        flips.append(on)
        return False

    d = Driver(Schedule(10.0, 60.0), refuse, lambda c, e: None, clock)
    assert d.tick() == 0.0 and not d.running and flips == [False]
    clock.t += 40.0
    assert d.tick() == 0.0 and flips == [False]
    assert d.state()["running"] is False and d.state()["open"] is False and d.state()["next_open_unix_s"] is None


def test_a_failed_flip_is_contained_and_tried_again():
    clock = Clock(1_700_000_040.0 + 1.0)
    errors: list[str] = []
    calls: list[bool] = []

    def fail_once(on: bool) -> bool:
        calls.append(on)
        if len(calls) == 1:
            raise TimeoutError("the collector process did not answer")
        return True

    d = Driver(Schedule(10.0, 60.0), fail_once, lambda c, e: errors.append(c), clock)
    assert d.step() == 1.0 and errors == ["windows"] and d.open is None
    assert d.tick() == pytest.approx(9.0) and calls == [True, True] and d.open


def test_a_window_s_record_marks_its_root_span():
    from sglang_mmtrace.join.record import EmitContext
    from sglang_mmtrace.sinks.semconv import server_span_attributes

    rec = {"rid": "r", "model": "m", "status": "ok", "window": {"window_s": 10.0, "period_s": 60.0}}
    attrs = server_span_attributes(rec, EmitContext({}, {}, None))
    assert attrs[ATTR_PREFIX + "window.window_s"] == 10.0 and attrs[ATTR_PREFIX + "window.period_s"] == 60.0
