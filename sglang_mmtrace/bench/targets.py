"""Where the bench sends requests: a running server (``--url`` + ``--records``) or servers it
launches itself, one configuration at a time (``--launch "<sglang serve args>"``).

Launch mode: on a machine without a GPU the real SGLang server runs on the CPU with the tiny
Qwen3-VL (``harness.CpuServer``; the given args are appended to its command). On a GPU machine it
is ``python -m sglang.launch_server --host 127.0.0.1 --port <free> --enable-cache-report <args>``
with ``SGLANG_MMTRACE_JSONL`` set (so ``<args>`` must name the model: ``--model-path ...``).
Leading ``KEY=VALUE`` words of a launch string are environment for that server, e.g.
``"SGLANG_VLM_CACHE_SIZE_MB=0 --mm-preprocess-cache-size-mb 64"`` (the VLM embedding cache is
sized by that variable in SGLang 0.5.23, not by a flag).
"""

from __future__ import annotations

import contextlib
import http.client
import os
import re
import shlex
import sys
import tempfile
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from ..harness.server import CpuServer, free_port
from .switchctl import http_json

_ENV_WORD = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*=")


@dataclass(frozen=True)
class LaunchConfig:
    """One server configuration: a label, extra environment and SGLang server arguments."""

    label: str
    args: tuple[str, ...] = ()
    env: dict[str, str] = field(default_factory=dict)

    def with_args(self, *extra: str, label: str | None = None) -> LaunchConfig:
        return LaunchConfig(label or self.label, (*self.args, *extra), dict(self.env))


def parse_launch(text: str, label: str | None = None) -> LaunchConfig:
    """``"K=V ... --flag value ..."`` -> LaunchConfig; ``label`` defaults to the text itself."""
    words = shlex.split(text)
    env: dict[str, str] = {}
    while words and _ENV_WORD.match(words[0]):
        key, value = words.pop(0).split("=", 1)
        env[key] = value
    return LaunchConfig(label=label or (" ".join(shlex.split(text)) or "default"), args=tuple(words), env=env)


@dataclass
class Target:
    """A server the bench talks to; ``records`` is its SGLANG_MMTRACE_JSONL (None: unknown);
    ``pid`` its API process (the launched one), for the throughput experiment's CPU accounting
    (None: found by the listening port); ``gpu`` whether it computes on an accelerator (None:
    unknown, ask it with ``server_on_gpu``)."""

    label: str
    base_url: str
    records: Path | None
    pid: int | None = None
    gpu: bool | None = None


def server_on_gpu(base_url: str, timeout: float = 15.0) -> bool | None:
    """Whether a running SGLang server computes on an accelerator: its server info's ``device``
    (``GET /server_info``, ``/get_server_info`` on releases without it) is not ``cpu``. None when
    neither answers with one."""
    for path in ("/server_info", "/get_server_info"):
        try:
            status, body = http_json(base_url, "GET", path, timeout=timeout)
        except (OSError, http.client.HTTPException):
            return None
        if status == 200 and isinstance(body, dict) and body.get("device"):
            return str(body["device"]) != "cpu"
    return None


def gpu_available() -> bool:
    """A CUDA device this process can see (decides which launcher ``--launcher auto`` picks)."""
    try:
        import torch

        return bool(torch.cuda.is_available())
    except Exception:
        return False


class GpuServer(CpuServer):
    """``python -m sglang.launch_server <args>`` as-is (no CPU shims, no tiny model), with the
    plugin's switches in its environment; start/stop/health as ``CpuServer``."""

    def command(self) -> list[str]:
        return [
            sys.executable, "-m", "sglang.launch_server",
            "--host", "127.0.0.1", "--port", str(self.port),
            "--enable-cache-report",  # usage.prompt_tokens_details.cached_tokens
            *self.server_args,
        ]  # fmt: skip

    def environment(self, stub_dir: Path | None = None) -> dict[str, str]:
        env = dict(os.environ)
        env.pop("SGLANG_MMTRACE_JSONL", None)
        env["SGLANG_MMTRACE"] = "1" if self.plugin_enabled else "0"
        if self.jsonl_path is not None:
            env["SGLANG_MMTRACE_JSONL"] = str(self.jsonl_path)
        env.update(self.extra_env)
        return env

    def start(self) -> GpuServer:
        if self.process is not None:
            raise RuntimeError("server already started")
        if self.port == 0:
            self.port = free_port()
        if self.log_path is None:
            fd, name = tempfile.mkstemp(prefix=f"sglang-{self.port}-", suffix=".log")
            os.close(fd)
            self.log_path = Path(name)
        return self._launch(self.environment())


def make_server(
    config: LaunchConfig,
    folder: Path,
    gpu: bool,
    plugin_enabled: bool = True,
    health_timeout: float = 600.0,
    name: str = "server",
) -> CpuServer:
    """A not-yet-started server for ``config``, its records and log in ``folder``."""
    cls = GpuServer if gpu else CpuServer
    return cls(
        jsonl_path=folder / f"{name}.records.jsonl" if plugin_enabled else None,
        server_args=config.args,
        env=config.env,
        plugin_enabled=plugin_enabled,
        log_path=folder / f"{name}.log",
        health_timeout=health_timeout,
    )


@contextlib.contextmanager
def launched(config: LaunchConfig, folder: Path, gpu: bool, health_timeout: float = 600.0) -> Iterator[Target]:
    """Start one server for ``config`` (plugin on), yield it as a Target, stop it on exit."""
    slug = re.sub(r"[^A-Za-z0-9]+", "-", config.label).strip("-")[:60] or "default"
    srv = make_server(config, folder, gpu, health_timeout=health_timeout, name=slug)
    print(f"[bench] starting server '{config.label}' (log {srv.log_path}) ...", file=sys.stderr, flush=True)
    srv.start()
    print(f"[bench] healthy at {srv.base_url} after {srv.startup_seconds:.0f} s", file=sys.stderr, flush=True)
    try:
        yield Target(
            label=config.label,
            base_url=srv.base_url,
            records=srv.jsonl_path,
            pid=srv.process.pid if srv.process else None,
            gpu=gpu,
        )
    finally:
        srv.stop()


def default_config(gpu: bool) -> LaunchConfig:
    """CPU: the demo's configuration (preprocess cache on, so its stage shows)."""
    from ..cli.demo import DEMO_SERVER_ARGS

    if gpu:
        raise SystemExit("on a GPU machine give the server arguments: --launch '--model-path <model> ...'")
    return LaunchConfig(label="cpu demo config", args=tuple(DEMO_SERVER_ARGS))


def configs_from(launch: Sequence[str]) -> list[LaunchConfig]:
    return [parse_launch(t) for t in launch]
