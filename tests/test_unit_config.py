"""Configuration: one declaration gives the defaults, the parsing, the README table and the doctor's lines."""

import pytest

from sglang_mmtrace import environment_variables as ev
from sglang_mmtrace.config import Config


def _config(monkeypatch, **env):
    for v in ev.VARIABLES:
        for name in (v.name, *v.fallbacks):
            monkeypatch.delenv(name, raising=False)
    for k, val in env.items():
        monkeypatch.setenv(k, val)
    return Config.from_env()


def test_defaults_are_the_contracts(monkeypatch):
    cfg = _config(monkeypatch)
    assert cfg == Config()
    shown = {v.name: v.shown_default for v in ev.VARIABLES if v.documented}
    assert shown == {  # docs/contract.md, "Configuration"
        "SGLANG_MMTRACE": "1",
        "SGLANG_MMTRACE_JSONL": "unset",
        "SGLANG_MMTRACE_OTLP_ENDPOINT": "unset",
        "SGLANG_MMTRACE_OTLP_PROTOCOL": "http/protobuf",
        "SGLANG_MMTRACE_OTLP_METRICS": "0",  # an addition of this repository
        "SGLANG_MMTRACE_SAMPLE": "1.0",
        "SGLANG_MMTRACE_METRICS": "1",
        "SGLANG_MMTRACE_METRICS_PORT": "9464",
        "SGLANG_MMTRACE_EXEMPLARS": "0",  # an addition of this repository
        "SGLANG_MMTRACE_NVTX": "1",
        "SGLANG_MMTRACE_GPU_TIMING": "1",
        "SGLANG_MMTRACE_CAPTURE_CONTENT": "0",
        "SGLANG_MMTRACE_WINDOW": "unset",  # an addition of this repository
        "SGLANG_MMTRACE_MANIFEST": "unset",
        "SGLANG_MMTRACE_GRACE_S": "2.0",
    }


@pytest.mark.parametrize(
    ("env", "want"),
    [
        ({"SGLANG_MMTRACE": "0"}, {"enabled": False}),
        ({"SGLANG_MMTRACE": ""}, {"enabled": False}),
        ({"SGLANG_MMTRACE": "yes"}, {"enabled": True}),
        ({"SGLANG_MMTRACE_JSONL": ""}, {"jsonl_path": None}),
        ({"SGLANG_MMTRACE_JSONL": "/tmp/r.jsonl"}, {"jsonl_path": "/tmp/r.jsonl"}),
        ({"OTEL_EXPORTER_OTLP_ENDPOINT": "http://b"}, {"otlp_endpoint": "http://b"}),
        (
            {"OTEL_EXPORTER_OTLP_ENDPOINT": "http://b", "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT": "http://t"},
            {"otlp_endpoint": "http://t"},
        ),
        (
            {"SGLANG_MMTRACE_OTLP_ENDPOINT": "", "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT": "http://t"},
            {"otlp_endpoint": "http://t"},
        ),
        (
            {"SGLANG_MMTRACE_OTLP_ENDPOINT": "http://m", "OTEL_EXPORTER_OTLP_ENDPOINT": "x"},
            {"otlp_endpoint": "http://m"},
        ),
        ({"OTEL_EXPORTER_OTLP_TRACES_PROTOCOL": "grpc"}, {"otlp_protocol": "grpc"}),
        ({"SGLANG_MMTRACE_OTLP_PROTOCOL": ""}, {"otlp_protocol": "http/protobuf"}),
        ({"SGLANG_MMTRACE_SAMPLE": "0.25"}, {"sample": 0.25}),
        ({"SGLANG_MMTRACE_SAMPLE": "7"}, {"sample": 1.0}),
        ({"SGLANG_MMTRACE_SAMPLE": "-1"}, {"sample": 0.0}),
        ({"SGLANG_MMTRACE_SAMPLE": "half"}, {"sample": 1.0}),
        ({"SGLANG_MMTRACE_METRICS_PORT": "9999"}, {"metrics_port": 9999}),
        ({"SGLANG_MMTRACE_METRICS_PORT": "nine"}, {"metrics_port": 9464}),
        ({"SGLANG_MMTRACE_GRACE_S": "0"}, {"grace_s": 0.05}),
        ({"SGLANG_MMTRACE_GRACE_S": "x"}, {"grace_s": 2.0}),
        ({"SGLANG_MMTRACE_CAPTURE_CONTENT": "1"}, {"capture_content": True}),
        # the standard GenAI variable, consulted where the plugin's own is unset or empty
        ({"OTEL_INSTRUMENTATION_GENAI_CAPTURE_MESSAGE_CONTENT": "true"}, {"capture_content": True}),
        ({"OTEL_INSTRUMENTATION_GENAI_CAPTURE_MESSAGE_CONTENT": "SPAN_ONLY"}, {"capture_content": True}),
        ({"OTEL_INSTRUMENTATION_GENAI_CAPTURE_MESSAGE_CONTENT": "span_and_event"}, {"capture_content": True}),
        ({"OTEL_INSTRUMENTATION_GENAI_CAPTURE_MESSAGE_CONTENT": "EVENT_ONLY"}, {"capture_content": False}),
        ({"OTEL_INSTRUMENTATION_GENAI_CAPTURE_MESSAGE_CONTENT": "NO_CONTENT"}, {"capture_content": False}),
        ({"OTEL_INSTRUMENTATION_GENAI_CAPTURE_MESSAGE_CONTENT": "false"}, {"capture_content": False}),
        (
            {"SGLANG_MMTRACE_CAPTURE_CONTENT": "0", "OTEL_INSTRUMENTATION_GENAI_CAPTURE_MESSAGE_CONTENT": "true"},
            {"capture_content": False},
        ),
        (
            {"SGLANG_MMTRACE_CAPTURE_CONTENT": "1", "OTEL_INSTRUMENTATION_GENAI_CAPTURE_MESSAGE_CONTENT": "NO_CONTENT"},
            {"capture_content": True},
        ),
        (
            {"SGLANG_MMTRACE_CAPTURE_CONTENT": "", "OTEL_INSTRUMENTATION_GENAI_CAPTURE_MESSAGE_CONTENT": "SPAN_ONLY"},
            {"capture_content": True},
        ),
        ({"SGLANG_MMTRACE_GPU_TIMING": "all"}, {"gpu_timing": "all"}),
        ({"SGLANG_MMTRACE_GPU_TIMING": "ALL "}, {"gpu_timing": "all"}),
        ({"SGLANG_MMTRACE_GPU_TIMING": "off"}, {"gpu_timing": "0"}),
        ({"SGLANG_MMTRACE_GPU_TIMING": "true"}, {"gpu_timing": "1"}),
        ({"SGLANG_MMTRACE_GPU_TIMING": "api"}, {"gpu_timing": "1"}),  # unknown: the default
        ({"SGLANG_MMTRACE_TEST_RAISE": "a, b,,"}, {"test_raise": frozenset({"a", "b"})}),
    ],
)
def test_parsing(monkeypatch, env, want):
    cfg = _config(monkeypatch, **env)
    assert {k: getattr(cfg, k) for k in want} == want


def test_every_config_field_is_declared_once():
    fields = [v.field for v in ev.VARIABLES if v.field]
    assert len(fields) == len(set(fields))
    assert set(fields) == set(Config.__dataclass_fields__)
