"""FastAPI app (api process): request arrival, first/last body bytes written, disconnects.

A pure-ASGI middleware, so the first chunk's time is the real ``send`` of the body, not the
generator's yield. It also serves the plugin's own endpoints: ``GET /mmtrace/state`` (per-process
state) and ``POST /mmtrace/enabled`` (the runtime switch, ``switch.py``); both work while the switch
is off.
"""

from __future__ import annotations

import json
from typing import Any

from ... import runtime, switch
from ...join.context import WARMUP_HEADER, HttpCtx, current_http, now
from ...windows import Schedule
from ..base import HookSpec, guarded

STATE_PATH = "/mmtrace/state"
ENABLED_PATH = "/mmtrace/enabled"
_http = switch.gate("http")


COMPONENT = "http_server.app"


class MmtraceMiddleware:
    """Times the exchange; any failure of its own falls back to calling the app untouched."""

    def __init__(self, app: Any) -> None:
        self.app = app
        self.trace_fields = _trace_fields()

    async def __call__(self, scope: dict, receive: Any, send: Any) -> None:
        if scope.get("type") != "http":
            await self.app(scope, receive, send)
            return
        path = scope.get("path")
        if path == STATE_PATH:
            await _serve_state(send)
            return
        if path == ENABLED_PATH and scope.get("method") == "POST":
            await _serve_enabled(receive, send)
            return
        if not _http.on:
            await self.app(scope, receive, send)
            return
        ctx = guarded(COMPONENT, _open, scope, self.trace_fields)
        if ctx is None:
            await self.app(scope, receive, send)
            return
        token = current_http.set(ctx)

        async def timed_send(message: dict) -> None:
            t = now()  # handed on: the server stack writes it to the transport without waiting
            await send(message)
            guarded(COMPONENT, _on_last_send, ctx, message, t, scope)

        def traced_send(message: dict) -> Any:
            # Every message but the last body one goes to the server's own ``send`` with no coroutine
            # of ours around it (two of them are on the TTFT path): a body chunk with more to come
            # (only body messages carry ``more_body``) is timed when handed on (the first), and the
            # response start only gives its status.
            if message.get("more_body"):
                if ctx.t_first_body is None and message.get("body"):
                    ctx.t_first_body = now()
                return send(message)
            if message.get("type") == "http.response.start":
                ctx.status_code = message.get("status")
                return send(message)
            return timed_send(message)

        async def traced_receive() -> dict:
            message = await receive()
            if message.get("type") == "http.disconnect" and ctx.t_last_body is None:
                ctx.disconnected = True
            return message

        try:
            await self.app(scope, traced_receive, traced_send)
        except BaseException as exc:
            ctx.error = type(exc).__name__
            if isinstance(exc, OSError | ConnectionError):
                ctx.disconnected = True
            raise
        finally:
            current_http.reset(token)
            if ctx.traces and runtime.collector is not None:
                ctx.route = _route(scope)
                guarded(COMPONENT, runtime.collector.finish_http, ctx)


def _trace_fields() -> frozenset[bytes]:
    """The headers the configured propagators (``OTEL_PROPAGATORS``, as the OpenTelemetry API reads
    it) extract a trace context from, as ASGI spells header names: only these are kept, never the
    request's other headers (credentials among them)."""
    from opentelemetry import propagate

    return frozenset(f.lower().encode("latin-1") for f in propagate.get_global_textmap().fields)


def _open(scope: dict, trace_fields: frozenset[bytes]) -> HttpCtx:
    ctx = HttpCtx(now(), scope.get("path", ""))
    ctx.method = scope.get("method", "")
    ctx.scheme = scope.get("scheme", "http")
    scope.setdefault("state", {})["mmtrace"] = ctx
    for key, value in scope.get("headers") or ():
        if key in trace_fields:
            if ctx.trace_headers is None:
                ctx.trace_headers = {}
            ctx.trace_headers[key.decode("latin-1")] = value.decode("latin-1")
        elif key == WARMUP_HEADER:
            ctx.warmup = value.strip().lower() in (b"1", b"true", b"yes")
    return ctx


def _route(scope: dict) -> str | None:
    """The matched route's template (``http.route``): FastAPI puts the matched route in the scope it
    routes, the middleware's own scope; None where nothing matched or another router served it."""
    return getattr(scope.get("route"), "path", None)


def _on_last_send(ctx: HttpCtx, message: dict, t: float, scope: dict) -> None:
    """Called once ``send`` of the last body message (or another message ``traced_send`` does not
    handle) returned, with the time the message was handed to it: uvicorn writes it to the transport
    before its first await, so that is when the bytes left. The time ``send`` returned would also count
    the event loop's delay in resuming this coroutine, which under load made the server's TTFT exceed
    the client's.

    After the last body byte the exchange is complete: its traces go to the collector at once
    (``traced_send`` sends every body message with ``more_body`` itself, so a body message here is
    the last)."""
    if message.get("type") != "http.response.body":
        return
    if ctx.t_first_body is None and message.get("body"):
        ctx.t_first_body = t  # a response in one body message: its first bytes are its last
    ctx.t_last_body = t
    ctx.gen_end = switch.generation
    if ctx.traces and runtime.collector is not None:
        ctx.route = _route(scope)
        # Hand the exchange over now: SGLang's streaming app returns seconds after its last byte,
        # and the record should not wait for that (the ``finally`` below ships only the rest).
        runtime.collector.finish_http(ctx)


async def _respond(send: Any, status: int, payload: Any) -> None:
    body = json.dumps(payload).encode()
    await send({"type": "http.response.start", "status": status, "headers": [(b"content-type", b"application/json")]})
    await send({"type": "http.response.body", "body": body})


async def _serve_state(send: Any) -> None:
    if runtime.collector is None:
        await _respond(send, 200, {})
        return
    try:
        await _respond(send, 200, await runtime.collector.state())
    except TimeoutError as exc:
        await _respond(send, 503, {"error": str(exc)})


async def _serve_enabled(receive: Any, send: Any) -> None:
    """``{"on": bool, "parts": [...]?}``: 200 once every process applied it, 504 if one did not confirm;
    it also stops the tracing windows. ``{"windows": "<window>/<period>", "parts": [...]?}``: the switch
    follows that schedule from now on (``windows.py``); 200 with the windows' state once the current
    window's state is applied."""
    chunks = []
    while True:
        message = await receive()
        chunks.append(message.get("body", b""))
        if message.get("type") != "http.request" or not message.get("more_body", False):
            break
    try:
        body = json.loads(b"".join(chunks) or b"null")
        schedule = None
        if isinstance(body, dict) and "windows" in body:
            if not isinstance(body["windows"], str):
                raise ValueError('"windows" must be a string <window>/<period>, e.g. "10s/60s"')
            schedule = Schedule.parse(body["windows"])
            body = {"on": True, "parts": body.get("parts")}
        setting = switch.Setting.parse(body)
    except ValueError as exc:  # JSONDecodeError is a ValueError
        await _respond(send, 400, {"error": str(exc), "parts": list(switch.PARTS)})
        return
    if runtime.collector is None:
        await _respond(send, 503, {"error": "the plugin is not installed in this process"})
        return
    if schedule is not None:
        windows = await runtime.collector.set_windows(schedule, setting.parts)
        await _respond(send, 200, {**switch.snapshot(), "windows": windows})
        return
    confirmed, state = await runtime.collector.flip(setting)
    await _respond(send, 200 if confirmed else 504, state)


def _install(app: Any) -> Any:
    app.add_middleware(MmtraceMiddleware)

    def uninstall() -> None:
        app.user_middleware[:] = [m for m in app.user_middleware if m.cls is not MmtraceMiddleware]
        app.middleware_stack = None

    return uninstall


PART = "http"  # the switch part that gates these hooks

HOOKS = {"http_server.app": HookSpec("http_server.app", install=_install)}

# the arguments each hook reads from its target (registry.READS_OF)
READS: dict[str, tuple[tuple[int | None, str | None], ...]] = {}
