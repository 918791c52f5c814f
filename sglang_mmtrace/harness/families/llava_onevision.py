"""LLaVA-OneVision in the llava-hf format (``LlavaOnevisionForConditionalGeneration``): SigLIP, anyres, Qwen2.

Real structure at tiny sizes, as ``llava-hf/llava-onevision-qwen2-0.5b-ov-hf`` lays it out: a SigLIP
tower on 384 px tiles in 14 px patches (27 x 27 = 729 features per tile, all kept: layer -1,
strategy ``full``), ``anyres_max_9`` tiling over the published 36 grid pinpoints (so the token count
depends on the image size), the two-layer GELU projector with ``image_newline``, and a Qwen2 text
model. The tokenizer is Qwen2's byte-level BPE with ``<|endoftext|>`` 151643, ``<|im_start|>``
151644, ``<|im_end|>`` 151645, ``<image>`` 151646 and ``<video>`` 151647; the chat template puts the
``<image>`` placeholders right after ``<|im_start|>user `` as the published one does.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any

from ..random_model import BPE_VOCAB_SIZE, _clean_tokenizer_config, _train_bpe
from . import Family
from ._checkpoint import nest_vision_model
from ._sentencepiece import assert_ids

if TYPE_CHECKING:
    from transformers import LlavaOnevisionConfig, LlavaOnevisionProcessor, Qwen2Tokenizer

BUILDER_VERSION = "llava-ov/1"

VOCAB_SIZE = 152000
"""The model's embedding rows; the tokenizer has 151648 entries."""
FIRST_SPECIAL_ID = 151643
IMAGE_SIZE = 384
PATCH_SIZE = 14
TILE_TOKENS = (IMAGE_SIZE // PATCH_SIZE) ** 2
"""729 features per 384 px tile."""

ADDED: tuple[str, ...] = ("<|endoftext|>", "<|im_start|>", "<|im_end|>", "<image>", "<video>")
"""The tokenizer's added tokens, in id order from 151643 (all special)."""
TOKEN_IDS: dict[str, int] = {t: FIRST_SPECIAL_ID + i for i, t in enumerate(ADDED)}

# The published llava-onevision-*-ov-hf chat template: "<|im_start|>role " + the image and video
# placeholders + "\n" + each text, "<|im_end|>" after each turn, no newline between turns.
CHAT_TEMPLATE = (
    "{% for message in messages %}"
    "{{'<|im_start|>' + message['role'] + ' '}}"
    "{# Render all images first #}"
    "{% for content in message['content'] | selectattr('type', 'equalto', 'image') %}{{ '<image>' }}{% endfor %}"
    "{# Render all video then #}"
    "{% for content in message['content'] | selectattr('type', 'equalto', 'video') %}{{ '<video>' }}{% endfor %}"
    "{# Render all text next #}"
    "{% if message['role'] != 'assistant' %}"
    "{% for content in message['content'] | selectattr('type', 'equalto', 'text') %}"
    "{{ '\n' + content['text'] }}"
    "{% endfor %}"
    "{% else %}"
    "{% for content in message['content'] | selectattr('type', 'equalto', 'text') %}"
    "{% generation %}{{ '\n' + content['text'] }}{% endgeneration %}"
    "{% endfor %}"
    "{% endif %}"
    "{{'<|im_end|>'}}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}"
)

GRID_PINPOINTS: list[list[int]] = [[h, w] for h in range(384, 2305, 384) for w in range(384, 2305, 384)]
"""The published 36 anyres grid pinpoints: 1x1 to 6x6 tiles of 384 px."""

TEXT: dict[str, Any] = {
    "hidden_size": 128,
    "intermediate_size": 256,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
}
"""Tiny Qwen2 sizes (published 0.5B: 896 wide, 24 layers, 14 heads, 2 KV heads)."""
VISION: dict[str, Any] = {
    "hidden_size": 64,
    "intermediate_size": 128,
    "num_hidden_layers": 2,
    "num_attention_heads": 2,
}
"""Tiny SigLIP so400m sizes (published: 1152 wide, 26 layers); tile and patch size stay real."""


def _build_tokenizer() -> Qwen2Tokenizer:
    """Qwen2Tokenizer over the harness's trained byte-level BPE, fillers up to 151642, then the 5 specials."""
    from tokenizers import AddedToken
    from transformers import Qwen2Tokenizer

    vocab, merges = _train_bpe()
    for i in range(BPE_VOCAB_SIZE, FIRST_SPECIAL_ID):
        vocab[f"<f{i}>"] = i
    # As in random_model: the constructor adds eos/pad first, so start from <|endoftext|> (151643).
    tok = Qwen2Tokenizer(
        vocab=vocab, merges=merges, unk_token=None, bos_token=None, eos_token=ADDED[0], pad_token=ADDED[0]
    )
    tok.add_tokens([AddedToken(t, special=True, normalized=False) for t in ADDED[1:]], special_tokens=True)
    tok.eos_token = "<|im_end|>"
    tok.model_max_length = 32768
    tok.chat_template = CHAT_TEMPLATE
    _assert_tokenizer(tok)
    return tok


def _assert_tokenizer(tok: Qwen2Tokenizer) -> None:
    """Fail the build unless the five specials, eos and pad sit on llava-onevision-hf's ids."""
    assert_ids(tok, TOKEN_IDS)
    if (tok.eos_token_id, tok.pad_token_id, len(tok)) != (151645, 151643, FIRST_SPECIAL_ID + len(ADDED)):
        raise AssertionError(f"eos/pad ids {tok.eos_token_id}/{tok.pad_token_id}, {len(tok)} entries")


def _build_config() -> LlavaOnevisionConfig:
    """llava-onevision-hf config: published token ids, feature layer, anyres_max_9 pinpoints; tiny sizes."""
    from transformers import LlavaOnevisionConfig

    return LlavaOnevisionConfig(
        text_config={
            **TEXT,
            "model_type": "qwen2",
            "vocab_size": VOCAB_SIZE,
            "hidden_act": "silu",
            "max_position_embeddings": 32768,
            "rms_norm_eps": 1e-6,
            "rope_parameters": {"rope_type": "default", "rope_theta": 1_000_000.0},
            "bos_token_id": 151643,
            "eos_token_id": 151645,
            "tie_word_embeddings": True,
            "dtype": "bfloat16",
        },
        vision_config={
            **VISION,
            "model_type": "siglip_vision_model",
            "image_size": IMAGE_SIZE,
            "patch_size": PATCH_SIZE,
            "num_channels": 3,
            "hidden_act": "gelu_pytorch_tanh",
            "layer_norm_eps": 1e-6,
            "vision_use_head": False,
            "dtype": "bfloat16",
        },
        image_token_index=TOKEN_IDS["<image>"],
        video_token_index=TOKEN_IDS["<video>"],
        projector_hidden_act="gelu",
        vision_feature_layer=-1,
        vision_feature_select_strategy="full",
        vision_aspect_ratio="anyres_max_9",
        image_grid_pinpoints=GRID_PINPOINTS,
        multimodal_projector_bias=True,
        tie_word_embeddings=True,
        dtype="bfloat16",
    )


def _build_processor(tokenizer: Qwen2Tokenizer) -> LlavaOnevisionProcessor:
    """LlavaOnevisionProcessor with the published settings: 384 px tiles, anyres pinpoints, mean/std 0.5."""
    from transformers import LlavaOnevisionImageProcessor, LlavaOnevisionProcessor, LlavaOnevisionVideoProcessor

    common: dict[str, Any] = {
        "size": {"height": IMAGE_SIZE, "width": IMAGE_SIZE},
        "resample": 3,  # bicubic
        "do_rescale": True,
        "rescale_factor": 1 / 255,
        "do_normalize": True,
        "image_mean": [0.5, 0.5, 0.5],
        "image_std": [0.5, 0.5, 0.5],
        "do_convert_rgb": True,
    }
    return LlavaOnevisionProcessor(
        image_processor=LlavaOnevisionImageProcessor(**common, do_pad=True, image_grid_pinpoints=GRID_PINPOINTS),
        tokenizer=tokenizer,
        video_processor=LlavaOnevisionVideoProcessor(**common),
        num_image_tokens=TILE_TOKENS,
        vision_feature_select_strategy="full",
        chat_template=CHAT_TEMPLATE,
        image_token="<image>",
        video_token="<video>",
        vision_aspect_ratio="anyres_max_9",
    )


def _verify_saved(out_dir: Path) -> None:
    """Reload as SGLang will and check the ids and the rendered image prompt."""
    from transformers import AutoProcessor

    processor = AutoProcessor.from_pretrained(out_dir, local_files_only=True)
    _assert_tokenizer(processor.tokenizer)
    messages = [{"role": "user", "content": [{"type": "image"}, {"type": "text", "text": "Hi"}]}]
    text = processor.tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
    want = "<|im_start|>user <image>\nHi<|im_end|><|im_start|>assistant\n"
    if text != want:
        raise AssertionError(f"chat template rendered {text!r}, want {want!r}")


def build(out_dir: Path, seed: int) -> None:
    """Write the tiny random-weight LLaVA-OneVision (llava-hf) checkpoint (bf16, seed-fixed) into ``out_dir``."""
    import torch
    from transformers import GenerationConfig, LlavaOnevisionForConditionalGeneration

    out_dir = Path(out_dir)
    tokenizer = _build_tokenizer()
    processor = _build_processor(tokenizer)
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        model = LlavaOnevisionForConditionalGeneration(_build_config()).to(torch.bfloat16).eval()
    model.generation_config = GenerationConfig(bos_token_id=151643, pad_token_id=151643, eos_token_id=151645)
    model.save_pretrained(out_dir)
    nest_vision_model(out_dir)  # the published vision_tower.vision_model.* names
    processor.save_pretrained(out_dir)
    _clean_tokenizer_config(out_dir)
    _verify_saved(out_dir)


FAMILY = Family(
    name="llava-onevision",
    architecture="LlavaOnevisionForConditionalGeneration",
    builder_version=BUILDER_VERSION,
    build=build,
    modalities=("image",),
    # SGLang 0.5.23 has no LlavaOnevisionForConditionalGeneration of its own (its native OneVision
    # is LlavaQwenForCausalLM, the lmms-lab layout); its loader falls back to the Transformers
    # backend anyway (model_loader/utils.py, get_model_architecture). The flag makes that explicit.
    server_args=("--model-impl", "transformers"),
    notes=(
        "served by SGLang's Transformers backend (no native class in SGLang 0.5.23; radix cache off, "
        "so cached_tokens is always 0). Tokenizer: the harness's 4000-entry byte-level BPE with "
        "fillers; only the five added tokens sit on their published ids. Video is not exercised."
    ),
    image_tokens={256: 1485, 512: 3699},
)
