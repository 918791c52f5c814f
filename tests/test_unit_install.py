"""The base install reads records: ``pip install sglang-mmtrace`` without extras, in a fresh venv
without SGLang, runs ``report`` (text, ``--html``, ``--chrome-trace``), ``nsys`` and ``doctor``, and a
lab subcommand says in one line which extra it needs (exit 2), never a traceback.

The import check is fast and catches the cause (a module of the base install that imports what only
an extra declares); the venv test proves the effect the way a user meets it. The venv installs from a
copy of the package's files (pip builds in the source folder, which must stay clean) and takes its
wheels from pip's cache after the first run.
"""

from __future__ import annotations

import ast
import json
import os
import re
import shutil
import subprocess
import sys
import tomllib
from importlib.metadata import packages_distributions
from pathlib import Path
from typing import Any

import pytest
from record_checks import ok_record

from sglang_mmtrace.cli.extras import MODULES

ROOT = Path(__file__).resolve().parent.parent
PACKAGE = ROOT / "sglang_mmtrace"
# SGLang's own stack: the lab imports these to build or launch a model, which needs SGLang anyway.
SGLANG_STACK = {"sglang", "torch", "transformers", "tokenizers", "safetensors"}
LAB = ("bench", "harness")  # the subpackages the 'bench' extra is for
PIP_TIMEOUT_S = 300  # a cold pip cache downloads the base's wheels (grpcio, protobuf, ...)


def _requirement_names(requirements: list[str]) -> set[str]:
    return {re.split(r"[\s<>=!~;\[]", r, maxsplit=1)[0].lower() for r in requirements}


def _pyproject() -> dict[str, Any]:
    return tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))["project"]


def _third_party_imports(path: Path) -> tuple[set[str], set[str]]:
    """The top-level names of the modules ``path`` imports that are neither the standard library nor
    ours: those imported when the module loads, and those imported only inside a function."""
    at_load: set[str] = set()
    in_functions: set[str] = set()

    def visit(node: ast.AST, inside: bool) -> None:
        names: list[str] = []
        if isinstance(node, ast.Import):
            names = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            names = [node.module]
        (in_functions if inside else at_load).update(n.partition(".")[0] for n in names)
        if isinstance(node, ast.If) and ast.unparse(node.test).endswith("TYPE_CHECKING"):
            return  # for the type checker only
        inside = inside or isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef)
        for child in ast.iter_child_nodes(node):
            visit(child, inside)

    visit(ast.parse(path.read_text(encoding="utf-8")), False)
    ours = set(sys.stdlib_module_names) | {"__future__", "sglang_mmtrace"}
    return at_load - ours, in_functions - ours


def test_every_import_is_declared_by_the_base_or_its_extra() -> None:
    """What each module imports is declared where it is used: the lab's (bench, harness) imports by the
    base or the 'bench' extra, the rest's by the base. SGLang's stack apart: imported only inside
    functions, which run in SGLang's processes, after finding it installed, or to build or launch a
    model (so the bench against a --url runs without it). And ``cli.extras.MODULES`` are the 'bench'
    extra's modules (its one-line message recognises them)."""
    project = _pyproject()
    base = _requirement_names(project["dependencies"])
    bench = _requirement_names(project["optional-dependencies"]["bench"])
    dists = packages_distributions()  # a namespace package (opentelemetry) has several

    def undeclared(modules: set[str], allowed: set[str]) -> set[str]:
        return {m for m in modules if not {d.lower() for d in dists.get(m, [m])} & allowed}

    problems: dict[str, set[str]] = {}
    for path in sorted(PACKAGE.rglob("*.py")):
        at_load, in_functions = _third_party_imports(path)
        allowed = base | bench if path.relative_to(PACKAGE).parts[0] in LAB else base
        missing = undeclared(at_load, allowed) | undeclared(in_functions - SGLANG_STACK, allowed)
        if missing:
            problems[str(path.relative_to(ROOT))] = missing
    assert not problems, f"imports that pyproject.toml does not declare where they are used: {problems}"
    assert {d.lower() for m in MODULES for d in dists[m]} == bench


def _run(*argv: str | Path, cwd: Path, timeout: float = 60) -> subprocess.CompletedProcess[str]:
    # No PYTHONPATH (this checkout would shadow the installed package) and no user site-packages
    # (numpy there would hide that the venv lacks it).
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"} | {"PYTHONNOUSERSITE": "1"}
    return subprocess.run(list(map(str, argv)), cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout)


@pytest.fixture(scope="module")
def venv(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A venv holding the package from this tree without extras (and so without SGLang): its bin folder."""
    tmp = tmp_path_factory.mktemp("install")
    source = tmp / "source"
    ignore = shutil.ignore_patterns("__pycache__", "*.pyc")
    shutil.copytree(PACKAGE, source / PACKAGE.name, ignore=ignore)
    for name in ("pyproject.toml", "README.md"):
        shutil.copy2(ROOT / name, source / name)
    made = _run(sys.executable, "-m", "venv", tmp / "venv", cwd=tmp)
    assert made.returncode == 0, made.stderr
    bin_dir = tmp / "venv" / "bin"
    # --no-compile: byte-compiling the installed packages is much of the install's time, and not under test.
    pip = _run(
        bin_dir / "python",
        "-m",
        "pip",
        "install",
        "-q",
        "--disable-pip-version-check",
        "--no-compile",
        source,
        cwd=tmp,
        timeout=PIP_TIMEOUT_S,
    )
    assert pip.returncode == 0, pip.stdout + pip.stderr
    return bin_dir


def test_the_base_install_has_no_lab_dependency(venv: Path, tmp_path: Path) -> None:
    """The point of the venv: what the lab needs is absent, so the tests below prove the base suffices."""
    for module in (*sorted(MODULES), "sglang"):
        probe = _run(venv / "python", "-c", f"import {module}", cwd=tmp_path)
        assert probe.returncode != 0 and "ModuleNotFoundError" in probe.stderr, (module, probe.stderr)


def test_report_text_html_and_trace_on_the_base_install(venv: Path, tmp_path: Path) -> None:
    records = tmp_path / "records.jsonl"
    records.write_text(
        "".join(
            json.dumps(ok_record(f"r{i}", 0.1 + i * 0.01, tokenize_s=(0.1 + i * 0.01) / 2)) + "\n" for i in range(3)
        )
    )
    html, trace = tmp_path / "out" / "report.html", tmp_path / "out" / "trace.json"
    done = _run(venv / "sglang-mmtrace", "report", records, "--html", html, "--chrome-trace", trace, cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    assert "(n=3)" in done.stdout and "TTFT p50 110.0 ms" in done.stdout, done.stdout
    tokenize = next(line.split() for line in done.stdout.splitlines() if line.split()[:1] == ["tokenize"])
    assert tokenize == ["tokenize", "55.00", "59.50", "50.0%", "3"], done.stdout
    assert "Traceback" not in done.stderr, done.stderr
    assert "<html" in html.read_text(encoding="utf-8")
    slices = [e for e in json.loads(trace.read_text(encoding="utf-8"))["traceEvents"] if e.get("ph") == "X"]
    assert {e["name"] for e in slices} >= {"request", "tokenize"} and len(slices) == 6


@pytest.mark.parametrize(
    ("argv", "line"),
    [
        (
            ["bench", "--url", "http://127.0.0.1:1", "--experiment", "order"],
            "sglang-mmtrace bench needs the 'bench' extra: pip install 'sglang-mmtrace[bench]'",
        ),
        (["bench", "--help"], "sglang-mmtrace bench needs the 'bench' extra: pip install 'sglang-mmtrace[bench]'"),
        (
            ["report", "--compare", "a.jsonl", "b.jsonl"],
            "sglang-mmtrace report --compare needs the 'bench' extra: pip install 'sglang-mmtrace[bench]'",
        ),
        (["demo"], "sglang-mmtrace demo needs the 'instruments' extra: pip install 'sglang-mmtrace[instruments]'"),
    ],
    ids=["bench", "bench-help", "compare", "demo"],
)
def test_a_lab_subcommand_names_its_extra_in_one_line(venv: Path, tmp_path: Path, argv: list[str], line: str) -> None:
    done = _run(venv / "sglang-mmtrace", *argv, cwd=tmp_path)
    assert (done.returncode, done.stdout, done.stderr) == (2, "", line + "\n")


def test_doctor_and_nsys_on_the_base_install(venv: Path, tmp_path: Path) -> None:
    doctor = _run(venv / "sglang-mmtrace", "doctor", cwd=tmp_path)
    assert (doctor.returncode, doctor.stdout, doctor.stderr) == (1, "SGLang: not installed\n", "")
    missing = tmp_path / "missing.sqlite"
    nsys = _run(venv / "sglang-mmtrace", "nsys", missing, cwd=tmp_path)
    assert (
        nsys.returncode == 1
        and nsys.stderr == f"sglang-mmtrace nsys: {missing}: not a readable sqlite export (not a file)\n"
    )
