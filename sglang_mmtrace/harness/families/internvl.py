"""InternVL3 (InternVL3-1B/2B layout): SGLang's ``InternVLChatModel`` with a Qwen2 text model.

The published checkpoints are remote-code ones (``model_type`` ``internvl_chat``, ``auto_map`` to
``modeling_internvl_chat.py``); SGLang carries its own ``InternVLChatConfig`` for that type and
registers it with ``AutoConfig``, so no remote code is needed and none is written. With no
remote-code model class to instantiate, the weights are written directly under the names and shapes
of the published ``model.safetensors`` (``vision_model.*`` InternViT, ``mlp1.*`` projector,
``language_model.*`` Qwen2), which SGLang's ``load_weights`` maps onto its own layers.

SGLang does the image preprocessing itself (``multimodal/processors/internvl.py``): ImageNet
mean/std, 448 px tiles from its own ``dynamic_preprocess`` (up to 12 tiles plus a thumbnail), 256
``<IMG_CONTEXT>`` per tile between ``<img>``/``</img>``. Its tiling keeps the largest grid among
equally close aspect ratios (the reference InternVL code only does so when the image is large
enough), so *every* square image becomes 3x3 tiles + thumbnail = 2560 tokens.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from ..random_model import ADDED_TOKENS as QWEN3_ADDED_TOKENS
from ..random_model import FIRST_SPECIAL_ID, chatml_template
from . import TINY_TEXT, Family
from ._tokenizer import assert_token_ids, qwen2_tokenizer, save_tokenizer

BUILDER_VERSION = "internvl3/1"

# Qwen2.5's 22 added tokens (Qwen3's list without its 4 tool_response/think tokens), then InternVL's 9.
ADDED_TOKENS: tuple[tuple[str, bool], ...] = (
    *QWEN3_ADDED_TOKENS[:22],
    ("<img>", True),
    ("</img>", True),
    ("<IMG_CONTEXT>", True),
    ("<quad>", True),
    ("</quad>", True),
    ("<ref>", True),
    ("</ref>", True),
    ("<box>", True),
    ("</box>", True),
)
TOKEN_IDS: dict[str, int] = {tok: FIRST_SPECIAL_ID + i for i, (tok, _) in enumerate(ADDED_TOKENS)}
VOCAB_SIZE = 151674  # InternVL3-1B/2B llm_config.vocab_size: exactly the tokenizer's length
IMAGE_SIZE, PATCH_SIZE, DOWNSAMPLE = 448, 14, 0.5
TOKENS_PER_TILE = int((IMAGE_SIZE // PATCH_SIZE) ** 2 * DOWNSAMPLE**2)  # 256

TEXT: dict[str, Any] = TINY_TEXT
VISION: dict[str, Any] = {"hidden_size": 64, "intermediate_size": 128, "num_hidden_layers": 2, "num_attention_heads": 2}

# ChatML with InternVL's "<image>\n" for an image part: what HF-side users render. The SGLang server
# does not use it: it picks its built-in "internvl-2-5" conversation template by model_type.
CHAT_TEMPLATE: str = chatml_template("<image>\\n")


def _llm_config() -> dict[str, Any]:
    """``llm_config`` as InternVL3 ships it: a full Qwen2 config with its architecture named."""
    from transformers import Qwen2Config

    cfg = Qwen2Config(
        **TEXT,
        vocab_size=VOCAB_SIZE,
        max_position_embeddings=32768,
        rms_norm_eps=1e-6,
        rope_parameters={"rope_type": "default", "rope_theta": 1_000_000.0},
        tie_word_embeddings=False,
        bos_token_id=TOKEN_IDS["<|endoftext|>"],
        eos_token_id=TOKEN_IDS["<|im_end|>"],
        dtype="bfloat16",
    )
    return {**cfg.to_dict(), "architectures": ["Qwen2ForCausalLM"]}


def _config() -> dict[str, Any]:
    """The top-level ``internvl_chat`` config (InternVL3-1B's keys and values, tiny widths).

    ``transformers_version`` is written as ``save_pretrained`` would: without it transformers 5
    suspects a pre-5 Mistral tokenizer beside the config and warns about its regex.
    """
    import transformers

    vision = {
        **VISION,
        "architectures": ["InternVisionModel"],
        "model_type": "intern_vit_6b",
        "image_size": IMAGE_SIZE,
        "patch_size": PATCH_SIZE,
        "num_channels": 3,
        "hidden_act": "gelu",
        "norm_type": "layer_norm",
        "layer_norm_eps": 1e-6,
        "qkv_bias": True,
        "qk_normalization": False,
        "use_flash_attn": True,
        "dropout": 0.0,
        "attention_dropout": 0.0,
        "drop_path_rate": 0.0,
        "initializer_factor": 1.0,
        "initializer_range": 0.02,
        "torch_dtype": "bfloat16",
    }
    return {
        "architectures": ["InternVLChatModel"],
        "model_type": "internvl_chat",
        "vision_config": vision,
        "llm_config": _llm_config(),
        "downsample_ratio": DOWNSAMPLE,
        "dynamic_image_size": True,
        "force_image_size": IMAGE_SIZE,
        "max_dynamic_patch": 12,
        "min_dynamic_patch": 1,
        "pad2square": False,
        "ps_version": "v2",
        "select_layer": -1,
        "template": "internvl2_5",
        "use_backbone_lora": 0,
        "use_llm_lora": 0,
        "use_thumbnail": True,
        "hidden_size": TEXT["hidden_size"],
        "tie_word_embeddings": False,
        "torch_dtype": "bfloat16",
        "transformers_version": transformers.__version__,
    }


def _vision_shapes() -> dict[str, tuple[int, ...]]:
    """Every InternViT + ``mlp1`` tensor of the published checkpoint, by name, at the tiny widths."""
    d, i = VISION["hidden_size"], VISION["intermediate_size"]
    positions = (IMAGE_SIZE // PATCH_SIZE) ** 2 + 1
    shapes: dict[str, tuple[int, ...]] = {
        "vision_model.embeddings.class_embedding": (1, 1, d),
        "vision_model.embeddings.patch_embedding.weight": (d, 3, PATCH_SIZE, PATCH_SIZE),
        "vision_model.embeddings.patch_embedding.bias": (d,),
        "vision_model.embeddings.position_embedding": (1, positions, d),
    }
    for n in range(VISION["num_hidden_layers"]):
        p = f"vision_model.encoder.layers.{n}."
        for name, shape in {
            "ls1": (d,),
            "ls2": (d,),
            "norm1.weight": (d,),
            "norm1.bias": (d,),
            "norm2.weight": (d,),
            "norm2.bias": (d,),
            "attn.qkv.weight": (3 * d, d),
            "attn.qkv.bias": (3 * d,),
            "attn.proj.weight": (d, d),
            "attn.proj.bias": (d,),
            "mlp.fc1.weight": (i, d),
            "mlp.fc1.bias": (i,),
            "mlp.fc2.weight": (d, i),
            "mlp.fc2.bias": (d,),
        }.items():
            shapes[p + name] = shape
    merged, h = d * int(1 / DOWNSAMPLE) ** 2, TEXT["hidden_size"]
    shapes.update(
        {
            "mlp1.0.weight": (merged,),
            "mlp1.0.bias": (merged,),
            "mlp1.1.weight": (h, merged),
            "mlp1.1.bias": (h,),
            "mlp1.3.weight": (h, h),
            "mlp1.3.bias": (h,),
        }
    )
    return shapes


def _init(name: str, shape: tuple[int, ...]) -> Any:
    """Norm weights and layer scales 1, biases 0, the rest N(0, 0.02): a well-scaled random ViT."""
    import torch

    if name.endswith(("ls1", "ls2")) or (name.endswith(".weight") and len(shape) == 1):
        return torch.ones(shape, dtype=torch.bfloat16)
    if name.endswith(".bias"):
        return torch.zeros(shape, dtype=torch.bfloat16)
    return (torch.randn(shape) * 0.02).to(torch.bfloat16)


def _weights(config: dict[str, Any], seed: int) -> dict[str, Any]:
    """All tensors, seed-fixed: the Qwen2 text model via transformers, the rest by name."""
    import torch
    from transformers import Qwen2Config, Qwen2ForCausalLM

    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        llm = Qwen2ForCausalLM(Qwen2Config(**config["llm_config"])).to(torch.bfloat16)
        tensors = {f"language_model.{k}": v.contiguous() for k, v in llm.state_dict().items()}
        tensors.update({name: _init(name, shape) for name, shape in _vision_shapes().items()})
    return tensors


def _tokenizer() -> Any:
    """Qwen2.5 tokenizer layout plus InternVL's tokens: ``<IMG_CONTEXT>`` on 151667 as in InternVL3."""
    tok = qwen2_tokenizer(
        ADDED_TOKENS, FIRST_SPECIAL_ID, eos="<|im_end|>", pad="<|endoftext|>", chat_template=CHAT_TEMPLATE
    )
    tok.model_max_length = 32768
    assert_token_ids(tok, TOKEN_IDS, markers="<img><IMG_CONTEXT></img>")
    if len(tok) != VOCAB_SIZE:
        raise AssertionError(f"tokenizer has {len(tok)} entries, want {VOCAB_SIZE}")
    return tok


def build(out_dir: Path, seed: int) -> None:
    """Write config, bf16 weights, tokenizer and generation config of a tiny InternVL3 to ``out_dir``."""
    from safetensors.torch import save_file
    from transformers import AutoTokenizer

    out_dir.mkdir(parents=True, exist_ok=True)
    config = _config()
    (out_dir / "config.json").write_text(json.dumps(config, indent=2) + "\n", encoding="utf-8")
    save_file(_weights(config, seed), str(out_dir / "model.safetensors"), metadata={"format": "pt"})
    eos = [TOKEN_IDS["<|im_end|>"], TOKEN_IDS["<|endoftext|>"]]
    gen = {"eos_token_id": eos, "pad_token_id": TOKEN_IDS["<|endoftext|>"]}
    (out_dir / "generation_config.json").write_text(json.dumps(gen, indent=2) + "\n", encoding="utf-8")
    save_tokenizer(_tokenizer(), out_dir)
    assert_token_ids(AutoTokenizer.from_pretrained(out_dir, local_files_only=True), TOKEN_IDS)


FAMILY = Family(
    name="internvl3",
    architecture="InternVLChatModel",
    builder_version=BUILDER_VERSION,
    build=build,
    modalities=("image",),
    notes=(
        "InternVL3-1B/2B layout (Qwen2 LLM, InternViT, 448 px tiles, pixel-shuffle 0.5). No auto_map or "
        "remote-code files (SGLang has its own InternVLChatConfig). No preprocessor_config.json: "
        "SGLang preprocesses InternVL images itself. The tokenizer's chat template is plain ChatML "
        "with '<image>\\n'; the server ignores it for its built-in 'internvl-2-5' template. "
        "drop_path_rate 0."
    ),
    image_tokens={256: 10 * TOKENS_PER_TILE, 512: 10 * TOKENS_PER_TILE},
)
