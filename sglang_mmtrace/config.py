"""Configuration read once per process from the environment (names in ``environment_variables``)."""

from __future__ import annotations

from dataclasses import dataclass

from . import environment_variables as ev
from .windows import Schedule

_D = ev.DEFAULTS


@dataclass(frozen=True)
class Config:
    """One field per variable in ``environment_variables.VARIABLES``, whose defaults and parsing it takes."""

    enabled: bool = _D["enabled"]
    jsonl_path: str | None = _D["jsonl_path"]
    otlp_endpoint: str | None = _D["otlp_endpoint"]
    otlp_protocol: str = _D["otlp_protocol"]
    otlp_metrics: bool = _D["otlp_metrics"]
    sample: float = _D["sample"]
    metrics: bool = _D["metrics"]
    metrics_port: int = _D["metrics_port"]
    exemplars: bool = _D["exemplars"]
    nvtx: bool = _D["nvtx"]
    gpu_timing: str = _D["gpu_timing"]
    """``environment_variables.GPU_TIMING_LEVELS``: "0", "1" (the scheduler's GPU stages), "all"."""
    capture_content: bool = _D["capture_content"]
    grace_s: float = _D["grace_s"]
    window: Schedule | None = _D["window"]
    """``SGLANG_MMTRACE_WINDOW``: tracing windows (``windows.py``); None: always on."""
    test_raise: frozenset[str] = _D["test_raise"]
    test_stall: tuple[str, float] | None = _D["test_stall"]

    @classmethod
    def from_env(cls) -> Config:
        return cls(**ev.from_env())


_config: Config | None = None


def get() -> Config:
    global _config
    if _config is None:
        _config = Config.from_env()
    return _config


def reset() -> None:
    global _config
    _config = None
