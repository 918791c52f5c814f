"""Configuration read once per process from the environment (names in ``environment_variables``)."""

from __future__ import annotations

import os
from dataclasses import dataclass, field

from . import environment_variables as ev

_FALSE = {"0", "false", "no", "off", ""}


def _flag(name: str, default: bool) -> bool:
    raw = os.environ.get(name)
    if raw is None:
        return default
    return raw.strip().lower() not in _FALSE


def _float(name: str, default: float) -> float:
    try:
        return float(os.environ.get(name, default))
    except ValueError:
        return default


@dataclass(frozen=True)
class Config:
    enabled: bool = True
    jsonl_path: str | None = None
    otlp_endpoint: str | None = None
    otlp_protocol: str = "http/protobuf"
    sample: float = 1.0
    metrics: bool = True
    metrics_port: int = 9464
    nvtx: bool = True
    gpu_timing: bool = True
    capture_content: bool = False
    grace_s: float = 2.0
    test_raise: frozenset[str] = field(default_factory=frozenset)

    @classmethod
    def from_env(cls) -> Config:
        env = os.environ
        endpoint = (
            env.get(ev.SGLANG_MMTRACE_OTLP_ENDPOINT)
            or env.get(ev.OTEL_EXPORTER_OTLP_TRACES_ENDPOINT)
            or env.get(ev.OTEL_EXPORTER_OTLP_ENDPOINT)
            or None
        )
        protocol = env.get(ev.SGLANG_MMTRACE_OTLP_PROTOCOL) or env.get(ev.OTEL_EXPORTER_OTLP_TRACES_PROTOCOL)
        try:
            port = int(env.get(ev.SGLANG_MMTRACE_METRICS_PORT, "9464"))
        except ValueError:
            port = 9464
        raise_set = frozenset(x.strip() for x in env.get(ev.SGLANG_MMTRACE_TEST_RAISE, "").split(",") if x.strip())
        return cls(
            enabled=_flag(ev.SGLANG_MMTRACE, True),
            jsonl_path=env.get(ev.SGLANG_MMTRACE_JSONL) or None,
            otlp_endpoint=endpoint,
            otlp_protocol=protocol or "http/protobuf",
            sample=min(1.0, max(0.0, _float(ev.SGLANG_MMTRACE_SAMPLE, 1.0))),
            metrics=_flag(ev.SGLANG_MMTRACE_METRICS, True),
            metrics_port=port,
            nvtx=_flag(ev.SGLANG_MMTRACE_NVTX, True),
            gpu_timing=_flag(ev.SGLANG_MMTRACE_GPU_TIMING, True),
            capture_content=_flag(ev.SGLANG_MMTRACE_CAPTURE_CONTENT, False),
            grace_s=max(0.05, _float(ev.SGLANG_MMTRACE_GRACE_S, 2.0)),
            test_raise=raise_set,
        )


_config: Config | None = None


def get() -> Config:
    global _config
    if _config is None:
        _config = Config.from_env()
    return _config


def reset() -> None:
    global _config
    _config = None
