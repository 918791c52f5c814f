"""LLaVA-1.5 in the llava-hf layout (llava-hf/llava-1.5-7b-hf): ``LlavaForConditionalGeneration``,
served by SGLang's transformers backend (``--model-impl transformers``).

The transformers-format conversion of LLaVA-1.5: a nested ``LlavaConfig`` (Llama ``text_config``
with 32064 rows, CLIP ViT-L/14-336 ``vision_config``, ``image_token_index`` 32000, penultimate layer,
CLS dropped), weights under the published names (``language_model.model.*``,
``language_model.lm_head``, ``vision_tower.vision_model.*``, ``multi_modal_projector.linear_{1,2}``),
llava-hf's tokenizer (``<image>`` 32000, ``<pad>`` 32001), ``LlavaProcessor`` and chat template. The
tokenizer, CLIP tower and image processor are the original layout's (``llava``).

Served by the transformers backend, SGLang wraps the transformers model in
``TransformersMultiModalForCausalLM`` and preprocesses with ``TransformersAutoMultimodalProcessor``,
which runs the ``LlavaProcessor`` on the rendered prompt: each ``<image>`` becomes 576 ``<image>``
tokens (24 x 24 patches of 14 px). With a multimodal model the transformers backend turns SGLang's
radix cache and chunked prefill off (``mem_cache/kv_cache_builder.py``, ``managers/scheduler.py``), so
a repeated image is computed again, never served from the prefix cache.

With SGLang's own classes (``models/llava.py``'s ``LlavaForConditionalGeneration``, the default
``--model-impl``) this layout does not start: ``_get_sgl_model_cls`` resolves the CLIP vision config
(AutoModel -> ``CLIPVisionModel``) to SGLang's transformers fallback for causal LMs, whose init reads
``get_input_embeddings().num_embeddings`` and finds CLIP's patch ``Conv2d``:
``AttributeError: 'Conv2d' object has no attribute 'num_embeddings'`` (SGLang 0.5.23).

llava-hf's chat template walks ``message['content']`` as a list of parts; SGLang leaves a plain-string
content as it is, so a text-only message with string content renders as ``USER: ASSISTANT:`` (its
text dropped), as it does with the published checkpoint.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from ..random_model import clean_tokenizer_config, random_weights
from . import Family
from ._checkpoint import INDEX_NAME, nest_vision_model
from ._sentencepiece import write_bos_eos_flags
from .llava import (
    ADDED,
    IMAGE_TOKEN_ID,
    IMAGE_TOKENS,
    SELECT_LAYER,
    SPECIALS,
    TEXT,
    build_processor,
    build_tokenizer,
    verify_processor,
    vision_config,
)

BUILDER_VERSION = "llava15hf/1"

VOCAB_SIZE = 32064
"""llava-hf's ``text_config.vocab_size``: Llama's 32000 + the added tokens, padded to a multiple of 64."""

RENAMES: tuple[tuple[str, str], ...] = (
    ("model.language_model.", "language_model.model."),
    ("lm_head.", "language_model.lm_head."),
    ("model.vision_tower.", "vision_tower."),
    ("model.multi_modal_projector.", "multi_modal_projector."),
)
"""transformers 5's in-memory names -> the published checkpoint's, where a save writes the former."""
PUBLISHED: tuple[str, ...] = ("language_model.", "vision_tower.", "multi_modal_projector.")
"""The published checkpoint's top-level prefixes (transformers 5.19 saves LLaVA under them, the tower flat)."""


def _config() -> Any:
    """llava-hf/llava-1.5-7b-hf's ``LlavaConfig`` at tiny sizes."""
    from transformers import LlavaConfig

    return LlavaConfig(
        text_config={
            **TEXT,
            "model_type": "llama",
            "vocab_size": VOCAB_SIZE,
            "max_position_embeddings": 4096,
            "rms_norm_eps": 1e-5,
            "hidden_act": "silu",
            "tie_word_embeddings": False,
            "bos_token_id": SPECIALS["<s>"],
            "eos_token_id": SPECIALS["</s>"],
            "pad_token_id": ADDED["<pad>"],
            "dtype": "float16",
        },
        vision_config=vision_config().to_dict(),
        image_token_index=IMAGE_TOKEN_ID,
        projector_hidden_act="gelu",
        vision_feature_layer=SELECT_LAYER,
        vision_feature_select_strategy="default",
        image_seq_length=IMAGE_TOKENS,
        pad_token_id=ADDED["<pad>"],
        tie_word_embeddings=False,
        dtype="float16",
    )


def _published_names(out_dir: Path) -> None:
    """Rename the saved weights to llava-hf's names (``vision_tower.vision_model.*`` included)."""
    from safetensors import safe_open
    from safetensors.torch import save_file

    if (out_dir / INDEX_NAME).exists():
        raise RuntimeError("a tiny build is one model.safetensors")
    path = out_dir / "model.safetensors"

    def rename(key: str) -> str:
        if key.startswith(PUBLISHED):
            return key
        for old, new in RENAMES:
            if key.startswith(old):
                return new + key[len(old) :]
        raise AssertionError(f"unexpected weight {key}")

    with safe_open(path, "pt") as f:
        metadata = f.metadata()
        keys = list(f.keys())
        tensors = {rename(k): f.get_tensor(k) for k in keys}
    save_file(tensors, str(path), metadata)
    nest_vision_model(out_dir)


def build(out_dir: Path, seed: int) -> None:
    """Write the tiny llava-hf LLaVA-1.5 (fp16, seed-fixed) into ``out_dir``, reloaded once as a check."""
    import torch
    from transformers import GenerationConfig, LlavaForConditionalGeneration

    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    model = random_weights(LlavaForConditionalGeneration, _config(), seed).to(torch.float16)
    model.generation_config = GenerationConfig(bos_token_id=1, eos_token_id=2, pad_token_id=ADDED["<pad>"])
    model.save_pretrained(out_dir)
    _published_names(out_dir)
    processor = build_processor(build_tokenizer())
    processor.save_pretrained(out_dir)
    clean_tokenizer_config(out_dir)
    write_bos_eos_flags(out_dir)
    verify_processor(out_dir, "USER: <image>\nHi ASSISTANT:")
    # The published names load back into the transformers model, every weight found.
    reloaded, info = LlavaForConditionalGeneration.from_pretrained(
        out_dir, local_files_only=True, output_loading_info=True
    )
    missing = [k for k in info.get("missing_keys", ()) if k]
    unexpected = [k for k in info.get("unexpected_keys", ()) if k]
    if missing or unexpected:
        raise AssertionError(f"reload: missing {missing[:5]}, unexpected {unexpected[:5]}")
    cfg = json.loads((out_dir / "config.json").read_text(encoding="utf-8"))
    if cfg["architectures"] != ["LlavaForConditionalGeneration"]:
        raise AssertionError(cfg["architectures"])


FAMILY = Family(
    name="llava-hf-transformers",
    architecture="LlavaForConditionalGeneration",
    builder_version=BUILDER_VERSION,
    build=build,
    modalities=("image",),
    # SGLang's own LlavaForConditionalGeneration fails to load this layout ('Conv2d' object has no
    # attribute 'num_embeddings'); the transformers backend serves it. 4096: the model's positions.
    server_args=("--model-impl", "transformers", "--context-length", "4096"),
    model_impl="transformers",
    notes=(
        "llava-hf layout, served with --model-impl transformers (SGLang's own LlavaForConditionalGeneration "
        "does not start on it: 'Conv2d' object has no attribute 'num_embeddings'); that backend turns the "
        "radix cache off for VLMs, so nothing is ever a prefix hit. The published chat template drops a "
        "string-content (text-only) message's text in SGLang (USER: ASSISTANT:). "
        "Tokenizer: a 4000-piece BPE on stdlib text with fillers; only unk/bos/eos, <image> 32000 and "
        "<pad> 32001 sit on their published ids. Text: multi-head (KV heads = heads) as Vicuna-7B. "
        "The backend's processor loads and processes images in its own calls (_load_images, "
        "_apply_hf_processor, _build_mm_items) and the HF model encodes in its own forward "
        "(get_image_features): the plugin hooks those, the transformers backend's generic seams."
    ),
    image_tokens={256: IMAGE_TOKENS, 512: IMAGE_TOKENS},
)
