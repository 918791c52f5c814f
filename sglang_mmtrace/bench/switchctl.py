"""The bench's client of the plugin's runtime switch (``POST /mmtrace/enabled``, ``GET /mmtrace/state``).

The switch turns the plugin, or only some of its parts, on and off in every SGLang process of one
running server; the answer comes once each process has applied it (200), or after 5 s with the
processes that did not confirm (504). The same-instance experiments (``overhead``, ``ablation``,
``throughput``) flip it between requests, outside the timed region, so both arms run on the same
server instance and instance-to-instance noise cancels. ``set_windows`` hands the switch to tracing
windows instead (``POST /mmtrace/enabled {"windows": ...}``), for a request served between them.

``PARTS`` is the plugin's list of parts in stack order (``sglang_mmtrace.switch.PARTS``: each needs
the ones before it to do anything useful); ``levels()`` turns it into the ablation's cumulative levels L0 (all off) .. L12.
"""

from __future__ import annotations

import http.client
import json
import time
from collections.abc import Callable, Sequence
from typing import Any

from ..report.analysis import quantile
from ..switch import PARTS
from ..windows import Schedule
from .client import host_port

ENABLED_PATH = "/mmtrace/enabled"
STATE_PATH = "/mmtrace/state"
TRACE_LEVEL_PATH = "/set_trace_level"  # SGLang's own: its tracing's level (0: off) for new requests

Level = tuple[str, ...] | None  # None: the switch off; a tuple: on with these parts
# The tracing windows a request "between windows" is served under (``closed_windows``): the shortest
# window there is, once per period, the period chosen so that no window is near.
BETWEEN_WINDOW = "0.5s"
BETWEEN_PERIODS = ("1h", "59m", "58m")
BETWEEN_MARGIN_S = 60.0


class SwitchError(RuntimeError):
    """The server has no switch, refused a flip, or not every process confirmed it in time."""


def http_json(base_url: str, method: str, path: str, body: Any = None, timeout: float = 15.0) -> tuple[int, Any]:
    """One HTTP exchange; returns the status and the decoded JSON body (the raw text if it is not JSON)."""
    host, port = host_port(base_url)
    conn = http.client.HTTPConnection(host, port, timeout=timeout)
    try:
        data = None if body is None else json.dumps(body).encode()
        headers = {"Content-Type": "application/json"} if data is not None else {}
        conn.request(method, path, body=data, headers=headers)
        resp = conn.getresponse()
        raw = resp.read()
    finally:
        conn.close()
    try:
        return resp.status, json.loads(raw)
    except ValueError:
        return resp.status, raw[:2000].decode(errors="replace")


def read_state(base_url: str, timeout: float = 15.0) -> dict[str, Any]:
    status, body = http_json(base_url, "GET", STATE_PATH, timeout=timeout)
    if status != 200 or not isinstance(body, dict):
        raise SwitchError(f"GET {STATE_PATH} on {base_url}: HTTP {status} {str(body)[:300]}")
    return body


def current(base_url: str) -> dict[str, Any]:
    """The api process's switch (``{"on", "parts", "generation"}``); SwitchError if the server has none."""
    state = read_state(base_url)
    sw = (state.get("api") or {}).get("switch", state.get("switch"))
    if not isinstance(sw, dict) or "on" not in sw:
        raise SwitchError(
            f"{base_url} has no runtime switch ({STATE_PATH} carries no 'switch'): the plugin is not loaded "
            "(SGLANG_MMTRACE=0) or predates the switch; same-instance experiments need it"
        )
    return sw


def body_for(level: Level) -> dict[str, Any]:
    """The POST body that sets ``level`` (None: off; the full list is sent as is, so the echo is checkable)."""
    return {"on": False} if level is None else {"on": True, "parts": list(level)}


def echoes(answer: dict[str, Any], level: Level) -> bool:
    """The server's answer sets ``level``: ``on`` matches, and so do the parts as a set, since the
    server lists them in stack order (``PARTS``) whatever order a grouped ablation named them in."""
    if level is None:
        return answer.get("on") is False
    parts = answer.get("parts") or []
    return answer.get("on") is True and len(parts) == len(level) and set(parts) == set(level)


def set_trace_level(base_url: str, level: int, timeout: float = 15.0) -> None:
    """Set SGLang's own tracing level (``GET /set_trace_level?level=N``; 0 turns it off for new
    requests). SwitchError on anything but a 200: a server without the route, or one whose level
    cannot be set."""
    status, answer = http_json(base_url, "GET", f"{TRACE_LEVEL_PATH}?level={int(level)}", timeout=timeout)
    if status != 200:
        raise SwitchError(f"GET {TRACE_LEVEL_PATH}?level={level} on {base_url}: HTTP {status} {str(answer)[:300]}")


def closed_windows(clock: Callable[[], float] = time.time, sleep: Callable[[float], None] = time.sleep) -> str:
    """The ``"<window>/<period>"`` setting under which a request sent now is served between tracing
    windows: a ``BETWEEN_WINDOW`` window every period, the first of ``BETWEEN_PERIODS`` whose window is
    closed at ``clock()`` (Unix seconds) and stays closed for ``BETWEEN_MARGIN_S`` more (the request,
    and a server clock a little off this one, fall between windows too). Windows align to multiples of
    the period in Unix time, so near a multiple of one period the next one is taken; at the rare
    instants near a multiple of each, it waits a second and looks again."""
    while True:
        now = clock()
        for period in BETWEEN_PERIODS:
            spec = f"{BETWEEN_WINDOW}/{period}"
            schedule = Schedule.parse(spec)
            if not schedule.is_open(now) and schedule.next_open(now) - now > BETWEEN_MARGIN_S:
                return spec
        sleep(1.0)


def set_windows(base_url: str, spec: str, timeout: float = 15.0) -> dict[str, Any]:
    """Hand the switch to tracing windows ``spec`` (``POST /mmtrace/enabled {"windows": spec}``) and
    return the server's answer, whose ``windows`` is the windows' state once the current window's state
    is applied. Raises SwitchError on anything but a 200 that shows those windows running with the
    window closed and the switch off: a request sent next would not be served between windows."""
    body = {"windows": spec}
    status, answer = http_json(base_url, "POST", ENABLED_PATH, body, timeout=timeout)
    if status != 200 or not isinstance(answer, dict):
        raise SwitchError(f"POST {ENABLED_PATH} {body} on {base_url}: HTTP {status} {str(answer)[:500]}")
    win = answer.get("windows") or {}
    closed = win.get("running") is True and win.get("open") is False and answer.get("on") is False
    if win.get("schedule") != Schedule.parse(spec).spec or not closed:
        raise SwitchError(f"POST {ENABLED_PATH} {body}: not between windows with these windows: {str(answer)[:500]}")
    return answer


def set_level(base_url: str, level: Level, timeout: float = 15.0) -> dict[str, Any]:
    """Flip the switch to ``level`` and return the server's answer once every process applied it.

    Raises SwitchError on anything but a 200 whose ``on``/``parts`` echo the request.
    """
    body = body_for(level)
    status, answer = http_json(base_url, "POST", ENABLED_PATH, body, timeout=timeout)
    if status != 200 or not isinstance(answer, dict):
        raise SwitchError(f"POST {ENABLED_PATH} {body} on {base_url}: HTTP {status} {str(answer)[:500]}")
    if not echoes(answer, level):
        raise SwitchError(f"POST {ENABLED_PATH} {body}: the answer does not echo it: {str(answer)[:500]}")
    return answer


def levels(parts: Sequence[str] = PARTS) -> list[Level]:
    """The ablation's cumulative levels: L0 = off, L1 = parts[:1], ..., L{len(parts)} = every part.

    An entry may be a group of parts joined by ``+`` (``"http+tokenizer+mm"``): one level adds them
    all, so a coarse ablation needs fewer levels and affords more rounds."""
    return [None, *(tuple(p for g in parts[:i] for p in g.split("+")) for i in range(1, len(parts) + 1))]


def level_name(i: int, parts: Sequence[str] = PARTS) -> str:
    return "L0 (off)" if i == 0 else f"L{i} (+{parts[i - 1]})"


def busy(state: dict[str, Any]) -> int:
    """Requests the api process still holds: live, or finished and waiting for their record."""
    api = state.get("api") or {}
    return int(api.get("live_requests") or 0) + int(api.get("finishing") or 0)


class Flipper:
    """Sets the switch before a request (untimed) and remembers the state to restore at the end.

    A request's record is built once its last body byte is out and the other processes' events
    arrived (up to the collector's grace, 2 s), under the setting of the generation it ran in.
    ``wait_records`` waits until the plugin's record count reaches a value; ``settle()`` until the api
    process holds no request (none live, none finishing).
    """

    def __init__(self, base_url: str, settle_timeout: float = 8.0) -> None:
        self.base_url = base_url
        before = current(base_url)
        self.initial: Level = tuple(before.get("parts") or PARTS) if before.get("on") else None
        self.settle_timeout = settle_timeout
        self.flips = 0
        self.settle_s: list[float] = []
        self.settle_timeouts = 0
        self.last: dict[str, Any] = {}

    def _poll(self, done: Callable[[], bool]) -> float:
        """Poll ``done`` every 10 ms until true or ``settle_timeout`` passed; returns the seconds waited."""
        t0 = time.monotonic()
        while not done():
            if time.monotonic() - t0 > self.settle_timeout:
                self.settle_timeouts += 1
                break
            time.sleep(0.01)
        waited = time.monotonic() - t0
        self.settle_s.append(waited)
        return waited

    def settle(self) -> float:
        """Poll ``/mmtrace/state`` until the plugin holds no request (bounded); returns the seconds waited."""
        return self._poll(lambda: not busy(read_state(self.base_url)))

    def records(self) -> int:
        """Records the api process has built so far (``/mmtrace/state`` api.records)."""
        return int((read_state(self.base_url).get("api") or {}).get("records") or 0)

    def wait_records(self, at_least: int) -> float:
        """Poll until ``records() >= at_least`` (bounded); returns the seconds waited."""
        return self._poll(lambda: self.records() >= at_least)

    def set(self, level: Level) -> dict[str, Any]:
        self.last = set_level(self.base_url, level)
        self.flips += 1
        return self.last

    def set_windows(self, spec: str) -> dict[str, Any]:
        """Hand the switch to tracing windows ``spec`` (``set_windows``); the next ``set`` takes it back."""
        self.last = set_windows(self.base_url, spec)
        self.flips += 1
        return self.last

    def stats(self) -> dict[str, Any]:
        w = sorted(self.settle_s)
        return {
            "flips": self.flips,
            "settle_waits": len(w),
            "settle_ms_median": round(quantile(w, 0.5) * 1e3, 2) if w else None,
            "settle_ms_max": round(w[-1] * 1e3, 2) if w else None,
            "settle_timeouts": self.settle_timeouts,
        }

    def restore(self) -> None:
        """Put the switch back as it was found (a shared server is not left off), once the last
        request's record is built (a flip would discard it)."""
        self.settle()
        set_level(self.base_url, self.initial)
