"""Shared fixtures and helpers for the real-server tests (marker ``server``).

One real SGLang 0.5.23 server (CPU, tiny Qwen3-VL, plugin on, the demo's server arguments) is
started per test session and shared by every ``server`` test; its JSONL records and log live in a
session temp folder, and the log's path and tail go into failure messages.
"""

from __future__ import annotations

import contextlib
import http.client
import json
import os
import shutil
import threading
import time
import warnings
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

import pytest
from record_checks import repeated_stage_problems

from sglang_mmtrace.bench.records import RecordsTail
from sglang_mmtrace.cli.demo import DEMO_SERVER_ARGS
from sglang_mmtrace.harness import CpuServer, ensure_tiny_model
from sglang_mmtrace.harness.server import StartupPhase

STATE_PATH = "/mmtrace/state"
FIGURES_ENV = "MMTRACE_TEST_FIGURES"
"""A folder for the figures some tests write (observed counters, matrices); default: the session's temp folder.
Tests never write into the source tree; to refresh ``benchmarks/results/reliability/`` point this there."""
PROGRESS_EVERY_S = 30.0
"""A step of the suite (a fixture's set-up, a test) that takes longer prints what it is doing this often:
a server start-up or a load fixture takes minutes, and a silent terminal reads as a hang."""
HEALTH_TIMEOUT_S = 600.0  # healthy after ~45 s alone on 2 cores; minutes when shared; under pytest-timeout (900 s) so a hang reports its stacks


class Heartbeat:
    """One daemon thread that prints the innermost running step, its elapsed time and its latest detail
    (e.g. a server's start-up phase) every ``every`` seconds while that step lasts."""

    def __init__(self, write: Callable[[str], object], every: float = PROGRESS_EVERY_S) -> None:
        self._write = write
        self._every = every
        self._steps: list[list[Any]] = []  # [label, start, detail, next print]
        self._lock = threading.Lock()
        threading.Thread(target=self._run, name="test-heartbeat", daemon=True).start()

    @contextlib.contextmanager
    def step(self, label: str) -> Iterator[None]:
        now = time.monotonic()
        with self._lock:
            self._steps.append([label, now, "", now + self._every])
        try:
            yield
        finally:
            with self._lock:
                self._steps.pop()

    def detail(self, text: str) -> None:
        with self._lock:
            if self._steps:
                self._steps[-1][2] = text

    def _run(self) -> None:
        while True:
            time.sleep(min(1.0, self._every / 4))
            now = time.monotonic()
            with self._lock:
                if not self._steps or now < self._steps[-1][3]:
                    continue
                label, start, detail, _ = self._steps[-1]
                self._steps[-1][3] = now + self._every
            self._write(f"  ... {label}: {now - start:.0f} s" + (f" ({detail})" if detail else ""))


_heartbeat: Heartbeat | None = None
_figures: list[Path] = []


def pytest_configure(config: pytest.Config) -> None:
    global _heartbeat
    # While a fixture or test runs, pytest's capture points fd 1 at a temporary file; the heartbeat
    # writes to the terminal's own descriptor, which the capture keeps (private, hence the fallback).
    capturing = getattr(config.pluginmanager.getplugin("capturemanager"), "_global_capturing", None)
    fd = getattr(getattr(capturing, "out", None), "targetfd_save", 1)
    _heartbeat = Heartbeat(lambda line: os.write(fd, f"\n{line}\n".encode()))


def _step(label: str) -> contextlib.AbstractContextManager[None]:
    return _heartbeat.step(label) if _heartbeat is not None else contextlib.nullcontext()


@pytest.hookimpl(hookwrapper=True)
def pytest_fixture_setup(fixturedef: pytest.FixtureDef[Any], request: pytest.FixtureRequest) -> Iterator[None]:
    with _step(f"setting up {fixturedef.argname} ({fixturedef.scope})"):
        yield


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_call(item: pytest.Item) -> Iterator[None]:
    with _step(item.nodeid):
        yield


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_teardown(item: pytest.Item) -> Iterator[None]:
    with _step(f"tearing down after {item.nodeid}"):
        yield


@pytest.fixture(scope="session", autouse=True)
def _figures_folder(tmp_path_factory: pytest.TempPathFactory) -> None:
    _figures.append(Path(os.environ.get(FIGURES_ENV) or tmp_path_factory.mktemp("figures")))


def figures_dir() -> Path:
    """Where a test writes a figure it observed (``FIGURES_ENV``); the run's summary names it."""
    _figures[0].mkdir(parents=True, exist_ok=True)
    return _figures[0]


def pytest_terminal_summary(terminalreporter: Any) -> None:
    if _figures and _figures[0].is_dir() and any(_figures[0].iterdir()):
        terminalreporter.write_line(
            f"figures the tests observed: {_figures[0]} (set {FIGURES_ENV} to keep them elsewhere)"
        )


def _server_progress(name: str) -> Callable[[float, str], None]:
    """A ``CpuServer`` progress callback that puts the start-up's phase into the heartbeat's line."""

    phase = StartupPhase()

    def progress(seconds: float, log_tail: str) -> None:
        if _heartbeat is not None:
            _heartbeat.detail(f"{name}: {phase.update(log_tail)}")

    return progress


@contextlib.contextmanager
def start_server(
    tmp_path_factory: pytest.TempPathFactory,
    name: str,
    env: Mapping[str, str] | None = None,
    server_args: Sequence[str] = DEMO_SERVER_ARGS,
    plugin_enabled: bool = True,
    cache_dir: Path | None = None,
    launcher: bool = False,
    health_timeout: float = HEALTH_TIMEOUT_S,
    attempts: int = 1,
    family: str = "qwen3-vl",
) -> Iterator[CpuServer]:
    """A real CPU server with its records and log in a fresh temp folder ``name``; stopped on exit.

    Every real-server fixture goes through here, so they differ only in what they pass
    (``cache_dir``: where the model is, e.g. :func:`capped_model_cache`; default the shared one;
    ``launcher``: under ``sglang-mmtrace run``; ``family``: the tiny model's, ``harness.families``). ``attempts`` > 1: a start-up that is not healthy in
    ``health_timeout`` is stopped and started again, its report (log tail, stacks) kept as a warning
    in the run's summary; for a fixture whose subject is not the start-up itself.
    """
    folder = tmp_path_factory.mktemp(name)
    for attempt in range(1, attempts + 1):
        srv = CpuServer(
            jsonl_path=folder / "records.jsonl",
            server_args=server_args,
            log_path=folder / ("server.log" if attempt == 1 else f"server-{attempt}.log"),
            health_timeout=health_timeout,
            progress=_server_progress(name),
            plugin_enabled=plugin_enabled,
            cache_dir=cache_dir,
            launcher=launcher,
            family=family,
            # SGLang's timeout for fetching image URLs (default 3 s) is too short on a shared 2-core machine.
            env={"REQUEST_TIMEOUT": "60", **(env or {})},
        )
        try:
            srv.start()
            if _heartbeat is not None:  # the start-up's phase is over: say so, not its last phase
                _heartbeat.detail(f"{name} up after {srv.startup_seconds:.0f} s")
            break
        except TimeoutError as exc:
            if attempt == attempts:
                raise
            warnings.warn(f"{name}: start-up {attempt} of {attempts} not healthy, starting again: {exc}", stacklevel=1)
    try:
        yield srv
    finally:
        srv.stop()
        assert not srv.plugin_leftovers, f"{name}: the plugin left {srv.plugin_leftovers} in the server's temp folder"


def capped_model_cache(root: Path, max_pixels: int, min_pixels: int | None = None) -> Path:
    """A model cache holding the tiny model with the image processor capped at ``max_pixels``
    (``size.longest_edge`` in ``processor_config.json``; the weights are a link to the shared copy),
    and its floor lowered to ``min_pixels`` (``size.shortest_edge``) when given.

    The tiny model's own cap (16,777,216 px) turns a large image into thousands of visual tokens; with a
    lower cap a large image costs its decode and resize, and the encoder sees the capped size."""
    src = ensure_tiny_model()
    dst = root / src.name
    dst.mkdir(parents=True)
    for item in src.iterdir():
        if item.name == "processor_config.json":
            cfg = json.loads(item.read_text())
            cfg["image_processor"]["size"]["longest_edge"] = max_pixels
            if min_pixels is not None:
                cfg["image_processor"]["size"]["shortest_edge"] = min_pixels
            (dst / item.name).write_text(json.dumps(cfg, indent=2))
        elif item.name == "model.safetensors":
            (dst / item.name).symlink_to(item)
        else:
            shutil.copy2(item, dst / item.name)
    return root


@pytest.fixture(scope="session")
def server(tmp_path_factory: pytest.TempPathFactory):
    """ONE real server for the session, plugin on, records to ``<tmp>/records.jsonl``."""
    with start_server(tmp_path_factory, "mmtrace-server") as srv:
        yield srv


def server_context(server: CpuServer) -> str:
    """What a failure message needs to find out more: log path, JSONL path, log tail."""
    return f"\nserver log: {server.log_path}\nrecords: {server.jsonl_path}\nlast log lines:\n{server.log_tail(40)}"


def read_records(path: Path | None) -> list[dict[str, Any]]:
    """Every complete JSON line of the records file (a line still being written is skipped)."""
    if path is None or not path.exists():
        return []
    out = []
    with path.open("r", encoding="utf-8") as fh:
        for line in fh:
            if not line.endswith("\n"):
                break
            line = line.strip()
            if line:
                out.append(json.loads(line))
    return out


def records(server: CpuServer, rids: Iterable[str], timeout: float = 30.0) -> dict[str, dict[str, Any]]:
    """Poll the server's JSONL until every rid has a record; returns rid -> record.

    A rid with more than one record, or a record with a stage more than once (per-image stages
    aside), is a failure: one record per request and one interval per stage are the contract.
    """
    wanted = list(dict.fromkeys(rids))
    tail = RecordsTail(server.jsonl_path, from_start=True)
    found = tail.wait(wanted, timeout)
    missing = [rid for rid in wanted if rid not in found]
    if missing:
        raise AssertionError(
            f"no record after {timeout:.0f} s for {len(missing)} of {len(wanted)} rids: {missing[:10]}"
            + server_context(server)
        )
    dupes = {rid: n for rid in wanted if (n := tail.seen[found[rid]["rid"]]) > 1}
    assert not dupes, f"more than one record per rid: {dupes}" + server_context(server)
    repeated = {rid: p for rid in wanted if (p := repeated_stage_problems(found[rid]))}
    assert not repeated, f"a stage more than once per request: {repeated}" + server_context(server)
    return found


def state(server: CpuServer) -> dict[str, Any]:
    """GET /mmtrace/state: the plugin's per-process live state and error counters."""
    conn = http.client.HTTPConnection("127.0.0.1", server.port, timeout=10)
    try:
        conn.request("GET", STATE_PATH)
        resp = conn.getresponse()
        body = resp.read()
    finally:
        conn.close()
    assert resp.status == 200, f"GET {STATE_PATH} -> HTTP {resp.status}: {body[:500]!r}" + server_context(server)
    return json.loads(body)
