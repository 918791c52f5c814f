"""GLM-4.1V (GLM-4.1V-9B-Thinking layout): ``Glm4vForConditionalGeneration``.

A Qwen2-VL-like vision tower (patch 14, temporal patch 2, 2x2 merge, 3D RoPE with learned
position embeddings of a 336 px grid) feeding a GLM-4 text model with M-RoPE on half of each head
(``partial_rotary_factor`` 0.5). SGLang serves it with ``models/glm4v.py`` and preprocesses with its
``glm4v.py`` processor around transformers' ``Glm4vProcessor``, which expands ``<|image|>`` to one
token per 28x28 px (after the smart resize to multiples of 28): a 256 px square is 9x9 = 81 tokens.

The tokenizer is GLM-4's layout: text tokens 0..151328, then the added tokens from 151329
(``<|endoftext|>``, ``[gMASK]`` 151331, ``<sop>`` 151333, ``<|user|>`` 151336, image markers
151339/151340, ``<|image|>`` 151343, ``<|video|>`` 151344).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from ..random_model import random_weights
from . import TINY_TEXT, Family
from ._tokenizer import assert_token_ids, bytelevel_tokenizer, padded_vocab, save_tokenizer

BUILDER_VERSION = "glm4v/1"
FIRST_SPECIAL_ID = 151329
VOCAB_SIZE = 151552  # GLM-4.1V text_config.vocab_size (the embedding rows; the tokenizer is shorter)
PATCH_SIZE, MERGE = 14, 2

# GLM-4's added tokens in id order from 151329, and GLM-4.1V's image/video pads after them.
ADDED_TOKENS: tuple[str, ...] = (
    "<|endoftext|>",
    "[MASK]",
    "[gMASK]",
    "[sMASK]",
    "<sop>",
    "<eop>",
    "<|system|>",
    "<|user|>",
    "<|assistant|>",
    "<|observation|>",
    "<|begin_of_image|>",
    "<|end_of_image|>",
    "<|begin_of_video|>",
    "<|end_of_video|>",
    "<|image|>",
    "<|video|>",
)
TOKEN_IDS: dict[str, int] = {tok: FIRST_SPECIAL_ID + i for i, tok in enumerate(ADDED_TOKENS)}

# GLM-4's split pattern (cl100k-like, digits in runs of up to 3).
GLM4_REGEX = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|"
    r"\s*[\r\n]+|\s+(?!\S)|\s+"
)

TEXT: dict[str, Any] = TINY_TEXT
MROPE_SECTION = [2, 3, 3]  # covers the rotary half of a 32-wide head, as [8, 12, 12] does for 128
VISION: dict[str, Any] = {"depth": 2, "hidden_size": 64, "intermediate_size": 256, "num_heads": 2}

# GLM-4.1V's template shape: [gMASK]<sop>, <|role|>\n turns, an image part as the marked <|image|>.
CHAT_TEMPLATE: str = (
    "[gMASK]<sop>"
    "{%- for message in messages %}"
    "{{- '<|' + message['role'] + '|>\\n' }}"
    "{%- if message['content'] is string %}"
    "{{- message['content'] }}"
    "{%- else %}"
    "{%- for item in message['content'] %}"
    "{%- if item['type'] == 'image' or 'image' in item or 'image_url' in item %}"
    "{{- '<|begin_of_image|><|image|><|end_of_image|>' }}"
    "{%- elif item['type'] == 'video' or 'video' in item %}"
    "{{- '<|begin_of_video|><|video|><|end_of_video|>' }}"
    "{%- elif item['type'] == 'text' %}"
    "{{- item['text'] }}"
    "{%- endif %}"
    "{%- endfor %}"
    "{%- endif %}"
    "{%- endfor %}"
    "{%- if add_generation_prompt %}"
    "{{- '<|assistant|>\\n' }}"
    "{%- endif %}"
)


def _config() -> Any:
    """GLM-4.1V's ``Glm4vConfig`` at tiny widths: attention bias, partial M-RoPE, 336 px vision grid."""
    from transformers import Glm4vConfig

    return Glm4vConfig(
        text_config={
            **TEXT,
            "vocab_size": VOCAB_SIZE,
            "max_position_embeddings": 65536,
            "rms_norm_eps": 1e-5,
            "attention_bias": True,
            "hidden_act": "silu",
            "rope_parameters": {
                "rope_type": "default",
                "rope_theta": 10000.0,
                "mrope_section": MROPE_SECTION,
                "partial_rotary_factor": 0.5,
            },
            "pad_token_id": TOKEN_IDS["<|endoftext|>"],
            "eos_token_id": [TOKEN_IDS["<|endoftext|>"], TOKEN_IDS["<|user|>"], TOKEN_IDS["<|observation|>"]],
            "tie_word_embeddings": False,
        },
        vision_config={
            **VISION,
            "image_size": 336,
            "patch_size": PATCH_SIZE,
            "temporal_patch_size": 2,
            "spatial_merge_size": MERGE,
            "in_channels": 3,
            "out_hidden_size": TEXT["hidden_size"],
            "hidden_act": "silu",
            "attention_bias": False,
            "rms_norm_eps": 1e-5,
        },
        image_token_id=TOKEN_IDS["<|image|>"],
        video_token_id=TOKEN_IDS["<|video|>"],
        image_start_token_id=TOKEN_IDS["<|begin_of_image|>"],
        image_end_token_id=TOKEN_IDS["<|end_of_image|>"],
        video_start_token_id=TOKEN_IDS["<|begin_of_video|>"],
        video_end_token_id=TOKEN_IDS["<|end_of_video|>"],
        tie_word_embeddings=False,
        dtype="bfloat16",
    )


def _tokenizer() -> Any:
    """GLM-4 layout: trained BPE + fillers up to 151328, the added tokens from 151329 on their ids."""
    vocab, merges = padded_vocab(
        FIRST_SPECIAL_ID + len(ADDED_TOKENS), reserved=dict(enumerate(ADDED_TOKENS, FIRST_SPECIAL_ID))
    )
    tok = bytelevel_tokenizer(
        vocab, merges, GLM4_REGEX, ADDED_TOKENS, CHAT_TEMPLATE, eos_token="<|endoftext|>", pad_token="<|endoftext|>"
    )
    tok.model_max_length = 128000
    assert_token_ids(tok, TOKEN_IDS, markers="<|begin_of_image|><|image|><|end_of_image|>")
    return tok


def _processor(tokenizer: Any) -> Any:
    """``Glm4vProcessor`` with GLM-4.1V's image and video settings (CLIP mean/std, 112..~3400 px)."""
    from transformers import Glm4vImageProcessor, Glm4vProcessor, Glm4vVideoProcessor

    common = {"patch_size": PATCH_SIZE, "temporal_patch_size": 2, "merge_size": MERGE}
    return Glm4vProcessor(
        image_processor=Glm4vImageProcessor(size={"shortest_edge": 12544, "longest_edge": 9633792}, **common),
        video_processor=Glm4vVideoProcessor(**common),
        tokenizer=tokenizer,
        chat_template=CHAT_TEMPLATE,
    )


def build(out_dir: Path, seed: int) -> None:
    """Write a tiny random-weight GLM-4.1V (bf16 weights, tokenizer, processor) to ``out_dir``."""
    from transformers import AutoProcessor, GenerationConfig, Glm4vForConditionalGeneration

    out_dir.mkdir(parents=True, exist_ok=True)
    model = random_weights(Glm4vForConditionalGeneration, _config(), seed)
    eos = [TOKEN_IDS["<|endoftext|>"], TOKEN_IDS["<|user|>"], TOKEN_IDS["<|observation|>"]]
    model.generation_config = GenerationConfig(eos_token_id=eos, pad_token_id=TOKEN_IDS["<|endoftext|>"])
    model.save_pretrained(out_dir)
    processor = _processor(_tokenizer())
    processor.save_pretrained(out_dir)
    save_tokenizer(processor.tokenizer, out_dir)
    reloaded = AutoProcessor.from_pretrained(out_dir, local_files_only=True)
    assert_token_ids(reloaded.tokenizer, TOKEN_IDS, markers="<|begin_of_image|><|image|><|end_of_image|>")


FAMILY = Family(
    name="glm4.1v",
    architecture="Glm4vForConditionalGeneration",
    builder_version=BUILDER_VERSION,
    build=build,
    modalities=("image",),
    notes=(
        "GLM-4.1V-9B-Thinking layout. Tokenizer: a fast byte-level BPE behind GLM-4's split regex with "
        "the 16 added tokens 151329..151344 on their ids; GLM-4.1V's later added tokens (think/answer/"
        "box/tool markers) are left out. Chat template: the turn and image-marker shape only (no "
        "thinking or tool handling)."
    ),
    image_tokens={256: 81, 512: 324},
)
