"""Every environment variable the plugin reads, in one place (CONTRACT.md, "Configuration")."""

SGLANG_MMTRACE = "SGLANG_MMTRACE"
"""Master switch, default ``1``; ``0`` turns every part off."""

SGLANG_MMTRACE_JSONL = "SGLANG_MMTRACE_JSONL"
"""Append one breakdown record per finished request to this file."""

SGLANG_MMTRACE_OTLP_ENDPOINT = "SGLANG_MMTRACE_OTLP_ENDPOINT"
SGLANG_MMTRACE_OTLP_PROTOCOL = "SGLANG_MMTRACE_OTLP_PROTOCOL"
SGLANG_MMTRACE_SAMPLE = "SGLANG_MMTRACE_SAMPLE"
SGLANG_MMTRACE_METRICS = "SGLANG_MMTRACE_METRICS"
SGLANG_MMTRACE_METRICS_PORT = "SGLANG_MMTRACE_METRICS_PORT"
SGLANG_MMTRACE_NVTX = "SGLANG_MMTRACE_NVTX"
SGLANG_MMTRACE_GPU_TIMING = "SGLANG_MMTRACE_GPU_TIMING"
SGLANG_MMTRACE_CAPTURE_CONTENT = "SGLANG_MMTRACE_CAPTURE_CONTENT"
"""``1``: the prompt and image URLs (``data:`` URLs shortened to type and size) go into the record's
``content`` and the root span's ``sglang_mmtrace.content.*`` attributes. Off by default."""

SGLANG_MMTRACE_MANIFEST = "SGLANG_MMTRACE_MANIFEST"
"""Path of a manifest TOML that replaces the packaged one (a patched SGLang build; drift tests)."""

OTEL_EXPORTER_OTLP_TRACES_ENDPOINT = "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT"
OTEL_EXPORTER_OTLP_ENDPOINT = "OTEL_EXPORTER_OTLP_ENDPOINT"
OTEL_EXPORTER_OTLP_TRACES_PROTOCOL = "OTEL_EXPORTER_OTLP_TRACES_PROTOCOL"

# Internal: set by the API process before SGLang spawns its children, read by the children.
SGLANG_MMTRACE_COLLECTOR = "SGLANG_MMTRACE_COLLECTOR"
"""ZMQ address of the collector process's event socket (internal; set by the plugin in the API process,
inherited by SGLang's other processes)."""

SGLANG_MMTRACE_CONTROL = "SGLANG_MMTRACE_CONTROL"
"""ZMQ address on which the API process publishes runtime-switch flips to the other processes (internal)."""

SGLANG_MMTRACE_COLLECTOR_OWNER = "SGLANG_MMTRACE_COLLECTOR_OWNER"
"""PID of the process that owns the collector (internal)."""

SGLANG_MMTRACE_GRACE_S = "SGLANG_MMTRACE_GRACE_S"
"""How long a finished request waits for late stages from other processes (default 2.0 s)."""

SGLANG_MMTRACE_TEST_RAISE = "SGLANG_MMTRACE_TEST_RAISE"
"""Test only: comma-separated hook components (or ``all``) whose plugin code raises, to prove containment."""

SGLANG_MMTRACE_TEST_STALL = "SGLANG_MMTRACE_TEST_STALL"
"""Test only: ``<hook component>:<seconds>``: that component's plugin code sleeps that long each time it
runs (a forward as slow as a cold GPU's first one, which waits for JIT compilation)."""


# (name, default, meaning) of every user-facing variable: the README's table is generated from this.
DOCUMENTED: tuple[tuple[str, str, str], ...] = (
    ("SGLANG_MMTRACE", "1", "master switch; 0 turns every part off"),
    ("SGLANG_MMTRACE_JSONL", "unset", "append one breakdown record per finished request to this file"),
    ("SGLANG_MMTRACE_OTLP_ENDPOINT", "unset", "OTLP span export (falls back to OTEL_EXPORTER_OTLP_[TRACES_]ENDPOINT)"),
    ("SGLANG_MMTRACE_OTLP_PROTOCOL", "http/protobuf", "grpc or http/protobuf"),
    ("SGLANG_MMTRACE_SAMPLE", "1.0", "fraction of requests that get spans (records always count every request)"),
    ("SGLANG_MMTRACE_METRICS", "1", "Prometheus metrics"),
    ("SGLANG_MMTRACE_METRICS_PORT", "9464", "own metrics port when SGLang's metrics are off"),
    ("SGLANG_MMTRACE_NVTX", "1", "NVTX ranges"),
    ("SGLANG_MMTRACE_GPU_TIMING", "1", "time GPU stages with CUDA events, read without stalling the hot path"),
    (
        "SGLANG_MMTRACE_CAPTURE_CONTENT",
        "0",
        "never put prompt text, image bytes or URLs anywhere unless 1; with 1 the prompt and image URLs "
        "(data: URLs as type and size only) go into the record's content and the root span",
    ),
    ("SGLANG_MMTRACE_MANIFEST", "unset", "a manifest TOML that replaces the packaged one for this SGLang"),
    ("SGLANG_MMTRACE_GRACE_S", "2.0", "how long a finished request waits for late stages from other processes"),
)
