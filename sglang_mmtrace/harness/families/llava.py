"""LLaVA-1.5 in the llava-hf format (``LlavaForConditionalGeneration``): CLIP tower, MLP projector, Llama.

Real structure at tiny sizes, as ``llava-hf/llava-1.5-7b-hf`` lays it out: a CLIP vision tower on
336 px images in 14 px patches (24 x 24 = 576 patch features from the second-to-last layer, CLS
dropped: ``vision_feature_layer`` -2, strategy ``default``), the two-layer GELU projector and a Llama
text model. The tokenizer is Llama's (``<unk>`` 0, ``<s>`` 1, ``</s>`` 2) with ``<image>`` 32000 and
``<pad>`` 32001 added; the model has 32064 embedding rows. The vicuna-style ``USER: <image>\\n...
ASSISTANT:`` chat template puts one ``<image>`` per image before the text, as the published one does.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any

from ..random_model import _clean_tokenizer_config
from . import Family
from ._checkpoint import nest_vision_model
from ._sentencepiece import assert_ids, layout_vocab, train_pieces, write_bos_eos_flags

if TYPE_CHECKING:
    from transformers import LlamaTokenizer, LlavaConfig, LlavaProcessor

BUILDER_VERSION = "llava15/2"

VOCAB_SIZE = 32064
"""The model's embedding rows (padded for tensor parallelism); the tokenizer has 32002 entries."""
SP_SIZE = 32000
"""The SentencePiece vocabulary of Llama-2 (ids below ``<image>``)."""
BPE_PIECES = 4000
IMAGE_SIZE = 336
PATCH_SIZE = 14
IMAGE_SEQ_LENGTH = (IMAGE_SIZE // PATCH_SIZE) ** 2
"""576: one token per patch (the CLS feature is dropped)."""

SPECIALS: dict[str, int] = {"<unk>": 0, "<s>": 1, "</s>": 2, "<image>": 32000, "<pad>": 32001}
"""Llama's bos/eos/unk and llava-hf's two added tokens, on their published ids."""
BYTE_START = 3
"""Llama's byte-fallback pieces ``<0x00>``..``<0xFF>`` sit on ids 3..258, as published."""

CLIP_MEAN = [0.48145466, 0.4578275, 0.40821073]
CLIP_STD = [0.26862954, 0.26130258, 0.27577711]

# The published llava-1.5-*-hf chat template: "USER: " + one "<image>\n" per image + the texts,
# then "ASSISTANT:"; no system role rendered.
CHAT_TEMPLATE = (
    "{% for message in messages %}"
    "{% if message['role'] != 'system' %}{{ message['role'].upper() + ': '}}{% endif %}"
    "{# Render all images first #}"
    "{% for content in message['content'] | selectattr('type', 'equalto', 'image') %}{{ '<image>\n' }}{% endfor %}"
    "{# Render all text next #}"
    "{% if message['role'] != 'assistant' %}"
    "{% for content in message['content'] | selectattr('type', 'equalto', 'text') %}"
    "{{ content['text'] + ' '}}"
    "{% endfor %}"
    "{% else %}"
    "{% for content in message['content'] | selectattr('type', 'equalto', 'text') %}"
    "{% generation %}{{ content['text'] + ' '}}{% endgeneration %}"
    "{% endfor %}"
    "{% endif %}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ 'ASSISTANT:' }}{% endif %}"
)

TEXT: dict[str, Any] = {
    "hidden_size": 128,
    "intermediate_size": 256,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "num_key_value_heads": 4,
    "head_dim": 32,
}
"""Tiny Llama sizes (published 7B: 4096 wide, 32 layers, no grouped-query attention)."""
VISION: dict[str, Any] = {
    "hidden_size": 64,
    "intermediate_size": 128,
    "num_hidden_layers": 2,
    "num_attention_heads": 2,
    "projection_dim": 64,
}
"""Tiny CLIP ViT-L/14-336 sizes (published: 1024 wide, 24 layers); image and patch size stay real."""


def _build_tokenizer() -> LlamaTokenizer:
    """LlamaTokenizer over a trained BPE laid out on Llama-2's ids, with ``<image>``/``<pad>`` added."""
    from tokenizers import AddedToken
    from transformers import LlamaTokenizer

    pieces, merges = train_pieces(BPE_PIECES)
    specials = {i: t for t, i in SPECIALS.items() if i < SP_SIZE}
    vocab = layout_vocab(SP_SIZE, specials, pieces, BYTE_START)
    tok = LlamaTokenizer(vocab=vocab, merges=merges, legacy=False, add_bos_token=True, add_eos_token=False)
    tok.add_tokens([AddedToken("<image>", special=True, normalized=False)], special_tokens=True)
    tok.add_special_tokens({"pad_token": AddedToken("<pad>", special=True, normalized=False)})
    tok.model_max_length = 4096
    tok.padding_side = "left"
    tok.chat_template = CHAT_TEMPLATE
    _assert_tokenizer(tok)
    return tok


def _assert_tokenizer(tok: LlamaTokenizer) -> None:
    """Fail the build unless bos/eos/unk/pad and ``<image>`` sit on llava-hf's ids."""
    assert_ids(tok, {"<image>": 32000, "<pad>": 32001, "<s>": 1, "</s>": 2})
    got = (tok.unk_token_id, tok.bos_token_id, tok.eos_token_id, tok.pad_token_id)
    if got != (0, 1, 2, 32001):
        raise AssertionError(f"unk/bos/eos/pad ids are {got}")
    if len(tok) != SP_SIZE + 2:
        raise AssertionError(f"tokenizer has {len(tok)} entries, want {SP_SIZE + 2}")


def _build_config() -> LlavaConfig:
    """llava-1.5-hf config: published token ids, feature layer/strategy and image geometry; tiny sizes."""
    from transformers import LlavaConfig

    return LlavaConfig(
        text_config={
            **TEXT,
            "model_type": "llama",
            "vocab_size": VOCAB_SIZE,
            "hidden_act": "silu",
            "max_position_embeddings": 4096,
            "rms_norm_eps": 1e-5,
            "rope_parameters": {"rope_type": "default", "rope_theta": 10000.0},
            "bos_token_id": 1,
            "eos_token_id": 2,
            "pad_token_id": 32001,
            "tie_word_embeddings": False,
            "dtype": "bfloat16",
        },
        vision_config={
            **VISION,
            "model_type": "clip_vision_model",
            "image_size": IMAGE_SIZE,
            "patch_size": PATCH_SIZE,
            "num_channels": 3,
            "hidden_act": "quick_gelu",
            "layer_norm_eps": 1e-5,
            "dtype": "bfloat16",
        },
        image_token_index=SPECIALS["<image>"],
        image_seq_length=IMAGE_SEQ_LENGTH,
        projector_hidden_act="gelu",
        vision_feature_layer=-2,
        vision_feature_select_strategy="default",
        multimodal_projector_bias=True,
        pad_token_id=SPECIALS["<pad>"],
        tie_word_embeddings=False,
        dtype="bfloat16",
    )


def _build_processor(tokenizer: LlamaTokenizer) -> LlavaProcessor:
    """LlavaProcessor with llava-1.5-hf's CLIP settings: 336 px shortest edge, centre crop, CLIP mean/std."""
    from transformers import CLIPImageProcessor, LlavaProcessor

    image_processor = CLIPImageProcessor(
        do_resize=True,
        size={"shortest_edge": IMAGE_SIZE},
        resample=3,  # bicubic
        do_center_crop=True,
        crop_size={"height": IMAGE_SIZE, "width": IMAGE_SIZE},
        do_rescale=True,
        rescale_factor=1 / 255,
        do_normalize=True,
        image_mean=CLIP_MEAN,
        image_std=CLIP_STD,
        do_convert_rgb=True,
    )
    return LlavaProcessor(
        image_processor=image_processor,
        tokenizer=tokenizer,
        patch_size=PATCH_SIZE,
        vision_feature_select_strategy="default",
        chat_template=CHAT_TEMPLATE,
        image_token="<image>",
        num_additional_image_tokens=1,
    )


def _verify_saved(out_dir: Path) -> None:
    """Reload as SGLang will and check the ids and the rendered, expanded image prompt."""
    from PIL import Image
    from transformers import AutoProcessor

    processor = AutoProcessor.from_pretrained(out_dir, local_files_only=True)
    _assert_tokenizer(processor.tokenizer)
    messages = [{"role": "user", "content": [{"type": "image"}, {"type": "text", "text": "Hi"}]}]
    text = processor.tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
    want = "USER: <image>\nHi ASSISTANT:"
    if text != want:
        raise AssertionError(f"chat template rendered {text!r}, want {want!r}")
    ids = processor(text=text, images=[Image.new("RGB", (256, 256))])["input_ids"][0]
    if ids.count(SPECIALS["<image>"]) != IMAGE_SEQ_LENGTH:
        raise AssertionError(f"image expands to {ids.count(SPECIALS['<image>'])} tokens")


def build(out_dir: Path, seed: int) -> None:
    """Write the tiny random-weight LLaVA-1.5 (llava-hf) checkpoint (bf16, seed-fixed) into ``out_dir``."""
    import torch
    from transformers import GenerationConfig, LlavaForConditionalGeneration

    out_dir = Path(out_dir)
    tokenizer = _build_tokenizer()
    processor = _build_processor(tokenizer)
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        model = LlavaForConditionalGeneration(_build_config()).to(torch.bfloat16).eval()
    model.generation_config = GenerationConfig(bos_token_id=1, pad_token_id=32001, eos_token_id=2)
    model.save_pretrained(out_dir)
    nest_vision_model(out_dir)  # the published (and SGLang's) vision_tower.vision_model.* names
    processor.save_pretrained(out_dir)
    _clean_tokenizer_config(out_dir)
    write_bos_eos_flags(out_dir)
    _verify_saved(out_dir)


FAMILY = Family(
    name="llava-1.5",
    architecture="LlavaForConditionalGeneration",
    builder_version=BUILDER_VERSION,
    build=build,
    modalities=("image",),
    # --context-length: the harness asks for 32768; SGLang refuses more than the model's 4096
    # positions (configs/model_config.py, _derive_context_length). The later flag wins.
    # --model-impl transformers: SGLang 0.5.23's own LlavaForConditionalGeneration cannot load a
    # llava-hf checkpoint with a CLIP tower on any device. models/llava.py resolves the tower's
    # class through AutoModel to "CLIPVisionModel", which SGLang's registry lacks (models/clip.py
    # registers only CLIPModel), so it falls back to TransformersForCausalLM, which fails at
    # models/transformers.py:635 ('Conv2d' object has no attribute 'num_embeddings'); and its
    # load_weights (models/llava.py:870-880) raises on vision_feature_select_strategy "default",
    # which every llava-1.5-hf config has. The Transformers backend serves it, radix cache off.
    server_args=("--context-length", "4096", "--model-impl", "transformers"),
    notes=(
        "served by SGLang's Transformers backend (--model-impl transformers; radix cache off, so "
        "cached_tokens is always 0): SGLang 0.5.23's native LlavaForConditionalGeneration cannot load "
        "llava-hf CLIP checkpoints. Tokenizer: a 4000-piece BPE trained on stdlib text with fillers; "
        "only unk/bos/eos, the byte pieces, <image> and <pad> sit on their published ids."
    ),
    image_tokens={256: IMAGE_SEQ_LENGTH, 512: IMAGE_SEQ_LENGTH},
)
