"""Every environment variable the plugin reads, in one place (docs/contract.md, "Configuration").

``VARIABLES`` declares each user-facing variable once (name, default, meaning, parser, ``Config``
field): ``config.Config`` takes its defaults and ``Config.from_env`` its parsing from it, the README's
configuration table is generated from it (``docs``) and ``sglang-mmtrace doctor`` prints it, so a
default cannot differ between the code, the docs and the doctor.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from .windows import Schedule

_FALSE = {"0", "false", "no", "off", ""}


def _flag(raw: str) -> bool:
    return raw.strip().lower() not in _FALSE


def _text(raw: str) -> str | None:
    return raw or None


def _fraction(raw: str) -> float:
    return min(1.0, max(0.0, float(raw)))


def _grace(raw: str) -> float:
    return max(0.05, float(raw))


GPU_TIMING_LEVELS = ("0", "1", "all")
"""``SGLANG_MMTRACE_GPU_TIMING``: no CUDA marks; the scheduler's GPU stages (vision encoder, embedding,
prefill, sampling); those and the API process's (the fast image processor's resize/normalize and the
``cuda_ipc`` pool copies, SGLang 0.5.17)."""


def _gpu_timing(raw: str) -> str:
    """A level of ``GPU_TIMING_LEVELS``; the flag spellings still read as before (off: ``0``, on: ``1``)."""
    r = raw.strip().lower()
    if r in GPU_TIMING_LEVELS:
        return r
    if r in _FALSE:
        return "0"
    if r in ("true", "yes", "on"):
        return "1"
    raise ValueError(raw)


CAPTURE_MODES = {"no_content": False, "event_only": False, "span_only": True, "span_and_event": True}
"""``OTEL_INSTRUMENTATION_GENAI_CAPTURE_MESSAGE_CONTENT``'s modes (opentelemetry-util-genai) -> capture:
the plugin puts content on its root span and in its record and emits no events, so only the modes
that put content on spans turn it on."""


def _capture(raw: str) -> bool:
    """A content-capture setting: a mode of ``CAPTURE_MODES`` or a flag (the boolean form both
    variables take)."""
    mode = CAPTURE_MODES.get(raw.strip().lower())
    return _flag(raw) if mode is None else mode


def _names(raw: str) -> frozenset[str]:
    return frozenset(x.strip() for x in raw.split(",") if x.strip())


def _stall(raw: str) -> tuple[str, float] | None:
    component, _, seconds = raw.partition(":")
    return (component.strip(), float(seconds)) if component.strip() else None


def _window(raw: str) -> Schedule | None:
    return Schedule.parse(raw) if raw.strip() else None


@dataclass(frozen=True)
class Variable:
    name: str
    field: str | None
    """The ``Config`` attribute it sets; None for a variable read elsewhere (the manifest override)."""
    default: Any
    meaning: str
    parse: Callable[[str], Any] = _text
    """Raw text -> value; a ValueError means the default (a typo never stops SGLang)."""
    fallbacks: tuple[str, ...] = ()
    """Standard OpenTelemetry variables consulted, in order, when this one is unset or empty."""
    documented: bool = True

    @property
    def shown_default(self) -> str:
        """The default as the README and the doctor print it."""
        if self.default is None:
            return "unset"
        if isinstance(self.default, bool):
            return "1" if self.default else "0"
        return str(self.default)

    def value(self, env: Mapping[str, str]) -> Any:
        """This variable's value in ``env``, with the fallbacks and the default applied."""
        raw = env.get(self.name)
        if self.fallbacks:  # an empty value counts as unset, so the next name is consulted
            raw = next((env[n] for n in (self.name, *self.fallbacks) if env.get(n)), None)
        if raw is None:
            return self.default
        try:
            value = self.parse(raw)
        except ValueError:
            return self.default
        return self.default if value is None else value


SGLANG_MMTRACE_MANIFEST = "SGLANG_MMTRACE_MANIFEST"
"""Path of a manifest TOML that replaces the packaged one (a patched SGLang build; drift tests)."""

SGLANG_MMTRACE_WHEEL_CACHE = "SGLANG_MMTRACE_WHEEL_CACHE"
"""Folder of the SGLang release wheels that the manifest check reads (``doctor --matrix``, CI); default
``~/.cache/sglang-mmtrace/wheels``. Not read by the plugin."""

SGLANG_MMTRACE_OTLP_ENDPOINT = "SGLANG_MMTRACE_OTLP_ENDPOINT"
SGLANG_MMTRACE_WINDOW = "SGLANG_MMTRACE_WINDOW"

# The standard OpenTelemetry variables the plugin reads (sinks.otlp.settings) with the SDK's meaning;
# the SDK's exporter reads the rest of the exporter's ones (headers, certificates, compression).
OTEL_EXPORTER_OTLP_TRACES_ENDPOINT = "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT"
OTEL_EXPORTER_OTLP_ENDPOINT = "OTEL_EXPORTER_OTLP_ENDPOINT"
OTEL_EXPORTER_OTLP_TRACES_PROTOCOL = "OTEL_EXPORTER_OTLP_TRACES_PROTOCOL"
OTEL_EXPORTER_OTLP_PROTOCOL = "OTEL_EXPORTER_OTLP_PROTOCOL"
OTEL_EXPORTER_OTLP_TRACES_INSECURE = "OTEL_EXPORTER_OTLP_TRACES_INSECURE"
OTEL_EXPORTER_OTLP_INSECURE = "OTEL_EXPORTER_OTLP_INSECURE"
OTEL_EXPORTER_OTLP_TRACES_TIMEOUT = "OTEL_EXPORTER_OTLP_TRACES_TIMEOUT"
OTEL_EXPORTER_OTLP_TIMEOUT = "OTEL_EXPORTER_OTLP_TIMEOUT"
OTEL_SERVICE_NAME = "OTEL_SERVICE_NAME"
OTEL_RESOURCE_ATTRIBUTES = "OTEL_RESOURCE_ATTRIBUTES"
OTEL_SDK_DISABLED = "OTEL_SDK_DISABLED"
OTEL_TRACES_SAMPLER = "OTEL_TRACES_SAMPLER"
OTEL_TRACES_SAMPLER_ARG = "OTEL_TRACES_SAMPLER_ARG"
OTEL_PROPAGATORS = "OTEL_PROPAGATORS"
OTEL_INSTRUMENTATION_GENAI_CAPTURE_MESSAGE_CONTENT = "OTEL_INSTRUMENTATION_GENAI_CAPTURE_MESSAGE_CONTENT"

VARIABLES: tuple[Variable, ...] = (
    Variable("SGLANG_MMTRACE", "enabled", True, "master switch; 0 turns every part off", _flag),
    Variable(
        "SGLANG_MMTRACE_JSONL", "jsonl_path", None, "append one breakdown record per finished request to this file"
    ),
    Variable(
        SGLANG_MMTRACE_OTLP_ENDPOINT,
        "otlp_endpoint",
        None,
        "OTLP span export, a base (http/protobuf: /v1/traces appended) or a URL naming the path (falls back "
        "to OTEL_EXPORTER_OTLP_TRACES_ENDPOINT, used as given, then OTEL_EXPORTER_OTLP_ENDPOINT, a base); "
        "service name, resource, TLS, headers and OTEL_SDK_DISABLED as the OpenTelemetry SDK reads them",
        fallbacks=(OTEL_EXPORTER_OTLP_TRACES_ENDPOINT, OTEL_EXPORTER_OTLP_ENDPOINT),
    ),
    Variable(
        "SGLANG_MMTRACE_OTLP_PROTOCOL",
        "otlp_protocol",
        "http/protobuf",
        "grpc or http/protobuf (falls back to OTEL_EXPORTER_OTLP_TRACES_PROTOCOL, then OTEL_EXPORTER_OTLP_PROTOCOL)",
        fallbacks=(OTEL_EXPORTER_OTLP_TRACES_PROTOCOL, OTEL_EXPORTER_OTLP_PROTOCOL),
    ),
    Variable(
        "SGLANG_MMTRACE_OTLP_METRICS",
        "otlp_metrics",
        False,
        "1: also export the OpenTelemetry GenAI server metrics over OTLP, to the spans' endpoint and protocol",
        _flag,
    ),
    Variable(
        "SGLANG_MMTRACE_SAMPLE",
        "sample",
        1.0,
        "fraction of requests that get spans (records always count every request), as a parent-based "
        "trace-id ratio sampler; OTEL_TRACES_SAMPLER (with OTEL_TRACES_SAMPLER_ARG), where set, replaces it",
        _fraction,
    ),
    Variable("SGLANG_MMTRACE_METRICS", "metrics", True, "Prometheus metrics", _flag),
    Variable(
        "SGLANG_MMTRACE_METRICS_PORT", "metrics_port", 9464, "own metrics port when SGLang's metrics are off", int
    ),
    Variable(
        "SGLANG_MMTRACE_EXEMPLARS",
        "exemplars",
        False,
        "1: with SGLang's --enable-metrics too, serve the plugin's metrics on its own port (with trace-id "
        "exemplars) instead of SGLang's /metrics",
        _flag,
    ),
    Variable("SGLANG_MMTRACE_NVTX", "nvtx", True, "NVTX ranges", _flag),
    Variable(
        "SGLANG_MMTRACE_GPU_TIMING",
        "gpu_timing",
        "1",
        "time GPU stages with CUDA events, read without stalling the hot path: 1 the scheduler's (vision "
        "encoder, embedding, prefill, sampling); all also the API process's (the fast image processor's "
        "resize/normalize and the cuda_ipc copies, which add host time to an image request's TTFT for a "
        "small GPU tail; host-timed otherwise); 0 none",
        _gpu_timing,
    ),
    Variable(
        "SGLANG_MMTRACE_CAPTURE_CONTENT",
        "capture_content",
        False,
        "never put prompt text, image bytes or URLs anywhere unless 1; with 1 the prompt and image URLs "
        "(data: URLs as type and size only) go into the record's content and the root span. Unset: "
        "OTEL_INSTRUMENTATION_GENAI_CAPTURE_MESSAGE_CONTENT decides (true, SPAN_ONLY, SPAN_AND_EVENT: on; "
        "false, NO_CONTENT, EVENT_ONLY: off)",
        _capture,
        fallbacks=(OTEL_INSTRUMENTATION_GENAI_CAPTURE_MESSAGE_CONTENT,),
    ),
    Variable(
        SGLANG_MMTRACE_WINDOW,
        "window",
        None,
        "tracing windows, <window>/<period> (e.g. 10s/60s; units ms, s, m, h): the plugin stays installed but "
        "is switched off except for the first <window> of every <period> of wall-clock time, so windows of "
        "servers with one setting coincide; records from a window carry `window`. Unset: always on. A bad "
        "value is warned about once and tracing stays always on",
        _window,
    ),
    Variable(SGLANG_MMTRACE_MANIFEST, None, None, "a manifest TOML that replaces the packaged one for this SGLang"),
    Variable(
        "SGLANG_MMTRACE_GRACE_S",
        "grace_s",
        2.0,
        "how long a finished request waits for late stages from a process gone silent (a live process is "
        "waited for until its messages sent after the request ended have been read)",
        _grace,
    ),
    Variable(
        "SGLANG_MMTRACE_TEST_RAISE",
        "test_raise",
        frozenset(),
        "test only: comma-separated hook components (or all) whose plugin code raises, to prove containment",
        _names,
        documented=False,
    ),
    Variable(
        "SGLANG_MMTRACE_TEST_STALL",
        "test_stall",
        None,
        "test only: <hook component>:<seconds>: that component's plugin code sleeps that long each time it "
        "runs (a forward as slow as a cold GPU's first one, which waits for JIT compilation)",
        _stall,
        documented=False,
    ),
)

DEFAULTS: dict[str, Any] = {v.field: v.default for v in VARIABLES if v.field}
"""``Config`` field -> default."""


def from_env(env: Mapping[str, str] | None = None) -> dict[str, Any]:
    """``Config`` field -> value read from ``env`` (the process environment by default)."""
    env = os.environ if env is None else env
    return {v.field: v.value(env) for v in VARIABLES if v.field}


# Internal: set by the API process before SGLang spawns its children, read by the children.
SGLANG_MMTRACE_COLLECTOR = "SGLANG_MMTRACE_COLLECTOR"
"""ZMQ address of the collector process's event socket (internal; set by the plugin in the API process,
inherited by SGLang's other processes)."""

SGLANG_MMTRACE_CONTROL = "SGLANG_MMTRACE_CONTROL"
"""ZMQ address on which the API process publishes runtime-switch flips to the other processes (internal)."""

SGLANG_MMTRACE_COLLECTOR_OWNER = "SGLANG_MMTRACE_COLLECTOR_OWNER"
"""PID of the process that owns the collector (internal)."""

SGLANG_MMTRACE_ADMIN = "SGLANG_MMTRACE_ADMIN"
"""ZMQ address of the collector process's admin socket (internal): tokenizer workers attached to the
collector answer ``/mmtrace/state`` and ``/mmtrace/enabled`` through it."""

SGLANG_MMTRACE_LAUNCHER = "SGLANG_MMTRACE_LAUNCHER"
"""Set to ``1`` by ``sglang-mmtrace run`` (internal): every Python process of the server runs the
launcher's ``sitecustomize``, so SGLang's processes that call no plugin loader install the plugin too."""
