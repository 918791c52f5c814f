"""Stage names come from the catalogue: no stage-name literal outside ``stages.py``, and each stage's
``stored_by``/``emitted_by`` names code that exists and, for the emitters, names the stage."""

from __future__ import annotations

import ast
import importlib.util
import re
from pathlib import Path

import pytest

from sglang_mmtrace import stages
from sglang_mmtrace.hooks.registry import HOOKS, MODULE_OF, PROCESS_OF
from sglang_mmtrace.manifest import load
from sglang_mmtrace.package import SUPPORTED_VERSIONS
from sglang_mmtrace.stages import STAGES

PACKAGE = Path(stages.__file__).resolve().parent
_GROUPS = "|".join(sorted({s.group for s in STAGES.values() if "." in s.name}))
DOTTED = re.compile(rf"^(?:{_GROUPS})\.[a-z_]+$")
"""A dotted name under a stage group (``model.``, ``scheduler.``...): a stage name, or a misspelt one."""
NOT_STAGES = {
    *HOOKS,  # hook ids share some groups' prefixes (``scheduler.run_batch``, ``transport.wrap_shm_features``)
    "http.request",  # ASGI message types (hooks/api/http_server.py)
    "http.disconnect",
    "http.route",  # the HTTP semantic conventions' attribute (sinks/semconv.py)
    "model.safetensors",  # a checkpoint's file name (harness)
}


def constant_name(stage: str) -> str:
    return stage.upper().replace(".", "_")


def constant_names(stage: str) -> str:
    """A pattern for the names code may use for the stage: its constant, and ``ROOT`` for the root."""
    return "|".join([constant_name(stage), *(["ROOT"] if stage == stages.ROOT else [])])


def stage_literals(source: str) -> list[tuple[int, str]]:
    """(line, value) of every string literal that is a stage name or looks like one."""
    return sorted(
        (node.lineno, node.value)
        for node in ast.walk(ast.parse(source))
        if isinstance(node, ast.Constant)
        and isinstance(node.value, str)
        and (node.value in STAGES or (DOTTED.match(node.value) and node.value not in NOT_STAGES))
    )


def test_scanner_finds_stage_names_and_passes_hook_ids():
    snippet = (
        'emit(rid, "model.vision_encoder", t0, t1)\n'
        'trace.add("tokenize", t0, t1)\n'
        'emit(rid, "model.vision_encodr", t0, t1)\n'
        'HOOKS = {"mm_processor_generic.fetch": f, "scheduler.run_batch": g}\n'
        'name = "scheduler"\n'
    )
    assert stage_literals(snippet) == [(1, "model.vision_encoder"), (2, "tokenize"), (3, "model.vision_encodr")]
    # the catalogue itself: every stage is found there (the scan reads real files, not nothing)
    assert {v for _, v in stage_literals((PACKAGE / "stages.py").read_text())} == set(STAGES)


def test_no_stage_name_literal_outside_the_catalogue():
    files = sorted(PACKAGE.rglob("*.py"))
    assert len(files) > 50, files  # the package, not an empty folder
    found = {
        f"{path.relative_to(PACKAGE)}:{line}": value
        for path in files
        if path != PACKAGE / "stages.py"
        for line, value in stage_literals(path.read_text())
    }
    fixes = {where: f"{value!r} -> stages.{constant_name(value)}" for where, value in found.items()}
    assert not fixes, f"name stages by the constants of sglang_mmtrace.stages: {fixes}"


def test_every_stage_has_its_constant():
    for name in STAGES:
        assert getattr(stages, constant_name(name), None) == name, name
    # and every constant that holds a stage name is that stage's (ROOT: the catalogue's root, by role)
    for key, value in vars(stages).items():
        if key.isupper() and isinstance(value, str) and (value in STAGES or DOTTED.match(value)):
            assert key in (constant_name(value), "ROOT"), (key, value)


def _source_of(entry: str) -> Path:
    """The file of a ``stored_by``/``emitted_by`` entry: a hook id's module, or a module of the package."""
    if entry in HOOKS:
        return PACKAGE / "hooks" / PROCESS_OF[entry] / f"{MODULE_OF[entry]}.py"
    spec = importlib.util.find_spec(f"sglang_mmtrace.{entry}")
    assert spec is not None and spec.origin is not None, f"{entry}: neither a hook id nor a module"
    return Path(spec.origin)


@pytest.mark.parametrize("name", list(STAGES))
def test_stored_and_emitted_by_name_existing_code(name):
    stage = STAGES[name]
    assert stage.emitted_by, f"{name}: who files it?"
    for hook_id in stage.stored_by:
        assert hook_id in HOOKS, f"{name}.stored_by: {hook_id} is no hook id"
    for entry in stage.emitted_by:
        source = _source_of(entry).read_text()
        assert re.search(rf"\b(?:{constant_names(name)})\b", source), f"{name}: {entry} does not name it"


@pytest.mark.parametrize("version", SUPPORTED_VERSIONS)
def test_manifest_hooks_of_a_stage_are_in_its_catalogue_entry(version):
    # A hook the manifest lists for a stage stores or files its times, unless it only sets the plugin up
    # (not gated) or only brackets the call with the stage's NVTX range.
    for entry in load(version).hooks:
        spec = HOOKS[entry.hook_id]
        if not spec.gated or spec.nvtx_only:
            continue
        for name in entry.stages:
            stage = STAGES[name]
            assert entry.hook_id in stage.stored_by + stage.emitted_by, (version, name, entry.hook_id)
