"""Every release's manifest against that release's wheel source, without installing it (no GPU, no torch).

The wheels come from PyPI once per machine (``pip download sglang==<v> --no-deps`` into
``~/.cache/sglang-mmtrace/wheels`` or ``SGLANG_MMTRACE_WHEEL_CACHE``; about 200 MB for the seven)
and stay there for later runs. Without PyPI and without the wheels in the cache these tests FAIL
with the ``pip download`` error: the check is the point of the test, there is nothing to skip to.
The drift cases below use the real wheels too: an older manifest on a newer release, a method
the target class only inherits, an argument a hook reads under a name the release does not have.
"""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

from sglang_mmtrace import manifest_check as mc
from sglang_mmtrace.cli import doctor
from sglang_mmtrace.hooks.registry import HOOKS, MODULE_OF, PROCESS_OF, READS_OF
from sglang_mmtrace.manifest import HookEntry, load
from sglang_mmtrace.package import PRIMARY_VERSION as PRIMARY
from sglang_mmtrace.package import SUPPORTED_VERSIONS, sglang_version
from sglang_mmtrace.stages import STAGES

ROOT = Path(__file__).resolve().parents[1]
HOOKS_DIR = ROOT / "sglang_mmtrace" / "hooks"
README = ROOT / "README.md"


@pytest.fixture(scope="module")
def sources() -> dict[str, mc.WheelSource]:
    """Every supported release's wheel, downloaded into the cache when not there yet."""
    return {v: mc.WheelSource(mc.wheel(v)) for v in SUPPORTED_VERSIONS}


def _entry(manifest_version: str, hook_id: str) -> HookEntry:
    return next(e for e in load(manifest_version).hooks if e.hook_id == hook_id)


@pytest.mark.parametrize("version", SUPPORTED_VERSIONS)
def test_each_release_manifest_resolves_in_its_own_wheel(sources, version):
    source = sources[version]
    assert source.version == version
    results = mc.check(load(version), source)
    assert len(results) == len(load(version).hooks) > 20
    failed = {r.entry.hook_id: r.why for r in results if not r.ok}
    assert not failed, failed
    assert all(r.where.startswith("sglang/srt/") for r in results)


def test_readme_support_matrix_is_generated_from_the_wheels(tmp_path, capsys):
    copy = tmp_path / "README.md"
    copy.write_text(README.read_text())
    (tmp_path / "docs").mkdir()
    (tmp_path / "docs" / "families.md").write_text((README.parent / "docs" / "families.md").read_text())
    assert doctor.run(show_matrix=True, readme=str(copy)) == 0
    assert (tmp_path / "docs" / "families.md").read_text() == (README.parent / "docs" / "families.md").read_text()
    table, families = capsys.readouterr().out.strip().split("\n\n| stage (SGLang ", 1)
    assert copy.read_text() == README.read_text(), "run: sglang-mmtrace doctor --matrix --readme README.md"
    assert f"{mc.MATRIX_BEGIN}\n{table}\n{mc.MATRIX_END}" in README.read_text()
    families_doc = README.parent / "docs" / "families.md"
    assert f"{mc.FAMILY_BEGIN}\n| stage (SGLang {families}\n{mc.FAMILY_END}" in families_doc.read_text()
    rows = [line for line in table.splitlines() if line.startswith("| `")]
    assert [row.split("`")[1] for row in rows] == list(STAGES)
    assert all(row.count("|") == len(SUPPORTED_VERSIONS) + 2 for row in rows)
    # a "none" cell points at the manifest's reason: 0.5.17 has no preprocessing cache on Qwen-VL
    assert load("0.5.17").absent["mm.preprocess_cache"] in table


def test_the_older_manifest_would_miss_a_changed_kind(sources):
    # The "nearest not newer" rule would give 0.5.20 the 0.5.17 manifest: its sync _send_one_request
    # wrapper on 0.5.20's coroutine would never dispatch a request. The check names it.
    results = {r.entry.hook_id: r for r in mc.check(load("0.5.17"), sources["0.5.20"])}
    assert results["tokenizer_manager.dispatch"].why == "kind is async, manifest says sync"
    # (and the occupancy counters' targets, which moved to mm_schedule / multimodal.transport in 0.5.18)
    assert {h for h, r in results.items() if not r.ok} == {
        "tokenizer_manager.dispatch",
        "embedding_cache.init",
        "cuda_ipc_pool.fallback",
    }
    # and the 0.5.23 manifest on 0.5.20 names the function that is not there yet
    newer = {r.entry.hook_id: r for r in mc.check(load("0.5.23"), sources["0.5.20"])}
    assert newer["mm_embedding.prepare"].why == "prepare_mm_inputs not defined in sglang/srt/managers/mm_utils.py"


def test_an_inherited_method_is_refused_with_the_class_that_defines_it(sources):
    # patch.resolve refuses an inherited attribute (wrapping it on the subclass would shadow the base
    # for that class only); the check does the same and says which class to hook.
    entry = replace(
        _entry("0.5.23", "mm_processor.decode"),
        target="sglang.srt.multimodal.processors.qwen_vl.QwenVLImageProcessor.decode_media_snapshot",
    )
    result = mc.check_entry(mc.Tree(sources["0.5.23"]), entry)
    assert result.why == (
        "QwenVLImageProcessor.decode_media_snapshot is inherited from "
        "sglang.srt.multimodal.media_artifacts.base.MediaArtifactCacheMixin: hook that class"
    )


def test_argument_reads_are_checked_against_the_signature(sources):
    tree = mc.Tree(sources["0.5.23"])
    dispatch = _entry("0.5.23", "tokenizer_manager.dispatch")
    assert READS_OF["tokenizer_manager.dispatch"] == ((0, "tokenized_obj"),)
    assert mc.check_entry(tree, dispatch, READS_OF["tokenizer_manager.dispatch"]).ok
    wrong_name = mc.check_entry(tree, dispatch, ((0, "obj"),))
    assert wrong_name.why is not None and "reads argument 0 as 'obj'" in wrong_name.why
    assert "'tokenized_obj'" in wrong_name.why
    too_far = mc.check_entry(tree, dispatch, ((7, None),))
    assert too_far.why is not None and "reads argument 7" in too_far.why
    # a classmethod's cls is not a position (0.5.17's _load_single_item(cls, data, modality, ...))
    load_decode = _entry("0.5.17", "mm_processor_generic.load_decode")
    assert READS_OF[load_decode.hook_id] == ((1, "modality"),)
    assert mc.check_entry(mc.Tree(sources["0.5.17"]), load_decode, READS_OF[load_decode.hook_id]).ok
    # a module-level function has no self to skip (wrap_shm_features(obj, ...))
    wrap = _entry("0.5.23", "transport.wrap_shm_features")
    assert mc.check_entry(tree, wrap, READS_OF[wrap.hook_id]).ok
    assert not mc.check_entry(tree, wrap, ((1, "obj"),)).ok


def test_kinds_and_missing_modules(sources):
    tree = mc.Tree(sources["0.5.23"])
    app = _entry("0.5.23", "http_server.app")
    assert mc.check_entry(tree, app).ok  # a module-level assignment
    as_function = replace(app, target="sglang.srt.entrypoints.http_server.launch_server")
    assert mc.check_entry(tree, as_function).why == "not a module-level assignment (FunctionDef)"
    gone = replace(app, target="sglang.srt.no_such_module.thing", kind="sync")
    assert mc.check_entry(tree, gone).why == "sglang.srt: no module file, and srt not defined in sglang/__init__.py"


def test_reads_declarations_match_the_hook_code():
    found: dict[str, set] = {}
    for path in sorted(HOOKS_DIR.glob("*/*.py")):
        if path.name == "__init__.py" or path.name == "state.py":
            continue
        found.update(mc.hook_reads(path))
    assert set(found) == set(HOOKS)
    assert {h: r for h, r in found.items() if r} == {h: set(r) for h, r in READS_OF.items() if r}
    for hook_id in READS_OF:
        assert MODULE_OF[hook_id] and PROCESS_OF[hook_id]


def test_reads_finds_factory_arguments_and_raw_reads(tmp_path):
    # the two idioms the hooks use: arg() through a factory's parameter, and kwargs[...] / args[...]
    (tmp_path / "mod.py").write_text(
        "_POS = 2\n"
        "def _scope(name):\n"
        "    def enter(instance, args, kwargs):\n"
        "        return arg(args, kwargs, 0, name)\n"
        "    return enter\n"
        "def _swap(args, kwargs):\n"
        "    return kwargs['fn'] if 'fn' in kwargs else args[_POS]\n"
        "def _names(args, kwargs):\n"
        "    return kwargs.get('a'), kwargs.get('b')\n"
        "HOOKS = {'m.one': interval('m.one', _scope('obj')), 'm.two': spec(_swap), 'm.three': spec(_names),\n"
        "         'm.none': spec(lambda i, a, k: None)}\n"
    )
    assert mc.hook_reads(tmp_path / "mod.py") == {
        "m.one": {(0, "obj")},
        "m.two": {(2, "fn")},
        "m.three": {(None, "a"), (None, "b")},
        "m.none": set(),
    }


def test_doctor_checks_the_installed_sglang(capsys):
    version = sglang_version()
    assert version in SUPPORTED_VERSIONS
    assert doctor._targets(version) == 0
    out = capsys.readouterr().out
    assert "MISSING" not in out and out.rstrip().endswith("stages lost on this SGLang: none")


SERVED = {
    "processor": "sglang.srt.multimodal.processors.qwen_vl.QwenVLImageProcessor",
    "model": "sglang.srt.models.qwen3_vl.Qwen3VLForConditionalGeneration",
}
"""The classes SGLang builds for the harness's Qwen3-VL: where the applies_to entries are hooked."""
SERVED_BY_HOOK = {
    "mm_embedding.audio_encoder": "sglang.srt.models.qwen2_audio.Qwen2AudioForConditionalGeneration",
    "mm_embedding.llava_encoder": "sglang.srt.models.llava.LlavaBaseForCausalLM",
    "mm_embedding.hf_image_encoder": "transformers.models.llava.modeling_llava.LlavaModel",
    "mm_embedding.hf_video_encoder": "transformers.models.qwen2_vl.modeling_qwen2_vl.Qwen2VLModel",
    "mm_embedding.hf_audio_encoder": "transformers.models.gemma4.modeling_gemma4.Gemma4Model",
}
"""Optional applies_to entries Qwen3-VL has no method for: the class of a family that has it."""


def _served(e: Any) -> str:
    return SERVED_BY_HOOK[e.hook_id] if e.hook_id in SERVED_BY_HOOK else SERVED[e.applies_to]


def test_the_static_check_agrees_with_the_runtime_resolution_on_the_installed_sglang():
    # The plugin's own resolution (imports SGLang) and the static check (parses it) on the same
    # installed release: the same targets, every one resolved both ways, the same kinds.
    from sglang_mmtrace.plugin import check as runtime_check

    version = sglang_version()
    manifest = load(version)
    static = mc.check(manifest, mc.installed_source(version))
    # an applies_to entry is hooked on the class SGLang builds: here, the harness's Qwen3-VL's
    runtime = [
        runtime_check(replace(e, target=f"{_served(e)}.{e.target}") if e.applies_to else e)[1] for e in manifest.hooks
    ]
    assert [r.ok for r in static] == [why is None for why in runtime] == [True] * len(manifest.hooks)
    tree = mc.Tree(mc.installed_source(version))
    for e in manifest.hooks:
        if e.applies_to in mc.LATE_FOLDERS:  # an HF model's class is transformers', not SGLang's
            assert _served(e) in mc.definers(tree, e.applies_to, e.target), e.hook_id
    drifted = replace(_entry(version, "tokenizer_manager.tokenize"), kind="sync")  # it is async
    assert runtime_check(drifted)[1] == mc.check_entry(mc.Tree(mc.installed_source(version)), drifted).why


def test_a_wheel_that_cannot_be_had_fails_with_the_reason(tmp_path):
    with pytest.raises(mc.WheelUnavailable, match=r"sglang==0\.0\.0: no wheel in .* failed"):
        mc.wheel("0.0.0", tmp_path)


def test_family_stages_are_read_from_the_source_and_a_lost_one_says_why():
    tree = mc.Tree(mc.WheelSource(mc.wheel(PRIMARY)))
    ok = mc.family_stages(tree, "Qwen2_5_VLForConditionalGeneration")
    assert ok == dict.fromkeys([*mc.FAMILY_STAGES, "model.vision_encoder"], ("ok", ""))
    lost = mc.family_stages(tree, "NoSuchVLForConditionalGeneration")
    assert {state for state, _ in lost.values()} == {"LOST"}
    assert "no processor" in lost["mm.load"][1] and "no model class" in lost["model.vision_encoder"][1]
