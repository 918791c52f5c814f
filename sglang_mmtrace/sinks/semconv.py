"""The semantic conventions' names the sinks share: the GenAI values (metrics and spans) and the root
span's name and attributes.

Semantic conventions v1.41.1 (docs/contract.md names it; the last release that holds the GenAI
conventions). Its GenAI span table describes the inference span (``span.gen_ai.inference.client``):
name ``{gen_ai.operation.name} {gen_ai.request.model}``, kind CLIENT, or INTERNAL for a model in the
caller's process. A model server's view of the same operation is the HTTP server span of the request
(``span.http.server``, kind SERVER), so the root span of a request over HTTP is both: the GenAI name
and attributes, the HTTP server kind and attributes. tests/test_unit_genai_spans.py holds the
tables, transcribed from the conventions.
"""

from __future__ import annotations

from typing import Any

from ..join.record import EmitContext, HttpFacts

ATTR_PREFIX = "sglang_mmtrace."
"""The plugin's own span attributes (stage attributes, status, TTFT, coverage, warm-up, content)."""
PROVIDER = "sglang"
"""``gen_ai.provider.name``: no well-known value names a self-hosted server, so the server's own name
(the conventions allow a custom value; SGLang's OpenAI-compatible API serves the request)."""
OPERATION = "chat"
"""``gen_ai.operation.name``: the plugin traces ``/v1/chat/completions`` (metrics and the root span)."""


def server_span_name(rec: dict[str, Any]) -> str:
    """``{gen_ai.operation.name} {gen_ai.request.model}``, the operation alone where no model is known."""
    model = rec.get("model")
    return f"{OPERATION} {model}" if model else OPERATION


def error_type(rec: dict[str, Any], http: HttpFacts | None) -> str | None:
    """``error.type`` of a failed request (None for a success), low-cardinality as the conventions ask:
    the HTTP status sent when it is 400 or more (as text, the HTTP conventions' value); else the class
    of the exception that failed it; else the record's status (``aborted`` for a client that went away
    or a request SGLang aborted, ``error``)."""
    if rec["status"] == "ok":
        return None
    if http is not None and http.status_code is not None and http.status_code >= 400:
        return str(http.status_code)
    error = rec.get("error") or ""
    return error if error and " " not in error and error != "aborted" else rec["status"]


def server_span_attributes(rec: dict[str, Any], ctx: EmitContext) -> dict[str, Any]:
    """The root span's attributes: the GenAI inference span's (semantic conventions v1.41.1) and, for a
    request over HTTP, the HTTP server span's that the middleware saw (no query string, no header, no
    client address). Prompt and image URLs only with content capture (``record["content"]``)."""
    attrs: dict[str, Any] = {
        "gen_ai.operation.name": OPERATION,
        "gen_ai.provider.name": PROVIDER,
        "gen_ai.response.id": rec["rid"],
        "gen_ai.usage.input_tokens": rec.get("prompt_tokens", 0),
        "gen_ai.usage.cache_read.input_tokens": rec.get("cached_tokens", 0),
        "gen_ai.usage.output_tokens": rec.get("output_tokens", 0),
        ATTR_PREFIX + "status": rec["status"],
        ATTR_PREFIX + "ttft_s": rec.get("ttft_s") or 0.0,
    }
    if rec.get("model"):
        attrs["gen_ai.request.model"] = rec["model"]
    http = ctx.http
    if http is not None:
        attrs["http.request.method"] = http.method
        attrs["url.scheme"] = http.scheme
        attrs["url.path"] = http.path
        if http.route:
            attrs["http.route"] = http.route
        if http.status_code is not None:
            attrs["http.response.status_code"] = http.status_code
        if http.streamed:
            attrs["gen_ai.request.stream"] = True
    error = error_type(rec, http)
    if error is not None:
        attrs["error.type"] = error
    if rec.get("warmup"):
        attrs[ATTR_PREFIX + "warmup"] = True  # kept in traces, marked for filtering
    window = rec.get("window")
    if window:  # served in a tracing window (SGLANG_MMTRACE_WINDOW): the trace is one of a sample
        attrs[ATTR_PREFIX + "window.window_s"] = window["window_s"]
        attrs[ATTR_PREFIX + "window.period_s"] = window["period_s"]
    content = rec.get("content")
    if content:  # only with content capture on (environment_variables: SGLANG_MMTRACE_CAPTURE_CONTENT)
        if content.get("prompt") is not None:
            attrs[ATTR_PREFIX + "content.prompt"] = content["prompt"]
        if content.get("image_urls"):
            attrs[ATTR_PREFIX + "content.image_urls"] = list(content["image_urls"])
    return attrs
