"""Mistral 3 (Mistral-Small-3.1-24B-Instruct-2503 layout): ``Mistral3ForConditionalGeneration``.

A Pixtral vision tower (patch 14, 2D RoPE, up to 1540 px) and a Mistral text model joined by a
projector with a 2x2 patch merger, in the transformers (HF) format, which SGLang serves with its
``models/mistral.py`` and preprocesses with its ``pixtral.py`` processor around transformers'
``PixtralProcessor``. The tokenizer follows Tekken's layout: the 1000 control tokens on ids 0..999
(``[IMG]`` 10, ``[IMG_BREAK]`` 12, ``[IMG_END]`` 13), text from 1000, 131072 entries in all.

An image becomes one ``[IMG]`` per 28x28 px (patch 14, merged 2x2), its rows ended by
``[IMG_BREAK]`` and the last by ``[IMG_END]``: a 256 px square is 10x10 = 100 ``[IMG]`` (110 tokens).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from ..random_model import random_weights
from . import TINY_TEXT, Family
from ._tokenizer import assert_token_ids, bytelevel_tokenizer, padded_vocab, save_tokenizer

BUILDER_VERSION = "mistral3/1"
VOCAB_SIZE = 131072
NUM_CONTROL_TOKENS = 1000  # Tekken's control-token block; text tokens start after it
PATCH_SIZE, MERGE = 14, 2
CONTROL_TOKENS: tuple[str, ...] = (
    "<unk>",
    "<s>",
    "</s>",
    "[INST]",
    "[/INST]",
    "[AVAILABLE_TOOLS]",
    "[/AVAILABLE_TOOLS]",
    "[TOOL_RESULTS]",
    "[/TOOL_RESULTS]",
    "[TOOL_CALLS]",
    "[IMG]",
    "<pad>",
    "[IMG_BREAK]",
    "[IMG_END]",
    "[PREFIX]",
    "[MIDDLE]",
    "[SUFFIX]",
    "[SYSTEM_PROMPT]",
    "[/SYSTEM_PROMPT]",
    "[TOOL_CONTENT]",
)
SPECIALS: tuple[str, ...] = (
    *CONTROL_TOKENS,
    *(f"<SPECIAL_{i}>" for i in range(len(CONTROL_TOKENS), NUM_CONTROL_TOKENS)),
)
TOKEN_IDS: dict[str, int] = {tok: i for i, tok in enumerate(CONTROL_TOKENS)}

# Tekken's split pattern (the corrected one transformers applies with fix_mistral_regex=True).
TEKKEN_REGEX = (
    r"[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]*[\p{Ll}\p{Lm}\p{Lo}\p{M}]+|"
    r"[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]+[\p{Ll}\p{Lm}\p{Lo}\p{M}]*|"
    r"\p{N}| ?[^\s\p{L}\p{N}]+[\r\n/]*|\s*[\r\n]+|\s+(?!\S)|\s+"
)

TEXT: dict[str, Any] = {**TINY_TEXT, "head_dim": 32}
VISION: dict[str, Any] = {
    "hidden_size": 64,
    "intermediate_size": 128,
    "num_hidden_layers": 2,
    "num_attention_heads": 2,
    "head_dim": 32,
}

# Mistral Small 3.1's template, without its default system prompt (a dated "You are Mistral Small
# 3.1..." paragraph): [SYSTEM_PROMPT]..[/SYSTEM_PROMPT], [INST]..[/INST], an image part as [IMG].
CHAT_TEMPLATE: str = (
    "{{- bos_token }}"
    "{%- for message in messages %}"
    "{%- if message['role'] == 'system' %}"
    "{{- '[SYSTEM_PROMPT]' + message['content'] + '[/SYSTEM_PROMPT]' }}"
    "{%- elif message['role'] == 'user' %}"
    "{{- '[INST]' }}"
    "{%- if message['content'] is string %}"
    "{{- message['content'] }}"
    "{%- else %}"
    "{%- for block in message['content'] %}"
    "{%- if block['type'] == 'text' %}"
    "{{- block['text'] }}"
    "{%- elif block['type'] in ['image', 'image_url'] %}"
    "{{- '[IMG]' }}"
    "{%- endif %}"
    "{%- endfor %}"
    "{%- endif %}"
    "{{- '[/INST]' }}"
    "{%- elif message['role'] == 'assistant' %}"
    "{{- message['content'] + eos_token }}"
    "{%- endif %}"
    "{%- endfor %}"
)


def _config() -> Any:
    """Mistral-Small-3.1's ``Mistral3Config`` at tiny widths (vision 1540 px, RoPE thetas, no bias)."""
    from transformers import Mistral3Config

    return Mistral3Config(
        text_config={
            **TEXT,
            "model_type": "mistral",
            "vocab_size": VOCAB_SIZE,
            "max_position_embeddings": 131072,
            "rms_norm_eps": 1e-5,
            "rope_parameters": {"rope_type": "default", "rope_theta": 1_000_000_000.0},
            "sliding_window": None,
            "hidden_act": "silu",
            "tie_word_embeddings": False,
        },
        vision_config={
            **VISION,
            "model_type": "pixtral",
            "image_size": 1540,
            "patch_size": PATCH_SIZE,
            "num_channels": 3,
            "hidden_act": "silu",
            "rope_parameters": {"rope_type": "default", "rope_theta": 10000.0},
        },
        image_token_index=TOKEN_IDS["[IMG]"],
        spatial_merge_size=MERGE,
        projector_hidden_act="gelu",
        multimodal_projector_bias=False,
        vision_feature_layer=-1,
        tie_word_embeddings=False,
        dtype="bfloat16",
    )


def _tokenizer() -> Any:
    """Tekken layout: control tokens 0..999 (special), trained BPE from 1000, fillers to 131071."""
    vocab, merges = padded_vocab(VOCAB_SIZE, bpe_offset=NUM_CONTROL_TOKENS, reserved=dict(enumerate(SPECIALS)))
    tok = bytelevel_tokenizer(
        vocab,
        merges,
        TEKKEN_REGEX,
        SPECIALS,
        CHAT_TEMPLATE,
        bos_token="<s>",
        eos_token="</s>",
        unk_token="<unk>",
        pad_token="<pad>",
    )
    tok.model_max_length = 131072
    assert_token_ids(tok, TOKEN_IDS, markers="[IMG][IMG_BREAK][IMG_END]")
    return tok


def _processor(tokenizer: Any) -> Any:
    """``PixtralProcessor`` with Mistral-Small-3.1's image settings (CLIP mean/std, 1540 px, patch 14, merge 2)."""
    from transformers import PixtralImageProcessor, PixtralProcessor

    image_processor = PixtralImageProcessor(
        size={"longest_edge": 1540},
        patch_size={"height": PATCH_SIZE, "width": PATCH_SIZE},
        image_mean=[0.48145466, 0.4578275, 0.40821073],
        image_std=[0.26862954, 0.26130258, 0.27577711],
    )
    return PixtralProcessor(
        image_processor=image_processor,
        tokenizer=tokenizer,
        patch_size=PATCH_SIZE,
        spatial_merge_size=MERGE,
        chat_template=CHAT_TEMPLATE,
    )


def build(out_dir: Path, seed: int) -> None:
    """Write a tiny random-weight Mistral 3 (bf16 weights, tokenizer, processor) to ``out_dir``."""
    from transformers import AutoProcessor, GenerationConfig, Mistral3ForConditionalGeneration

    out_dir.mkdir(parents=True, exist_ok=True)
    model = random_weights(Mistral3ForConditionalGeneration, _config(), seed)
    model.generation_config = GenerationConfig(bos_token_id=1, eos_token_id=2, pad_token_id=11)
    model.save_pretrained(out_dir)
    processor = _processor(_tokenizer())
    processor.save_pretrained(out_dir)
    save_tokenizer(processor.tokenizer, out_dir)
    reloaded = AutoProcessor.from_pretrained(out_dir, local_files_only=True)
    assert_token_ids(reloaded.tokenizer, TOKEN_IDS, markers="[IMG][IMG_BREAK][IMG_END]")


def _image_tokens(side: int) -> int:
    """``[IMG]`` tokens of a square ``side`` px image (up to 1540 px): one per 28x28 px, rounded up."""
    per_row = -(-side // (PATCH_SIZE * MERGE))
    return per_row * per_row


FAMILY = Family(
    name="mistral3",
    architecture="Mistral3ForConditionalGeneration",
    vision_type="pixtral",  # SGLang picks its processor by the vision tower (LlavaMultimodalProcessor)
    builder_version=BUILDER_VERSION,
    build=build,
    modalities=("image",),
    notes=(
        "Mistral-Small-3.1 layout in the transformers format only (no params.json/tekken.json/"
        "consolidated.safetensors). Tokenizer: a fast byte-level BPE behind Tekken's split regex with "
        "the 1000 control tokens on their ids, not the Tekken file; it adds no BOS itself (the chat "
        "template writes <s>). Chat template without the default dated system prompt."
    ),
    image_tokens={256: _image_tokens(256), 512: _image_tokens(512)},
)
