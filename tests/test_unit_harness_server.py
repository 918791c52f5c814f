"""The CPU harness's start-up wait: a server that never turns healthy is reported with where it waits.

No SGLang here: a plain Python process that listens and never answers stands in for a hung start-up
(a real hang cannot be made on demand); the wait, the report and py-spy are the real ones."""

from __future__ import annotations

import subprocess
import sys
import textwrap

import pytest

from sglang_mmtrace.harness import server
from sglang_mmtrace.harness.server import CpuServer, free_port, process_stacks

HANGS = textwrap.dedent(
    """
    import socket, sys, time
    def wait_for_a_scheduler_that_never_comes():
        sock = socket.socket()
        sock.bind(("127.0.0.1", int(sys.argv[1])))
        sock.listen(8)  # connections queue up and nobody reads them: /health never answers
        time.sleep(600)
    wait_for_a_scheduler_that_never_comes()
    """
)


def test_process_stacks_names_the_function_a_process_waits_in():
    proc = subprocess.Popen([sys.executable, "-c", HANGS, str(free_port())])
    try:
        stacks = ""
        for _ in range(50):  # until the child is inside the function (its import takes a moment)
            stacks = process_stacks([proc.pid])
            if "wait_for_a_scheduler_that_never_comes" in stacks:
                break
        assert stacks.startswith("stacks (py-spy dump):"), stacks
        assert "wait_for_a_scheduler_that_never_comes" in stacks, stacks
    finally:
        proc.kill()
        proc.wait()


def test_a_start_up_that_never_answers_health_fails_with_the_stacks(tmp_path, monkeypatch):
    monkeypatch.setattr(server, "HEALTH_PROBE_TIMEOUT_S", 0.5)
    port = free_port()
    srv = CpuServer(port=port, health_timeout=3.0, log_path=tmp_path / "server.log")
    monkeypatch.setattr(srv, "command", lambda: [sys.executable, "-c", HANGS, str(port)])
    with pytest.raises(TimeoutError) as err:
        srv._launch({})
    text = str(err.value)
    assert "not healthy after 3 s (last /health: no answer)" in text, text
    assert "wait_for_a_scheduler_that_never_comes" in text, text
    assert srv.process is None  # stopped, whole session
