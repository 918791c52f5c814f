"""Tracing windows: the plugin installed but switched off except for a window of every period.

``SGLANG_MMTRACE_WINDOW="10s/60s"`` (or ``POST /mmtrace/enabled {"windows": "10s/60s"}``) turns the
runtime switch (``switch.py``) on for the first 10 s of every 60 s and off for the rest, so between
windows a server pays what it pays with the switch off: every hook taken out. Windows align to
multiples of the period on the wall clock (``[k * period, k * period + window)`` in Unix time), so
the windows of several servers with the same setting coincide.

One ``Driver`` per server, in the API process that owns the collector: a daemon thread that sleeps
until the next window edge and flips the switch there (``CollectorClient.flip_now``), in every
process, as a ``POST /mmtrace/enabled`` does. A request served in a window is recorded with the
record field ``window`` (``Schedule.field``); one that crosses an edge gets no record, as with any
flip. An explicit ``{"on": ...}`` flip takes the switch out of the windows' hands: the driver stops
and the switch stays where the user set it, until windows are asked for again.
"""

from __future__ import annotations

import re
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

_UNITS = {"ms": 0.001, "s": 1.0, "m": 60.0, "h": 3600.0}
_DURATION = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*(ms|s|m|h)?\s*$")
MIN_WINDOW_S = 0.5
"""Shorter windows would flip faster than every process confirms a flip."""


def duration(raw: str) -> float:
    """``"10s"``, ``"1.5m"``, ``"250ms"``, ``"2h"`` or a bare number of seconds -> seconds."""
    m = _DURATION.match(raw)
    if m is None:
        raise ValueError(f"not a duration: {raw!r} (a number with an optional unit ms, s, m or h)")
    return float(m.group(1)) * _UNITS[m.group(2) or "s"]


def _shown(seconds: float) -> str:
    return f"{seconds:g}s"


@dataclass(frozen=True)
class Schedule:
    """On for ``window_s`` at the start of every ``period_s`` of wall-clock time."""

    window_s: float
    period_s: float

    def __post_init__(self) -> None:
        if not MIN_WINDOW_S <= self.window_s < self.period_s:
            raise ValueError(
                f"a window must last at least {MIN_WINDOW_S:g} s and less than its period "
                f"(got {self.window_s:g} s every {self.period_s:g} s)"
            )

    @classmethod
    def parse(cls, raw: str) -> Schedule:
        """``"<window>/<period>"``, each a ``duration``: ``"10s/60s"``, ``"30s/5m"``. Raises ValueError."""
        window, sep, period = raw.partition("/")
        if not sep:
            raise ValueError(f"expected <window>/<period>, e.g. 10s/60s (got {raw!r})")
        return cls(duration(window), duration(period))

    @property
    def spec(self) -> str:
        """The setting as it is written (``Schedule.parse`` reads it back)."""
        return f"{_shown(self.window_s)}/{_shown(self.period_s)}"

    @property
    def field(self) -> dict[str, float]:
        """The record's ``window`` field: the schedule its request was sampled under."""
        return {"window_s": self.window_s, "period_s": self.period_s}

    def describe(self) -> str:
        return f"{self.window_s:g} s every {self.period_s:g} s"

    def is_open(self, t: float) -> bool:
        return t % self.period_s < self.window_s

    def next_open(self, t: float) -> float:
        """The start of the first window after ``t`` (``t`` itself excluded)."""
        return t - t % self.period_s + self.period_s

    def next_edge(self, t: float) -> float:
        """The next instant the window opens or closes after ``t``."""
        start = t - t % self.period_s
        return start + self.window_s if self.is_open(t) else start + self.period_s


class Driver:
    """Flips the switch at every window edge of ``schedule``: ``flip(open)`` is called with the state the
    switch should take (at ``start``, then at each edge), and returns False once the driver should stop
    (it was replaced or overridden). A flip that raises is handed to ``contained`` (the plugin's
    ``telemetry.contained``; this module stays a leaf below ``config``) and tried again within a
    second. ``clock`` is the wall clock (Unix seconds); tests inject one and call ``tick`` themselves."""

    def __init__(
        self,
        schedule: Schedule,
        flip: Callable[[bool], bool],
        contained: Callable[[str, BaseException], None],
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.schedule = schedule
        self._flip = flip
        self._contained = contained
        self._clock = clock
        self.open: bool | None = None
        """The state last applied (None before the first tick)."""
        self.running = True
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def tick(self) -> float:
        """Apply the state the schedule gives now, if it differs from the last one applied; returns the
        seconds until the next edge (0 once stopped)."""
        t = self._clock()
        should = self.schedule.is_open(t)
        if self.running and should != self.open:
            self.open = should
            if not self._flip(should):
                self.running = False
        return self.schedule.next_edge(t) - t if self.running else 0.0

    def start(self, wait: bool = True) -> None:
        """Tick at each edge on a daemon thread; ``wait``: the first tick runs now, on the caller's thread
        (the current window's state is in place when this returns), else on that thread too."""
        delay = self.step() if wait else 0.0
        if self.running:
            self._thread = threading.Thread(target=self._run, args=(delay,), name="mmtrace-windows", daemon=True)
            self._thread.start()

    def stop(self) -> None:
        self.running = False
        self._stop.set()

    def _run(self, delay: float) -> None:
        while self.running and not self._stop.wait(delay):
            delay = self.step()

    def step(self) -> float:
        """``tick`` with a failure contained: returns the seconds until the next edge or the next try."""
        try:
            return self.tick()
        except Exception as exc:  # e.g. the collector did not answer: the next edge tries again
            self._contained("windows", exc)
            self.open = None
            return min(1.0, self.schedule.next_edge(self._clock()) - self._clock())

    def state(self) -> dict[str, Any]:
        """``/mmtrace/state``'s ``windows``: the schedule, whether it still drives the switch, whether a
        window is open and when the next one starts (Unix seconds)."""
        t = self._clock()
        return {
            "schedule": self.schedule.spec,
            **self.schedule.field,
            "running": self.running,
            "open": bool(self.running and self.open),
            "next_open_unix_s": round(self.schedule.next_open(t), 3) if self.running else None,
        }
