"""The Gemma 3 builder: real special ids, architecture, image tokens.

SGLang keys on the special-token ids and the processor's expansion of an image, so those must be
the published checkpoints' values; the weights must load under the published names. Each family is
built once into a temporary folder (5 to 12 s each, offline); no server is started.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from sglang_mmtrace.harness.families import families

# family -> (the ids SGLang and the processor key on, the image token the prompt is expanded with)
EXPECTED: dict[str, tuple[dict[str, int], str]] = {
    "gemma3": (
        {
            "<pad>": 0,
            "<eos>": 1,
            "<bos>": 2,
            "<start_of_turn>": 105,
            "<end_of_turn>": 106,
            "<start_of_image>": 255999,
            "<end_of_image>": 256000,
            "<image_soft_token>": 262144,
        },
        "<image_soft_token>",
    ),
}


@pytest.fixture(scope="module", params=sorted(EXPECTED))
def built(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> tuple[str, Path]:
    name: str = request.param
    out = tmp_path_factory.mktemp(name.replace(".", ""))
    families()[name].build(out, 0)
    return name, out


def test_config_has_the_family_architecture_and_token_ids(built: tuple[str, Path]) -> None:
    name, out = built
    cfg = json.loads((out / "config.json").read_text(encoding="utf-8"))
    assert cfg["architectures"] == [families()[name].architecture]
    assert cfg["text_config"]["dtype"] == "bfloat16"
    assert name == "gemma3"
    assert (cfg["boi_token_index"], cfg["eoi_token_index"], cfg["image_token_index"]) == (255999, 256000, 262144)
    assert cfg["mm_tokens_per_image"] == 256 and cfg["text_config"]["vocab_size"] == 262208
    assert (cfg["vision_config"]["image_size"], cfg["vision_config"]["patch_size"]) == (896, 14)


def test_tokenizer_special_tokens_sit_on_the_real_ids(built: tuple[str, Path]) -> None:
    from transformers import AutoTokenizer

    name, out = built
    tok = AutoTokenizer.from_pretrained(out, local_files_only=True)
    ids, _ = EXPECTED[name]
    assert {t: tok.convert_tokens_to_ids(t) for t in ids} == ids
    if tok.bos_token is not None:  # Gemma and Llama prepend bos; Qwen2 has none
        assert tok.encode("Hello", add_special_tokens=True)[0] == tok.bos_token_id


def test_processor_expands_a_256px_image_to_the_family_token_count(built: tuple[str, Path]) -> None:
    from PIL import Image
    from transformers import AutoProcessor

    name, out = built
    processor = AutoProcessor.from_pretrained(out, local_files_only=True)
    messages = [{"role": "user", "content": [{"type": "image"}, {"type": "text", "text": "Describe it."}]}]
    text = processor.tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
    ids = processor(text=text, images=[Image.new("RGB", (256, 256), (200, 30, 30))])["input_ids"][0]
    ids_of, image_token = EXPECTED[name]
    assert list(ids).count(ids_of[image_token]) == families()[name].image_tokens[256]


def test_weights_load_under_the_published_names(built: tuple[str, Path]) -> None:
    """The vision tower is saved as vision_tower.vision_model.* (SGLang's and the published layout)."""
    from safetensors import safe_open
    from transformers import AutoModelForImageTextToText

    _, out = built
    with safe_open(out / "model.safetensors", "pt") as f:
        vision = [k for k in f.keys() if k.startswith("vision_tower.")]  # noqa: SIM118
    assert vision and all(k.startswith("vision_tower.vision_model.") for k in vision)
    model, info = AutoModelForImageTextToText.from_pretrained(out, local_files_only=True, output_loading_info=True)
    assert not info["missing_keys"] and not info["unexpected_keys"], info


def test_builds_are_seed_deterministic(built: tuple[str, Path], tmp_path: Path) -> None:
    name, out = built
    families()[name].build(tmp_path, 0)
    assert (tmp_path / "model.safetensors").read_bytes() == (out / "model.safetensors").read_bytes()
    assert (tmp_path / "tokenizer.json").read_bytes() == (out / "tokenizer.json").read_bytes()
