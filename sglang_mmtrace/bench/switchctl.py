"""The bench's client of the plugin's runtime switch (``POST /mmtrace/enabled``, ``GET /mmtrace/state``).

The switch turns the plugin, or only some of its parts, on and off in every SGLang process of one
running server; the answer comes once each process has applied it (200), or after 5 s with the
processes that did not confirm (504). The same-instance experiments (``overhead``, ``ablation``,
``throughput``) flip it between requests, outside the timed region, so both arms run on the same
server instance and instance-to-instance noise cancels.

``PARTS`` is the plugin's list of parts in stack order (each needs the ones before it to do
anything useful); ``levels()`` turns it into the ablation's cumulative levels L0 (all off) .. L12.
"""

from __future__ import annotations

import http.client
import json
from collections.abc import Sequence
from typing import Any

from .client import host_port

try:  # the plugin's own list, once it has the switch
    from ..switch import PARTS as _PLUGIN_PARTS

    PARTS: tuple[str, ...] = tuple(_PLUGIN_PARTS)
except ImportError:  # pragma: no cover - a plugin tree without the switch
    PARTS = (
        "http", "tokenizer", "mm", "scheduler", "detokenizer", "cuda_events", "ship", "records",
        "jsonl", "prometheus", "otlp", "nvtx",
    )  # fmt: skip

ENABLED_PATH = "/mmtrace/enabled"
STATE_PATH = "/mmtrace/state"

Level = tuple[str, ...] | None  # None: the switch off; a tuple: on with these parts


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
    sw = state.get("switch")
    if not isinstance(sw, dict) or "on" not in sw:
        raise SwitchError(
            f"{base_url} has no runtime switch ({STATE_PATH} carries no 'switch'): the plugin is not loaded "
            "(SGLANG_MMTRACE=0) or predates the switch; same-instance experiments need it"
        )
    return sw


def body_for(level: Level) -> dict[str, Any]:
    """The POST body that sets ``level`` (None: off; the full list is sent as is, so the echo is checkable)."""
    return {"on": False} if level is None else {"on": True, "parts": list(level)}


def set_level(base_url: str, level: Level, timeout: float = 15.0) -> dict[str, Any]:
    """Flip the switch to ``level`` and return the server's answer once every process applied it.

    Raises SwitchError on anything but a 200 whose ``on``/``parts`` echo the request.
    """
    body = body_for(level)
    status, answer = http_json(base_url, "POST", ENABLED_PATH, body, timeout=timeout)
    if status != 200 or not isinstance(answer, dict):
        raise SwitchError(f"POST {ENABLED_PATH} {body} on {base_url}: HTTP {status} {str(answer)[:500]}")
    if bool(answer.get("on")) != body["on"] or (level is not None and list(answer.get("parts") or []) != list(level)):
        raise SwitchError(f"POST {ENABLED_PATH} {body}: the answer does not echo it: {str(answer)[:500]}")
    return answer


def levels(parts: Sequence[str] = PARTS) -> list[Level]:
    """The ablation's cumulative levels: L0 = off, L1 = parts[:1], ..., L{len(parts)} = every part."""
    return [None, *(tuple(parts[:i]) for i in range(1, len(parts) + 1))]


def level_name(i: int, parts: Sequence[str] = PARTS) -> str:
    return "L0 (off)" if i == 0 else f"L{i} (+{parts[i - 1]})"


class Flipper:
    """Sets the switch before a request (untimed) and remembers the state to restore at the end."""

    def __init__(self, base_url: str) -> None:
        self.base_url = base_url
        before = current(base_url)
        self.initial: Level = tuple(before.get("parts") or PARTS) if before.get("on") else None
        self.flips = 0
        self.last: dict[str, Any] = {}

    def set(self, level: Level) -> dict[str, Any]:
        self.last = set_level(self.base_url, level)
        self.flips += 1
        return self.last

    def restore(self) -> None:
        """Put the switch back as it was found (a shared server is not left off)."""
        set_level(self.base_url, self.initial)
