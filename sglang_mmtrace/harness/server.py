"""Start the real SGLang server on CPU with the tiny Qwen3-VL, and a minimal streaming client.

The server runs as ``python -m sglang.launch_server`` in its own session, so ``stop()`` can end
the launcher *and* its scheduler/detokenizer children (they are spawned processes, not threads).
Everything the CPU run needs (offline mode, CPU engine, stub libcuda, op placeholders) is set
here and nowhere else; ``shims`` and ``random_model`` say why each piece exists.
"""

from __future__ import annotations

import contextlib
import http.client
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections import deque
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from types import TracebackType
from typing import Any
from urllib.parse import urlsplit

from ..join import ipc
from .families import ensure_family_model, families
from .random_model import default_cache_dir
from .shims import CPU_SHIMS_ENV, SHIMS_DIR, build_cuda_stub

DEFAULT_HEALTH_TIMEOUT_S: float = 240.0
HEALTH_PROBE_TIMEOUT_S: float = 30.0
"""One GET /health's wait. SGLang answers it with a one-token generation and waits up to its
``SGLANG_HEALTH_CHECK_TIMEOUT`` (20 s) for the detokenizer: a shorter client wait gives up on a
slow but healthy server and sends one more generation each time."""
_PROJECT_ROOT: Path = Path(__file__).resolve().parents[2]  # folder holding sglang_mmtrace/
_LOG_TAIL_LINES: int = 60
PROGRESS_S: float = 10.0
"""How often a waiting start-up reports progress (``CpuServer(progress=...)``)."""


STARTUP_PHASES: tuple[tuple[str, str], ...] = (
    ("", "importing SGLang"),
    ("server_args=", "starting its scheduler and detokenizer processes"),
    ("Init parallel begin.", "setting up the model runner"),
    ("Load weight begin.", "loading the model weights"),
    ("Load weight end.", "allocating the KV cache"),
    (" graph begin.", "capturing the model's graphs"),
    ("max_total_num_tokens=", "starting the HTTP server"),
    ("Uvicorn running on", "warming up (SGLang's own first request runs through the model)"),
    ("The server is fired up and ready to roll!", "ready"),
)
"""SGLang's start-up in order: the log line (a part of it) that begins a phase, and what a progress line says.

The lines are SGLang 0.5.23's own (launcher's ``server_args=``, ``Init parallel begin.``, the model
runner's ``Load weight begin.``/``end.``, ``Capture ... graph begin.``, the scheduler's
``max_total_num_tokens=``, uvicorn's ``Uvicorn running on``, ``The server is fired up ...`` after the
warm-up request); a release that words them otherwise shows an earlier phase, never a wrong line."""


class StartupPhase:
    """Which start-up phase a server is in, from the tails of its log taken while it starts.

    The phase is the furthest one any tail showed: the tail is soon all GET /health probes, which
    push a phase's own line out of it."""

    def __init__(self) -> None:
        self.index = 0

    def update(self, log_tail: str) -> str:
        """The phase's words after seeing ``log_tail``."""
        seen = [i for i, (mark, _) in enumerate(STARTUP_PHASES) if mark and mark in log_tail]
        self.index = max([self.index, *seen])
        return STARTUP_PHASES[self.index][1]


def free_port() -> int:
    """Ask the kernel for a free TCP port on 127.0.0.1 (small race window, fine for tests)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def _prepend_path(value: str, existing: str | None) -> str:
    """Prepend ``value`` to a ``os.pathsep`` list such as PYTHONPATH or LD_LIBRARY_PATH."""
    return value if not existing else f"{value}{os.pathsep}{existing}"


def session_pids(sid: int) -> list[int]:
    """Live (non-zombie) processes whose session id is ``sid``, read from /proc.

    A session survives ``setpgid`` in a child and re-parenting to init, so it finds every
    descendant of the launcher, including orphaned scheduler/detokenizer processes.
    """
    pids: list[int] = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            stat = Path(f"/proc/{entry}/stat").read_text()
        except OSError:
            continue
        # Fields after the command name (which may contain spaces) start after the last ')'.
        fields = stat.rsplit(")", 1)[-1].split()
        if len(fields) < 4:
            continue
        state, session = fields[0], int(fields[3])
        if session == sid and state not in ("Z", "X"):
            pids.append(int(entry))
    return pids


def _signal_session(sid: int, sig: signal.Signals) -> None:
    """Send ``sig`` to the process group ``sid`` and to any session member outside it."""
    with contextlib.suppress(ProcessLookupError):
        os.killpg(sid, sig)
    for pid in session_pids(sid):
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, sig)


def _tail(path: Path, lines: int = _LOG_TAIL_LINES) -> str:
    """Last ``lines`` lines of a log file, for error messages."""
    try:
        with path.open("r", errors="replace") as fh:
            return "".join(deque(fh, maxlen=lines))
    except OSError as exc:
        return f"<could not read {path}: {exc}>"


class CpuServer:
    """A real ``sglang.launch_server`` on CPU serving a tiny model of ``family`` (default Qwen3-VL), as a context manager.

    Use ``with CpuServer(...) as srv: stream_chat(srv.base_url, ...)``. ``plugin_enabled`` maps to
    ``SGLANG_MMTRACE=1/0`` and ``jsonl_path`` to ``SGLANG_MMTRACE_JSONL``; ``env`` is applied last,
    so a test can override anything. ``launcher=True`` starts it under ``sglang-mmtrace run`` (the plugin in
    every server process, e.g. the tokenizer workers of ``--tokenizer-worker-num``).
    """

    def __init__(
        self,
        port: int = 0,
        env: Mapping[str, str] | None = None,
        server_args: Sequence[str] = (),
        jsonl_path: Path | str | None = None,
        plugin_enabled: bool = True,
        log_path: Path | str | None = None,
        cache_dir: Path | str | None = None,
        health_timeout: float = DEFAULT_HEALTH_TIMEOUT_S,
        stop_timeout: float = 20.0,
        progress: Callable[[float, str], None] | None = None,
        launcher: bool = False,
        family: str = "qwen3-vl",
    ) -> None:
        self.family: str = family
        """The tiny model's family (``harness.families``): what the server serves."""
        self.port: int = port
        self.extra_env: dict[str, str] = dict(env or {})
        self.server_args: list[str] = list(server_args)
        self.jsonl_path: Path | None = Path(jsonl_path) if jsonl_path is not None else None
        self.plugin_enabled: bool = plugin_enabled
        self.cache_dir: Path = Path(cache_dir) if cache_dir is not None else default_cache_dir()
        self.health_timeout: float = health_timeout
        self.stop_timeout: float = stop_timeout
        self._log_path_arg: Path | None = Path(log_path) if log_path is not None else None
        self.log_path: Path | None = self._log_path_arg
        self.model_path: Path | None = None
        self.process: subprocess.Popen[bytes] | None = None
        self.startup_seconds: float | None = None
        self.progress = progress  # called every PROGRESS_S while starting: (seconds, the log's last lines)
        self.launcher = launcher
        self.tmp_dir: Path | None = None
        self.plugin_leftovers: list[str] = []
        """What the plugin left in ``tmp_dir`` when the server stopped (``sglang-mmtrace-*``): none is its promise."""

    # -- public API -------------------------------------------------------------------------

    @property
    def base_url(self) -> str:
        """``http://127.0.0.1:<port>``; valid once ``start()`` has chosen the port."""
        if self.port == 0:
            raise RuntimeError("server port not chosen yet; call start() first")
        return f"http://127.0.0.1:{self.port}"

    def command(self) -> list[str]:
        """The exact launch command (without environment), for logs and debugging."""
        run = [sys.executable, "-m", "sglang_mmtrace.cli.main", "run", "--"] if self.launcher else []
        return [*run, sys.executable, "-m", "sglang.launch_server", *self.server_flags()]

    def server_flags(self) -> list[str]:
        """SGLang's server arguments for the CPU run (also what the offline Engine is built from)."""
        if self.model_path is None:
            raise RuntimeError("model not prepared yet; call start() or prepare() first")
        return [
            "--model-path", str(self.model_path),
            "--device", "cpu",
            "--host", "127.0.0.1",
            "--port", str(self.port),
            "--attention-backend", "torch_native",
            # Without a cap SGLang sizes the KV cache from free RAM (gigabytes, a long allocation).
            "--max-total-tokens", "65536",
            # SGLang sizes its request-to-token table as max running requests x context length; at
            # the model's own length (262144) that is a 2 GiB table zeroed at every start-up.
            "--context-length", "32768",
            # An idle scheduler otherwise polls its sockets in a busy loop: a whole core of a small
            # machine taken from every other process (the client, a second server, the tests).
            "--sleep-on-idle",
            # Needed for usage.prompt_tokens_details.cached_tokens.
            "--enable-cache-report",
            "--enable-metrics",
            *families()[self.family].server_args,
            *self.server_args,
        ]  # fmt: skip

    def environment(self, stub_dir: Path) -> dict[str, str]:
        """The child environment: offline, CPU engine, stub libcuda, shims, plugin switches."""
        env = dict(os.environ)
        env.pop("SGLANG_MMTRACE_JSONL", None)
        env.update(
            {
                "HF_HUB_OFFLINE": "1",
                "TRANSFORMERS_OFFLINE": "1",
                # Required: without it RotaryEmbedding falls back to vllm ops and the scheduler dies.
                "SGLANG_USE_CPU_ENGINE": "1",
                CPU_SHIMS_ENV: "1",
                "SGLANG_MMTRACE": "1" if self.plugin_enabled else "0",
                "LD_LIBRARY_PATH": _prepend_path(str(stub_dir), env.get("LD_LIBRARY_PATH")),
                # Shims first; then this working tree, so the server loads the same
                # sglang_mmtrace source as the test process (editable install or not).
                "PYTHONPATH": _prepend_path(f"{SHIMS_DIR}{os.pathsep}{_PROJECT_ROOT}", env.get("PYTHONPATH")),
                "PYTHONUNBUFFERED": "1",
                # The server's own temporary folder, removed when it stops: SGLang names its ZMQ sockets
                # with NamedTemporaryFile(delete=False) and leaves them, a handful per start.
                "TMPDIR": str(self.tmp_dir),
                # With --tokenizer-worker-num > 1 uvicorn kills a worker that misses its pings this long;
                # importing SGLang on a busy 2-core machine can hold the GIL longer than the default 10 s.
                "SGLANG_UVICORN_WORKER_HEALTHCHECK_TIMEOUT": "120",
            }
        )
        if self.jsonl_path is not None:
            env["SGLANG_MMTRACE_JSONL"] = str(self.jsonl_path)
        env.update(self.extra_env)
        return env

    def start(self) -> CpuServer:
        """Prepare model and stub, launch the server, and block until it answers /health."""
        if self.process is not None:
            raise RuntimeError("server already started")
        return self._launch(self.prepare())

    def prepare(self) -> dict[str, str]:
        """Build the model and the stub, pick the port and the log file; returns the child environment."""
        self.cache_dir.mkdir(parents=True, exist_ok=True)
        self.model_path = ensure_family_model(self.family, self.cache_dir)
        stub_dir = build_cuda_stub(self.cache_dir)
        if self.port == 0:
            self.port = free_port()
        if self.tmp_dir is None:
            self.tmp_dir = Path(tempfile.mkdtemp(prefix="sglang-cpu-tmp-"))
        if self._log_path_arg is None:
            fd, name = tempfile.mkstemp(prefix=f"sglang-cpu-{self.port}-", suffix=".log")
            os.close(fd)
            self.log_path = Path(name)
        else:
            self.log_path = self._log_path_arg  # _launch creates its folder
        return self.environment(stub_dir)

    def _launch(self, env: dict[str, str]) -> CpuServer:
        """Start ``command()`` in its own session, logging to ``log_path``; wait for /health or stop it."""
        assert self.log_path is not None
        t0 = time.monotonic()
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        with self.log_path.open("wb") as log:
            self.process = subprocess.Popen(
                self.command(),
                env=env,
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
        try:
            self._wait_healthy()
        except BaseException:
            self.stop()
            raise
        self.startup_seconds = time.monotonic() - t0
        return self

    def stop(self) -> None:
        """End the whole process tree: SIGTERM, then SIGKILL after ``stop_timeout`` seconds.

        The launcher gets SIGTERM first, alone, so SGLang's own shutdown stops *and reaps* its
        scheduler/detokenizer (children killed together with their parent become zombies of
        init). Whatever is left of the session then gets SIGTERM, and SIGKILL at the deadline.
        Raises if any process of the session is still alive, so a test never leaks one.
        """
        proc = self.process
        if proc is None:
            self.release_tmp()
            return
        sid = proc.pid
        half = self.stop_timeout / 2
        with contextlib.suppress(ProcessLookupError):
            proc.send_signal(signal.SIGTERM)
        if not self._wait_gone(proc, sid, half):
            _signal_session(sid, signal.SIGTERM)
            if not self._wait_gone(proc, sid, half):
                _signal_session(sid, signal.SIGKILL)
                self._wait_gone(proc, sid, 10.0)
        with contextlib.suppress(subprocess.TimeoutExpired):
            proc.wait(timeout=5.0)
        self.process = None
        self.release_tmp()
        leftover = session_pids(sid)
        if leftover:
            raise RuntimeError(f"server processes survived SIGKILL: {leftover}")

    def release_tmp(self) -> None:
        """Note what the plugin left in the server's temporary folder, then remove the folder (for a
        caller that ran the server's processes itself, such as the offline Engine's driver)."""
        if self.tmp_dir is None:
            return
        self.plugin_leftovers = sorted(p.name for p in self.tmp_dir.glob(f"{ipc.PREFIX}*"))
        shutil.rmtree(self.tmp_dir, ignore_errors=True)
        self.tmp_dir = None

    def log_tail(self, lines: int = _LOG_TAIL_LINES) -> str:
        """Last lines of the server log (launcher, scheduler and detokenizer share it)."""
        return _tail(self.log_path, lines) if self.log_path is not None else ""

    def __enter__(self) -> CpuServer:
        return self.start()

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()

    # -- internals --------------------------------------------------------------------------

    @staticmethod
    def _wait_gone(proc: subprocess.Popen[bytes], sid: int, timeout: float) -> bool:
        """Poll until the launcher is reaped and no session member is alive."""
        deadline = time.monotonic() + timeout
        while True:
            proc.poll()
            if proc.returncode is not None and not session_pids(sid):
                return True
            if time.monotonic() >= deadline:
                return False
            time.sleep(0.1)

    def _wait_healthy(self) -> None:
        """Poll GET /health until 200; raise with the log tail if the launcher dies or times out."""
        assert self.process is not None
        t0 = time.monotonic()
        deadline = t0 + self.health_timeout
        next_progress = t0 + PROGRESS_S
        while True:
            code = self.process.poll()
            if code is not None:
                raise RuntimeError(
                    f"sglang server exited with code {code} before becoming healthy; "
                    f"last log lines ({self.log_path}):\n{self.log_tail()}"
                )
            try:
                status: int | None = http_status(self.base_url, "/health", HEALTH_PROBE_TIMEOUT_S)
            except (OSError, http.client.HTTPException):
                status = None  # not listening yet
            if status == 200:
                return
            now = time.monotonic()
            if self.progress is not None and now >= next_progress:
                next_progress = now + PROGRESS_S
                self.progress(now - t0, self.log_tail(30))
            if now >= deadline:
                raise TimeoutError(
                    f"sglang server not healthy after {self.health_timeout:.0f} s (last /health: "
                    f"{status or 'no answer'}); last log lines ({self.log_path}):\n{self.log_tail()}\n"
                    f"{process_stacks(session_pids(self.process.pid))}"
                )
            time.sleep(0.5)


def process_stacks(pids: Sequence[int], timeout: float = 30.0) -> str:
    """The Python stacks of ``pids`` by ``py-spy dump`` (a test extra), for a server that hangs.

    A start-up that never turns healthy says nothing in SGLang's log about where it waits; the
    stacks of the launcher, scheduler(s) and detokenizer do. Empty when py-spy is not installed."""
    exe = shutil.which("py-spy") or str(Path(sys.executable).with_name("py-spy"))
    if not Path(exe).is_file():
        return ""
    out = []
    for pid in pids:
        try:
            res = subprocess.run([exe, "dump", "--pid", str(pid)], capture_output=True, text=True, timeout=timeout)
            out.append(res.stdout or res.stderr)
        except (OSError, subprocess.TimeoutExpired) as exc:
            out.append(f"py-spy dump --pid {pid}: {exc!r}\n")
    return "stacks (py-spy dump):\n" + "".join(out)


def _base_url_parts(base_url: str) -> tuple[str, int, str]:
    """``http://host:port/prefix`` -> (host, port, path prefix without a trailing slash); ValueError otherwise."""
    url = urlsplit(base_url)
    if url.scheme != "http" or url.hostname is None:
        raise ValueError(f"expected an http:// base URL, got {base_url!r}")
    return url.hostname, url.port or 80, url.path.rstrip("/")


def http_status(base_url: str, path: str, timeout: float) -> int:
    """Status code of GET ``path`` under ``base_url`` (``http://host:port``, a path prefix kept).

    Raises ``OSError`` (refused, timed out, no such host) or ``http.client.HTTPException`` (not HTTP)
    when nothing answers, so a caller can say why; a server starting up answers, with 503."""
    host, port, prefix = _base_url_parts(base_url)
    conn = http.client.HTTPConnection(host, port, timeout=timeout)
    try:
        conn.request("GET", f"{prefix}{path}")
        resp = conn.getresponse()
        resp.read()
        return resp.status
    finally:
        conn.close()


# -- client ---------------------------------------------------------------------------------


def image_message(question: str, images: Sequence[str], image_first: bool = True) -> dict[str, Any]:
    """An OpenAI ``user`` message with one ``image_url`` part per URL and one text part.

    ``image_first`` decides whether the images precede the question, which changes how much of
    the prompt a repeated image shares with an earlier request (prefix caching).
    """
    image_parts: list[dict[str, Any]] = [{"type": "image_url", "image_url": {"url": url}} for url in images]
    text_part: dict[str, Any] = {"type": "text", "text": question}
    content = [*image_parts, text_part] if image_first else [text_part, *image_parts]
    return {"role": "user", "content": content}


def chat_request(
    messages: Sequence[Mapping[str, Any]],
    max_tokens: int = 8,
    *,
    stream: bool = True,
    rid: str | None = None,
    **extra: Any,
) -> dict[str, Any]:
    """The one ``/v1/chat/completions`` body every client here sends: greedy, and when streamed, with
    ``stream_options.include_usage`` so token counts come from ``usage``. ``rid`` pins SGLang's request
    id (else the server picks one); ``extra`` adds fields (e.g. ``ignore_eos=True``)."""
    body: dict[str, Any] = {
        "model": "default",
        "messages": list(messages),
        "max_tokens": max_tokens,
        "temperature": 0,
        "stream": stream,
    }
    if stream:
        body["stream_options"] = {"include_usage": True}
    if rid is not None:
        body["rid"] = rid
    body.update(extra)
    return body


def stream_chat(
    base_url: str,
    messages: Sequence[Mapping[str, Any]],
    max_tokens: int = 8,
    timeout: float = 120.0,
    **extra: Any,
) -> tuple[list[dict[str, Any]], dict[str, Any] | None, bytes]:
    """POST a streamed, greedy ``/v1/chat/completions`` and parse its SSE stream (stdlib only).

    Returns ``(chunks, usage, raw_bytes)``: every ``data:`` JSON object in order (``[DONE]``
    excluded), the last non-null ``usage`` (needs ``include_usage``), and the raw body so a test
    can assert on the exact wire format. ``extra`` adds body fields (``chat_request``), e.g. ``n=2``.
    """
    host, port, prefix = _base_url_parts(base_url)
    body = json.dumps(chat_request(messages, max_tokens, **extra)).encode("utf-8")
    conn = http.client.HTTPConnection(host, port, timeout=timeout)
    try:
        conn.request(
            "POST",
            f"{prefix}/v1/chat/completions",
            body=body,
            headers={"Content-Type": "application/json", "Accept": "text/event-stream"},
        )
        resp = conn.getresponse()
        raw = resp.read()
    finally:
        conn.close()
    if resp.status != 200:
        raise RuntimeError(f"/v1/chat/completions returned HTTP {resp.status}: {raw[:2000].decode(errors='replace')}")

    chunks: list[dict[str, Any]] = []
    usage: dict[str, Any] | None = None
    for event in raw.replace(b"\r\n", b"\n").split(b"\n\n"):
        data_lines = [line[5:].lstrip() for line in event.split(b"\n") if line.startswith(b"data:")]
        if not data_lines:
            continue
        data = b"\n".join(data_lines)
        if data.strip() == b"[DONE]":
            continue
        chunk = json.loads(data)
        if isinstance(chunk, dict) and "error" in chunk and "choices" not in chunk:
            raise RuntimeError(f"server sent an error event: {chunk['error']}")
        chunks.append(chunk)
        if isinstance(chunk, dict) and chunk.get("usage"):
            usage = chunk["usage"]
    return chunks, usage, raw


__all__ = [
    "DEFAULT_HEALTH_TIMEOUT_S",
    "CpuServer",
    "chat_request",
    "free_port",
    "http_status",
    "image_message",
    "session_pids",
    "StartupPhase",
    "stream_chat",
]
