"""``sglang-mmtrace run``: which children install the plugin, how, and the ``sitecustomize`` chain.

The real-server side (two tokenizer workers under the launcher) is ``test_server_multiprocess.py``.
"""

from __future__ import annotations

import functools
import os
import subprocess
import sys
import textwrap
from collections import Counter
from pathlib import Path
from types import SimpleNamespace

from sglang_mmtrace import launcher, plugin, telemetry
from sglang_mmtrace.harness.shims import SHIMS_DIR


def run_detokenizer_process(server_args, port_args):  # SGLang 0.5.17: no loader call
    return server_args, port_args


def run_scheduler_process(server_args):  # SGLang 0.5.23: calls the loader itself
    load_plugins()  # noqa: F821 - never run; only its name in the code object matters
    return server_args


def subprocess_started(config, target, sockets):  # uvicorn's worker entry, its argument names kept
    return config, target, sockets


subprocess_started.__module__ = "uvicorn._subprocess"


def test_role_of_children():
    worker = {"config": SimpleNamespace(app="sglang.srt.entrypoints.http_server:app")}
    assert launcher.role_of(subprocess_started, worker) == plugin.API
    assert launcher.role_of(subprocess_started, {"config": SimpleNamespace(app=object())}) is None
    assert launcher.role_of(run_detokenizer_process, {}) == plugin.DETOKENIZER
    assert launcher.role_of(functools.partial(run_detokenizer_process, 1), {}) == plugin.DETOKENIZER
    assert launcher.role_of(run_scheduler_process, {}) is None  # SGLang installs it there
    assert launcher.role_of(print, {}) is None


def test_adopt_installs_before_the_target_and_passes_everything_through(monkeypatch):
    installed: list[str] = []
    monkeypatch.setattr(plugin, "install", lambda role, join: installed.append((role, join)))
    proc = SimpleNamespace(_target=run_detokenizer_process, _kwargs={})
    launcher.adopt(proc)
    assert installed == [] and proc._target(1, port_args=2) == (1, 2) and installed == [(plugin.DETOKENIZER, False)]

    loads: list[int] = []
    config = SimpleNamespace(app="sglang.srt.entrypoints.http_server:app", load=lambda: loads.append(1) or "loaded")
    worker = SimpleNamespace(_target=subprocess_started, _kwargs={"config": config, "target": "t", "sockets": []})
    launcher.adopt(worker)
    assert worker._target is subprocess_started  # the worker answers its supervisor's pings first
    assert config.load() == "loaded" and loads == [1]
    assert installed == [(plugin.DETOKENIZER, False), (plugin.API, True)]  # the worker joins the collector


def test_a_failing_install_never_stops_the_child_and_is_counted(monkeypatch):
    def boom(role, join):
        raise RuntimeError("no")

    monkeypatch.setattr(plugin, "install", boom)
    monkeypatch.setattr(telemetry, "errors", Counter())
    proc = SimpleNamespace(_target=run_detokenizer_process, _kwargs={})
    launcher.adopt(proc)
    assert proc._target("a", "b") == ("a", "b") and telemetry.errors == {"launcher.install": 1}


def _run(tmp_path: Path, code: str, pythonpath: list[str], env: dict[str, str] | None = None) -> str:
    script = tmp_path / "probe.py"
    script.write_text(textwrap.dedent(code))
    project = str(Path(launcher.__file__).resolve().parents[1])
    full = {**os.environ, "PYTHONPATH": os.pathsep.join([*pythonpath, project]), **(env or {})}
    full.pop(plugin.ev.SGLANG_MMTRACE_LAUNCHER, None)
    out = subprocess.run(
        [sys.executable, "-m", "sglang_mmtrace.cli.main", "run", "--", sys.executable, str(script)],
        env=full, capture_output=True, text=True, timeout=120, cwd=tmp_path,
    )  # fmt: skip
    assert out.returncode == 0, out.stderr[-3000:]
    return out.stdout


def test_run_puts_the_launcher_first_and_chains_every_other_sitecustomize_once(tmp_path):
    """The harness's CPU shims and a user's sitecustomize still run, each once, in parent and child."""
    user, log = tmp_path / "user", tmp_path / "user-site.log"
    user.mkdir()
    (user / "sitecustomize.py").write_text(
        f"import os, sys\nwith open({str(log)!r}, 'a') as fh:\n"
        "    fh.write(f'{os.getpid()} {getattr(sys, \"_mmtrace_launcher\", False)}\\n')\n"
    )
    code = """
        import multiprocessing as mp, os, sys

        def child():
            print("child", os.getpid(), getattr(sys, "_mmtrace_launcher", False), os.environ["SGLANG_MMTRACE_LAUNCHER"])

        if __name__ == "__main__":
            print("script", os.getpid(), os.environ["PYTHONPATH"].split(os.pathsep)[0])
            print("shims", any(type(f).__name__ == "_TorchOpsFinder" for f in sys.meta_path))
            p = mp.get_context("spawn").Process(target=child)
            p.start()
            p.join()
    """
    out = _run(tmp_path, code, [str(SHIMS_DIR), str(user)], {"MMTRACE_HARNESS_CPU_SHIMS": "1"})
    words = {line.split()[0]: line.split()[1:] for line in out.splitlines()}
    assert words["script"][1] == str(launcher.SITE_DIR) and words["shims"] == ["True"], out
    assert words["child"][1:] == ["True", "1"], out
    under_launcher = [line.split()[0] for line in log.read_text().splitlines() if line.endswith("True")]
    for pid in (words["script"][0], words["child"][0]):
        assert under_launcher.count(pid) == 1, (pid, log.read_text())


def test_run_without_a_command_is_a_usage_error():
    assert launcher.run([]) == 2 and launcher.run(["--"]) == 2
    assert launcher.run(["--", "no-such-command-mmtrace"]) == 127
