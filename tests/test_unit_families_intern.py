"""The InternVL3, Mistral 3 and GLM-4.1V tiny builders: real special-token ids, architecture, image tokens.

Each family is built once into a temporary folder (seconds; no server). The image-token counts are
what SGLang's own preprocessing gives a square image of 256 px: for InternVL SGLang tiles images
itself, so its ``dynamic_preprocess`` is taken from SGLang's source (importing the module would pull
in the whole of SGLang, ~30 s); the other families go through their transformers processors, as
SGLang's processors do.
"""

from __future__ import annotations

import ast
import io
import json
from pathlib import Path
from typing import Any

import pytest

from sglang_mmtrace.harness.families import MODULES, families
from sglang_mmtrace.harness.images import make_image


def _build(name: str, tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp(name)
    families()[name].build(out, 0)
    return out


def _image(side: int) -> Any:
    """A square test image of ``side`` px, as PIL (the harness makes PNG bytes)."""
    from PIL import Image

    return Image.open(io.BytesIO(make_image(side, side, seed=1))).convert("RGB")


def _config(model: Path) -> dict[str, Any]:
    return json.loads((model / "config.json").read_text(encoding="utf-8"))


def _sglang_internvl_tiling() -> Any:
    """SGLang 0.5.23's ``InternVLProcessor.dynamic_preprocess`` and ``IMAGE_MAX_NUM``, from its source."""
    import importlib.util

    import torch

    spec = importlib.util.find_spec("sglang")
    assert spec is not None and spec.origin is not None
    path = Path(spec.origin).parent / "srt" / "multimodal" / "processors" / "internvl.py"
    cls = next(
        n for n in ast.parse(path.read_text()).body if isinstance(n, ast.ClassDef) and n.name == "InternVLProcessor"
    )
    namespace: dict[str, Any] = {"torch": torch}
    for node in cls.body:
        if isinstance(node, ast.Assign) and ast.unparse(node.targets[0]) == "IMAGE_MAX_NUM":
            exec(compile(ast.Module([node], []), str(path), "exec"), namespace)
        if isinstance(node, ast.FunctionDef) and node.name == "dynamic_preprocess":
            node.decorator_list = []
            exec(compile(ast.Module([node], []), str(path), "exec"), namespace)
    return namespace["dynamic_preprocess"], namespace["IMAGE_MAX_NUM"]


def test_modules_are_registered() -> None:
    assert {"internvl", "mistral3", "glm4v"} <= set(MODULES)
    assert {"internvl3", "mistral3", "glm4.1v"} <= set(families())


# -- InternVL3 ----------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def internvl(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return _build("internvl3", tmp_path_factory)


def test_internvl_ids_and_architecture(internvl: Path) -> None:
    from transformers import AutoTokenizer

    cfg = _config(internvl)
    assert cfg["architectures"] == ["InternVLChatModel"] and cfg["model_type"] == "internvl_chat"
    assert cfg["llm_config"]["architectures"] == ["Qwen2ForCausalLM"] and "auto_map" not in cfg
    tok = AutoTokenizer.from_pretrained(internvl, local_files_only=True)
    ids = tok.convert_tokens_to_ids(["<img>", "</img>", "<IMG_CONTEXT>", "<|im_start|>", "<|im_end|>"])
    assert ids == [151665, 151666, 151667, 151644, 151645]
    assert len(tok) == cfg["llm_config"]["vocab_size"] == 151674


def test_internvl_image_tokens(internvl: Path) -> None:
    import numpy as np
    import torch

    cfg = _config(internvl)
    tile, patch = cfg["force_image_size"], cfg["vision_config"]["patch_size"]
    per_tile = int((tile // patch) ** 2 * cfg["downsample_ratio"] ** 2)
    dynamic_preprocess, max_num = _sglang_internvl_tiling()
    image = torch.from_numpy(np.array(_image(256))).permute(2, 0, 1).float() / 255
    tiles = dynamic_preprocess(image, image_size=448, max_num=max_num, use_thumbnail=True)
    assert tiles.shape[0] * per_tile == families()["internvl3"].image_tokens[256]


# -- Mistral 3 ----------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def mistral3(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return _build("mistral3", tmp_path_factory)


def test_mistral3_ids_and_architecture(mistral3: Path) -> None:
    from transformers import AutoProcessor

    cfg = _config(mistral3)
    assert cfg["architectures"] == ["Mistral3ForConditionalGeneration"] and cfg["image_token_index"] == 10
    assert cfg["vision_config"]["model_type"] == "pixtral"
    tok = AutoProcessor.from_pretrained(mistral3, local_files_only=True).tokenizer
    ids = tok.convert_tokens_to_ids(["<unk>", "<s>", "</s>", "[INST]", "[/INST]", "[IMG]", "<pad>", "[IMG_BREAK]"])
    assert ids == [0, 1, 2, 3, 4, 10, 11, 12]
    assert tok.convert_tokens_to_ids(["[IMG_END]", "[SYSTEM_PROMPT]", "<SPECIAL_999>"]) == [13, 17, 999]
    assert tok.encode("Hi", add_special_tokens=False)[0] >= 1000  # text starts after the 1000 control tokens


def test_mistral3_image_tokens(mistral3: Path) -> None:
    from transformers import AutoProcessor

    processor = AutoProcessor.from_pretrained(mistral3, local_files_only=True)
    out = processor(text="[INST][IMG]Hi[/INST]", images=[_image(256)], return_tensors="pt")
    ids = out["input_ids"][0].tolist()
    assert ids.count(10) == families()["mistral3"].image_tokens[256]
    assert ids.count(13) == 1 and ids.count(12) == int(ids.count(10) ** 0.5) - 1  # rows end in [IMG_BREAK]/[IMG_END]


# -- GLM-4.1V -----------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def glm4v(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return _build("glm4.1v", tmp_path_factory)


def test_glm4v_ids_and_architecture(glm4v: Path) -> None:
    from transformers import AutoProcessor

    cfg = _config(glm4v)
    assert cfg["architectures"] == ["Glm4vForConditionalGeneration"]
    tok = AutoProcessor.from_pretrained(glm4v, local_files_only=True).tokenizer
    named = ["<|endoftext|>", "[gMASK]", "<sop>", "<|user|>", "<|assistant|>", "<|begin_of_image|>"]
    assert tok.convert_tokens_to_ids(named) == [151329, 151331, 151333, 151336, 151337, 151339]
    assert tok.convert_tokens_to_ids(["<|end_of_image|>", "<|image|>", "<|video|>"]) == [151340, 151343, 151344]
    assert (cfg["image_token_id"], cfg["image_start_token_id"], cfg["image_end_token_id"]) == (151343, 151339, 151340)


def test_glm4v_image_tokens(glm4v: Path) -> None:
    from transformers import AutoProcessor

    processor = AutoProcessor.from_pretrained(glm4v, local_files_only=True)
    text = "<|begin_of_image|><|image|><|end_of_image|>Hi"
    out = processor(text=text, images=[_image(256)], return_tensors="pt")
    assert out["input_ids"][0].tolist().count(151343) == families()["glm4.1v"].image_tokens[256]
