"""Qwen2.5-VL: Qwen2-VL's text model and processors, with a windowed-attention ViT.

What differs from Qwen2-VL is the vision tower: RMSNorm + SwiGLU blocks of ``hidden_size`` /
``intermediate_size`` (not ``embed_dim`` / ``mlp_ratio``), windowed attention over 112 px windows
except in the ``fullatt_block_indexes`` blocks, and ``out_hidden_size`` for the merger's output.
The tiny tower keeps both kinds of block (block 0 windowed, block 1 full), so SGLang's window
index and both attention paths run.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any

from . import Family
from .qwen2_vl import TEXT, text_config, token_ids, vision_common, write_checkpoint

if TYPE_CHECKING:
    from transformers import PretrainedConfig

BUILDER_VERSION: str = "qwen2_5vl/1"
"""Bump when the build output changes, so cached builds are rebuilt."""

# window_size 112 px = 4 merged tokens a side (as published); the published towers put full
# attention in every 8th block (7, 15, 23, 31), here the last of two.
VISION: dict[str, Any] = {
    "depth": 2,
    "hidden_size": 64,
    "intermediate_size": 128,
    "num_heads": 2,
    "hidden_act": "silu",
    "window_size": 112,
    "fullatt_block_indexes": [1],
    "tokens_per_second": 2,
}


# Real sizes for GPU timing, random weights: the published Qwen2.5-VL-3B-Instruct config.json values
# (text: 36 layers of 2048, 16 heads / 2 KV heads, MLP 11008, M-RoPE [16, 24, 24], max_window_layers
# 70; vision: 32 blocks of 1280, 16 heads, MLP 3420, full attention in blocks 7/15/23/31, merger to
# 2048). Everything else (vocab, token ids, RoPE theta, patching, processor) is the tiny build's.
SHAPES: dict[str, dict[str, Any]] = {
    "tiny": {"text": TEXT, "mrope_section": None, "max_window_layers": None, "vision": VISION},
    "qwen2.5-vl-3b": {
        "text": {
            "hidden_size": 2048,
            "intermediate_size": 11008,
            "num_hidden_layers": 36,
            "num_attention_heads": 16,
            "num_key_value_heads": 2,
        },
        "mrope_section": [16, 24, 24],
        "max_window_layers": 70,
        "vision": {
            **VISION,
            "depth": 32,
            "hidden_size": 1280,
            "intermediate_size": 3420,
            "num_heads": 16,
            "fullatt_block_indexes": [7, 15, 23, 31],
        },
    },
}


def build_config(shape: str = "tiny") -> PretrainedConfig:
    """Qwen2.5-VL's structure (windowed ViT, merger to ``out_hidden_size`` = text width) at ``shape``'s sizes."""
    from transformers import Qwen2_5_VLConfig

    sizes = SHAPES[shape]
    text = text_config(128000, sizes["text"], sizes["mrope_section"], sizes["max_window_layers"])
    return Qwen2_5_VLConfig(
        text_config=text,
        vision_config={**sizes["vision"], **vision_common(), "out_hidden_size": text["hidden_size"]},
        tie_word_embeddings=True,  # as Qwen2.5-VL-3B
        dtype="bfloat16",
        **token_ids(),
    )


def _build(out_dir: Path, seed: int, shape: str = "tiny", device: str | None = None) -> None:
    if device is None:
        import torch

        device = "cuda" if shape != "tiny" and torch.cuda.is_available() else "cpu"
    write_checkpoint(
        out_dir, seed, build_config(shape), "Qwen2_5_VLForConditionalGeneration", "Qwen2_5_VLProcessor", device
    )


FAMILY = Family(
    name="qwen2.5-vl",
    architecture="Qwen2_5_VLForConditionalGeneration",
    builder_version=BUILDER_VERSION,
    build=_build,
    modalities=("image", "video"),
    notes="2 vision blocks (block 1 full attention, block 0 windowed); LM head tied (as Qwen2.5-VL-3B); "
    "chat template without the default system prompt",
    image_tokens={256: 81, 512: 324},
    shapes=tuple(SHAPES),
)
