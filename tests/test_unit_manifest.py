"""The catalogue, the version manifests, the hook implementations and docs/contract.md agree."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from sglang_mmtrace.hooks.registry import HOOKS, MODULE_OF, PROCESS_OF
from sglang_mmtrace.manifest import load
from sglang_mmtrace.package import SUPPORTED_VERSIONS
from sglang_mmtrace.stages import STAGES, contract_stage_names, core_stage_names

ROOT = Path(__file__).resolve().parents[1]
CONTRACT = ROOT / "docs" / "contract.md"
SHARED_CONTRACT = ROOT.parent / "shared" / "CONTRACT.md"
"""The team's shared copy, beside a developer's checkout (not in a clone): docs/contract.md embeds it."""

# Stages that need hardware or a deployment the CPU server does not have: none on 0.5.23 today.
CPU_ONLY_ABSENT: set[str] = set()


@pytest.mark.parametrize("version", SUPPORTED_VERSIONS)
def test_manifest_hooks_have_implementations_and_known_stages(version):
    manifest = load(version)
    assert manifest.exact
    for entry in manifest.hooks:
        assert entry.hook_id in HOOKS, entry.hook_id
        assert entry.process in {"api", "scheduler", "detokenizer"}
        assert entry.kind in {"sync", "async", "asyncgen", "asgi"}
        for stage in entry.stages:
            assert stage in STAGES, (entry.hook_id, stage)


def test_every_hook_id_names_its_module():
    # `<module file stem>.<what>`: the id says which file implements it (and is the component that
    # SGLANG_MMTRACE_TEST_RAISE / _STALL and the contained-error counters name).
    assert set(MODULE_OF) == set(HOOKS)
    for hook_id, module in MODULE_OF.items():
        prefix, _, what = hook_id.partition(".")
        assert prefix == module and what, (hook_id, module)
        assert HOOKS[hook_id].component == hook_id, (hook_id, HOOKS[hook_id].component)


@pytest.mark.parametrize("version", SUPPORTED_VERSIONS)
def test_every_hook_module_sits_under_the_process_its_manifest_applies_it_in(version):
    # hooks/api/, hooks/scheduler/, hooks/detokenizer/: the layout says where each hook runs.
    for entry in load(version).hooks:
        assert PROCESS_OF[entry.hook_id] == entry.process, (entry.hook_id, PROCESS_OF[entry.hook_id], entry.process)


def test_every_contract_stage_has_a_target_on_the_primary_version():
    manifest = load("0.5.23")
    covered = {s for e in manifest.hooks for s in e.stages}
    missing = set(core_stage_names()) - covered - CPU_ONLY_ABSENT
    assert not missing


def test_unknown_version_falls_back_to_nearest_older_manifest():
    assert load("0.5.99").version == "0.5.23" and not load("0.5.99").exact
    assert load("0.5.20").version == "0.5.20" and load("0.5.20").exact
    assert load("0.5.20.post1").version == "0.5.20" and not load("0.5.20.post1").exact


def test_catalogue_matches_contract_stage_table():
    text = CONTRACT.read_text()
    if SHARED_CONTRACT.exists():  # a developer's checkout: the repository's copy is the shared one, verbatim
        assert SHARED_CONTRACT.read_text() in text, "docs/contract.md differs from ../shared/CONTRACT.md"
    table = text.split("## Stages", 1)[1].split("\n## ", 1)[0]
    rows = re.findall(r"^\| `([a-z_.]+)` \| (\w+) \| (.*)\|$", table, flags=re.M)
    assert rows, "stage table not found in docs/contract.md"
    assert [name for name, _, _ in rows] == contract_stage_names()
    for name, process, covers in rows:
        assert STAGES[name].process == process, name
        assert STAGES[name].extra == covers.strip().startswith("*(extra)*"), name


def test_supported_range_agrees_with_the_manifests_and_the_package_metadata():
    import tomllib

    from sglang_mmtrace.package import _instruments, in_supported_range, requirement_clauses, version_key

    assert requirement_clauses() == [(">=", min(SUPPORTED_VERSIONS, key=version_key)),
                                     ("<=", max(SUPPORTED_VERSIONS, key=version_key))]  # fmt: skip
    assert all(in_supported_range(v) for v in SUPPORTED_VERSIONS)
    assert in_supported_range("0.5.20") and not in_supported_range("0.5.23.post1")  # PEP 440: a post-release is newer
    assert not in_supported_range("0.5.16") and not in_supported_range("0.5.24") and not in_supported_range("0.6.0")
    pyproject = tomllib.loads((Path(__file__).resolve().parents[1] / "pyproject.toml").read_text())
    assert pyproject["project"]["optional-dependencies"]["instruments"] == list(_instruments)
