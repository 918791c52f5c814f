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

OTEL_EXPORTER_OTLP_TRACES_ENDPOINT = "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT"
OTEL_EXPORTER_OTLP_ENDPOINT = "OTEL_EXPORTER_OTLP_ENDPOINT"
OTEL_EXPORTER_OTLP_TRACES_PROTOCOL = "OTEL_EXPORTER_OTLP_TRACES_PROTOCOL"

# Internal: set by the API process before SGLang spawns its children, read by the children.
SGLANG_MMTRACE_COLLECTOR = "SGLANG_MMTRACE_COLLECTOR"
"""ZMQ address of the API process's collector (internal; set by the plugin, inherited by children)."""

SGLANG_MMTRACE_COLLECTOR_OWNER = "SGLANG_MMTRACE_COLLECTOR_OWNER"
"""PID of the process that owns the collector (internal)."""

SGLANG_MMTRACE_GRACE_S = "SGLANG_MMTRACE_GRACE_S"
"""How long a finished request waits for late stages from other processes (default 2.0 s)."""

SGLANG_MMTRACE_TEST_RAISE = "SGLANG_MMTRACE_TEST_RAISE"
"""Test only: comma-separated hook components (or ``all``) whose plugin code raises, to prove containment."""
