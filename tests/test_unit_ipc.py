"""The collector's socket folder (``join/ipc.py``): gone when the collector or its API process ends,
and removed by the next start when both were killed; a live server's is never touched.

The collector runs as a real process (``python -m sglang_mmtrace.join.collector``), and the API
process where its end matters is a real process too (``API`` below). The temp folder is pointed
at a pytest folder, so nothing here depends on, or touches, the machine's own ``/tmp``.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections import Counter
from collections.abc import Callable
from pathlib import Path

import pytest

from sglang_mmtrace import telemetry
from sglang_mmtrace.join import ipc
from sglang_mmtrace.join.client import CollectorClient, admin_request

API = """
import json, os, signal, sys, time
from sglang_mmtrace.join.client import CollectorClient, admin_request

client = CollectorClient("test")
admin_request(client.admin_address, ("state",))  # bound: its sockets are in the folder
print(json.dumps({"folder": client.folder, "collector": client.process.pid, "files": os.listdir(client.folder)}))
sys.stdout.flush()
if sys.argv[1] == "shutdown":  # SGLang's graceful shutdown: its children SIGKILLed, then a normal exit
    client.process.kill()
    client.process.wait()
    sys.exit(0)
time.sleep(60)  # until killed
"""
"""An API process: starts the collector as the plugin does, then ends as ``argv[1]`` says."""

COLLECTOR_ALONE = (
    "from sglang_mmtrace.join import collector; collector._die_with_parent = lambda: None; collector.main()"
)
"""The collector process where the kernel's parent-death signal is not there (it then finds its
API process gone by itself, within a second, and returns)."""


@pytest.fixture
def tempdir(tmp_path_factory: pytest.TempPathFactory, monkeypatch: pytest.MonkeyPatch) -> Path:
    """The temp folder of this process (``tempfile.tempdir``) and of the processes it starts (``TMPDIR``).
    A short path: a socket's path must fit in 107 characters."""
    folder = tmp_path_factory.mktemp("ipc")
    monkeypatch.setattr(tempfile, "tempdir", str(folder))
    monkeypatch.setenv("TMPDIR", str(folder))
    return folder


def _wait(cond: Callable[[], bool], timeout: float = 10.0) -> None:
    deadline = time.monotonic() + timeout
    while not cond():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.05)


def _dead_pid() -> int:
    """The pid of a process that has ended and been reaped."""
    proc = subprocess.Popen(["true"])
    proc.wait()
    return proc.pid


def _start_api(how: str) -> tuple[subprocess.Popen[str], dict]:
    proc = subprocess.Popen([sys.executable, "-c", API, how], stdout=subprocess.PIPE, text=True)
    assert proc.stdout is not None
    started = json.loads(proc.stdout.readline())
    proc.stdout.close()
    assert sorted(started["files"]) == ["admin.ipc", "control.ipc", "events.ipc"]
    return proc, started


def test_a_collector_that_ends_normally_removes_its_folder(tempdir: Path) -> None:
    """Its API process gone, the collector returns from its loop; the folder leaves with it."""
    folder = ipc.new_folder()
    _, _, admin = ipc.addresses(folder)
    parent = f"""
import json, os, subprocess, sys
from sglang_mmtrace.join.client import admin_request
args = ["--ipc-dir", {folder!r}]
subprocess.Popen([sys.executable, "-c", {COLLECTOR_ALONE!r}, *args, "--parent", str(os.getpid())])
admin_request({admin!r}, ("state",))
print(json.dumps(os.listdir({folder!r})))
"""
    out = subprocess.run([sys.executable, "-c", parent], stdout=subprocess.PIPE, text=True, timeout=60)
    assert out.returncode == 0 and sorted(json.loads(out.stdout)) == ["admin.ipc", "control.ipc", "events.ipc"]
    _wait(lambda: not os.path.exists(folder))
    assert list(tempdir.iterdir()) == []


def test_a_sigtermed_collector_removes_its_folder(tempdir: Path) -> None:
    """SIGTERM (the API process stopping it, or the kernel when the API process dies): the folder is
    removed, and the signal still ends the process as it did before (the default action)."""
    client = CollectorClient("test")
    try:
        assert client.folder is not None and client.process is not None
        admin_request(client.admin_address, ("state",))
        assert sorted(os.listdir(client.folder)) == ["admin.ipc", "control.ipc", "events.ipc"]
        client.process.send_signal(signal.SIGTERM)
        assert client.process.wait(10) == -signal.SIGTERM
        assert not os.path.exists(client.folder)  # the collector's doing: this process removes it only in close()
    finally:
        client.close()
    assert list(tempdir.iterdir()) == []


def test_an_api_process_that_exits_normally_removes_the_folder_its_killed_collector_left(tempdir: Path) -> None:
    """SGLang's graceful shutdown SIGKILLs the API process's children (the collector cannot clean up),
    then the API process exits normally: its exit removes the folder."""
    proc, started = _start_api("shutdown")
    assert proc.wait(30) == 0
    assert not os.path.exists(started["folder"])
    assert list(tempdir.iterdir()) == []


def test_the_next_start_removes_what_killed_servers_left_and_keeps_live_ones(tempdir: Path) -> None:
    """A server killed outright (collector and API process) leaves its folder; the next start removes
    it and the loose socket files of earlier plugin versions whose pid is dead, and nothing else: not
    a folder whose socket still listens (a live server whose pid this namespace does not know)."""
    proc, started = _start_api("crash")
    os.kill(started["collector"], signal.SIGKILL)
    proc.kill()
    proc.wait()
    crashed = Path(started["folder"])
    assert crashed.is_dir() and crashed.name.startswith(f"sglang-mmtrace-{proc.pid}-")
    dead, live = _dead_pid(), os.getpid()
    for pid in (dead, live):
        (tempdir / f"sglang-mmtrace-{pid}-events-0123abcd.ipc").touch()
    live_folder = tempdir / f"sglang-mmtrace-{live}-abcd_123"
    live_folder.mkdir()
    (live_folder / "events.ipc").touch()
    (tempdir / "sglang-mmtrace-records.jsonl").touch()  # not a socket's name: not ours to judge
    # a server in another pid namespace (a shared temp folder): its pid looks dead, its socket listens
    other_ns = tempdir / f"sglang-mmtrace-{dead}-ns_other"
    other_ns.mkdir()
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    listener.bind(str(other_ns / "admin.ipc"))
    listener.listen()
    try:
        new = ipc.new_folder()
    finally:
        listener.close()
    assert sorted(p.name for p in tempdir.iterdir()) == sorted(
        [
            live_folder.name,
            f"sglang-mmtrace-{live}-events-0123abcd.ipc",
            "sglang-mmtrace-records.jsonl",
            other_ns.name,
            os.path.basename(new),
        ]
    )
    assert (live_folder / "events.ipc").exists()


def test_sigterm_reaches_the_handler_that_was_there_before(tmp_path: Path) -> None:
    """The collector's SIGTERM handler removes the folder, then chains: it never swallows the signal."""
    seen: list[int] = []
    previous = signal.signal(signal.SIGTERM, lambda signum, frame: seen.append(signum))
    try:
        folder = tmp_path / "sockets"
        folder.mkdir()
        ipc.remove_on_sigterm(str(folder))
        signal.raise_signal(signal.SIGTERM)
        assert seen == [signal.SIGTERM] and not folder.exists()
    finally:
        signal.signal(signal.SIGTERM, previous)


def test_a_failed_removal_is_counted_never_raised(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(telemetry, "errors", Counter())

    def refuse(path: str) -> None:
        raise PermissionError(path)

    monkeypatch.setattr(ipc.shutil, "rmtree", refuse)
    ipc.remove(str(tmp_path))
    assert telemetry.errors["ipc"] == 1 and tmp_path.exists()
