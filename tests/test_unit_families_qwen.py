"""The Qwen2-VL and Qwen2.5-VL builders: real special ids, architecture and processor token counts.

SGLang's Qwen-VL code keys on the special-token ids and the config's architecture, and the records'
``image_tokens`` are checked against ``Family.image_tokens``; a build that drifted on any of these
would serve but time the wrong thing. Each family builds once into a temporary cache (seconds).
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from sglang_mmtrace.harness.families import MODULES, ensure_family_model, families, is_complete
from sglang_mmtrace.harness.random_model import CACHE_ENV, TOKEN_IDS

QWEN_FAMILIES = ("qwen2.5-vl", "qwen2-vl")


@pytest.fixture(scope="module")
def built(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """Each family built once through ``ensure_family_model`` into a throwaway cache."""
    cache = tmp_path_factory.mktemp("cache")
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv(CACHE_ENV, str(cache))
        return {name: ensure_family_model(name) for name in QWEN_FAMILIES}


def test_families_are_registered() -> None:
    assert {"qwen2_5_vl", "qwen2_vl"} <= set(MODULES)
    assert set(QWEN_FAMILIES) <= set(families())


@pytest.mark.parametrize("name", QWEN_FAMILIES)
def test_config_has_the_family_architecture_and_ids(built: dict[str, Path], name: str) -> None:
    fam = families()[name]
    model = built[name]
    assert is_complete(model, fam)
    cfg = json.loads((model / "config.json").read_text(encoding="utf-8"))
    assert cfg["architectures"] == [fam.architecture]
    assert cfg["image_token_id"] == TOKEN_IDS["<|image_pad|>"]
    assert cfg["video_token_id"] == TOKEN_IDS["<|video_pad|>"]
    assert cfg["vision_start_token_id"] == TOKEN_IDS["<|vision_start|>"]
    vision = cfg["vision_config"]
    assert (vision["patch_size"], vision["spatial_merge_size"], vision["temporal_patch_size"]) == (14, 2, 2)
    assert sum(cfg["text_config"]["rope_parameters"]["mrope_section"]) * 2 == 128 // 4  # head_dim
    if name == "qwen2.5-vl":
        assert vision["out_hidden_size"] == cfg["text_config"]["hidden_size"]
        assert max(vision["fullatt_block_indexes"]) < vision["depth"]
    else:
        assert vision["hidden_size"] == cfg["text_config"]["hidden_size"]


@pytest.mark.parametrize("name", QWEN_FAMILIES)
def test_processor_has_real_ids_and_image_token_count(built: dict[str, Path], name: str) -> None:
    from PIL import Image
    from transformers import AutoProcessor

    fam = families()[name]
    processor = AutoProcessor.from_pretrained(built[name], local_files_only=True)
    assert type(processor).__name__ == {"qwen2.5-vl": "Qwen2_5_VLProcessor", "qwen2-vl": "Qwen2VLProcessor"}[name]
    tok = processor.tokenizer
    assert {t: tok.convert_tokens_to_ids(t) for t in TOKEN_IDS} == TOKEN_IDS
    assert tok.eos_token_id == TOKEN_IDS["<|im_end|>"]
    assert list(processor.image_processor.image_mean) == pytest.approx([0.48145466, 0.4578275, 0.40821073])
    prompt = "<|vision_start|><|image_pad|><|vision_end|>"
    for side, want in fam.image_tokens.items():
        out = processor(text=[prompt], images=[Image.new("RGB", (side, side))])
        assert out["input_ids"][0].count(TOKEN_IDS["<|image_pad|>"]) == want, (name, side)
    assert 256 in fam.image_tokens
