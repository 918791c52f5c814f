"""Gemma 3 (``Gemma3ForConditionalGeneration``): SigLIP tower, pooled to 256 soft tokens per image.

Real structure at tiny sizes: a SigLIP vision tower on 896 px images in 14 px patches (64 x 64
patches, average-pooled 4 x 4 to ``mm_tokens_per_image`` = 256), the RMS-normed linear projector,
and a Gemma 3 text model with one sliding-window and one global layer. SGLang's Gemma 3 processor
keys on ``<start_of_image>`` (255999) and the ``Gemma3Processor`` expands it to
``\\n\\n<start_of_image>`` + 256 x ``<image_soft_token>`` (262144) + ``<end_of_image>`` (256000) ``\\n\\n``,
so the tokenizer carries those, the turn markers and bos/eos/pad on their real ids.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any

from ..random_model import clean_tokenizer_config, random_weights
from . import TINY_TEXT, Family
from ._checkpoint import nest_vision_model
from ._sentencepiece import assert_ids, layout_vocab, train_pieces, write_bos_eos_flags

if TYPE_CHECKING:
    from transformers import Gemma3Config, Gemma3Processor, GemmaTokenizer

BUILDER_VERSION = "gemma3/2"

VOCAB_SIZE = 262208
"""The model's embedding rows (``text_config.vocab_size``); the tokenizer has 262145 entries."""
TOKENIZER_SIZE = 262144
"""Ids below ``<image_soft_token>``: the SentencePiece vocabulary of the published tokenizer."""
BPE_PIECES = 4000
MM_TOKENS_PER_IMAGE = 256
IMAGE_SIZE = 896

SPECIALS: dict[str, int] = {
    "<pad>": 0,
    "<eos>": 1,
    "<bos>": 2,
    "<unk>": 3,
    "<mask>": 4,
    "<start_of_turn>": 105,
    "<end_of_turn>": 106,
    "<start_of_image>": 255999,
    "<end_of_image>": 256000,
    "<image_soft_token>": 262144,
}
"""Gemma 3's special tokens on their published ids (transformers' ``Gemma3Config`` defaults agree)."""
ADDED_SPECIAL = ("<start_of_turn>", "<end_of_turn>", "<start_of_image>", "<end_of_image>", "<image_soft_token>")
"""Never split by the tokenizer (added tokens in the published tokenizer.json)."""
BYTE_START = 107
"""First byte-fallback id: right after the turn markers (the published layout is not reproduced there)."""

# The published gemma-3 chat template: bos, a system prompt folded into the first user turn,
# roles user/model, and an image part rendered as <start_of_image> where it stands.
CHAT_TEMPLATE = (
    "{{ bos_token }}\n"
    "{%- if messages[0]['role'] == 'system' -%}\n"
    "    {%- if messages[0]['content'] is string -%}\n"
    "        {%- set first_user_prefix = messages[0]['content'] + '\n\n' -%}\n"
    "    {%- else -%}\n"
    "        {%- set first_user_prefix = messages[0]['content'][0]['text'] + '\n\n' -%}\n"
    "    {%- endif -%}\n"
    "    {%- set loop_messages = messages[1:] -%}\n"
    "{%- else -%}\n"
    '    {%- set first_user_prefix = "" -%}\n'
    "    {%- set loop_messages = messages -%}\n"
    "{%- endif -%}\n"
    "{%- for message in loop_messages -%}\n"
    "    {%- if (message['role'] == 'user') != (loop.index0 % 2 == 0) -%}\n"
    '        {{ raise_exception("Conversation roles must alternate user/assistant/user/assistant/...") }}\n'
    "    {%- endif -%}\n"
    "    {%- if (message['role'] == 'assistant') -%}\n"
    '        {%- set role = "model" -%}\n'
    "    {%- else -%}\n"
    "        {%- set role = message['role'] -%}\n"
    "    {%- endif -%}\n"
    "    {{ '<start_of_turn>' + role + '\n' + (first_user_prefix if loop.first else \"\") }}\n"
    "    {%- if message['content'] is string -%}\n"
    "        {{ message['content'] | trim }}\n"
    "    {%- elif message['content'] is iterable -%}\n"
    "        {%- for item in message['content'] -%}\n"
    "            {%- if item['type'] == 'image' -%}\n"
    "                {{ '<start_of_image>' }}\n"
    "            {%- elif item['type'] == 'text' -%}\n"
    "                {{ item['text'] | trim }}\n"
    "            {%- endif -%}\n"
    "        {%- endfor -%}\n"
    "    {%- else -%}\n"
    '        {{ raise_exception("Invalid content type") }}\n'
    "    {%- endif -%}\n"
    "    {{ '<end_of_turn>\n' }}\n"
    "{%- endfor -%}\n"
    "{%- if add_generation_prompt -%}\n"
    "    {{'<start_of_turn>model\n'}}\n"
    "{%- endif -%}\n"
)

TEXT: dict[str, Any] = {
    **TINY_TEXT,
    "head_dim": 32,
    "query_pre_attn_scalar": 32,
    "layer_types": ["sliding_attention", "full_attention"],
}
"""Tiny text sizes; one layer of each attention kind (the published models interleave 5 sliding : 1 global)."""
VISION: dict[str, Any] = {
    "hidden_size": 64,
    "intermediate_size": 128,
    "num_hidden_layers": 2,
    "num_attention_heads": 2,
}
"""Tiny SigLIP sizes (published: 1152 wide, 27 layers); image and patch size stay real."""

SLIDING_PER_GLOBAL = 5
"""The published interleave: every 6th layer is global (``sliding_window_pattern`` 6)."""


def _layer_types(n: int) -> list[str]:
    return ["full_attention" if (i + 1) % (SLIDING_PER_GLOBAL + 1) == 0 else "sliding_attention" for i in range(n)]


# Real sizes for GPU timing, random weights: the published gemma-3-4b-it config.json values (text:
# 34 layers of 2560, 8 heads / 4 KV heads of 256, MLP 10240, 5 sliding : 1 global; vision: SigLIP
# 27 layers of 1152, 16 heads, MLP 4304). Everything else (vocab, token ids, RoPE, image geometry,
# tokenizer, processor) is the tiny build's.
SHAPES: dict[str, dict[str, dict[str, Any]]] = {
    "tiny": {"text": TEXT, "vision": VISION},
    "gemma-3-4b": {
        "text": {
            "hidden_size": 2560,
            "intermediate_size": 10240,
            "num_hidden_layers": 34,
            "num_attention_heads": 8,
            "num_key_value_heads": 4,
            "head_dim": 256,
            "query_pre_attn_scalar": 256,
            "layer_types": _layer_types(34),
        },
        "vision": {
            "hidden_size": 1152,
            "intermediate_size": 4304,
            "num_hidden_layers": 27,
            "num_attention_heads": 16,
        },
    },
}


def _build_tokenizer() -> GemmaTokenizer:
    """GemmaTokenizer over a trained BPE laid out on Gemma 3's ids, with its image tokens named."""
    from tokenizers import AddedToken
    from transformers import GemmaTokenizer

    pieces, merges = train_pieces(BPE_PIECES)
    specials = {i: t for t, i in SPECIALS.items() if i < TOKENIZER_SIZE}
    vocab = layout_vocab(TOKENIZER_SIZE, specials, pieces, BYTE_START)
    vocab["<image_soft_token>"] = SPECIALS["<image_soft_token>"]
    tok = GemmaTokenizer(
        vocab=vocab,
        merges=merges,
        add_bos_token=True,
        add_eos_token=False,
        # Gemma3Processor reads these three by name (tokenizer.boi_token, .eoi_token, .image_token).
        extra_special_tokens={
            "boi_token": "<start_of_image>",
            "eoi_token": "<end_of_image>",
            "image_token": "<image_soft_token>",
        },
    )
    tok.add_tokens([AddedToken(t, special=True, normalized=False) for t in ADDED_SPECIAL], special_tokens=True)
    tok.model_max_length = 131072
    tok.chat_template = CHAT_TEMPLATE
    _assert_tokenizer(tok)
    return tok


def _assert_tokenizer(tok: GemmaTokenizer) -> None:
    """Fail the build unless the specials, bos/eos/pad and the image tokens sit on Gemma 3's ids."""
    assert_ids(tok, {t: i for t, i in SPECIALS.items() if t not in ("<pad>", "<eos>", "<bos>", "<unk>", "<mask>")})
    got = (tok.bos_token_id, tok.eos_token_id, tok.pad_token_id, tok.boi_token_id, tok.image_token_id)
    if got != (2, 1, 0, 255999, 262144):
        raise AssertionError(f"bos/eos/pad/boi/image ids are {got}")
    if len(tok) != TOKENIZER_SIZE + 1:
        raise AssertionError(f"tokenizer has {len(tok)} entries, want {TOKENIZER_SIZE + 1}")


def _build_config(shape: str = "tiny") -> Gemma3Config:
    """Gemma 3 config: published token ids, RoPE, norms and image geometry; ``shape``'s widths and depths."""
    from transformers import Gemma3Config

    return Gemma3Config(
        text_config={
            **SHAPES[shape]["text"],
            "vocab_size": VOCAB_SIZE,
            "hidden_activation": "gelu_pytorch_tanh",
            "max_position_embeddings": 131072,
            "rms_norm_eps": 1e-6,
            "sliding_window": 1024,
            "rope_parameters": {
                "full_attention": {"rope_type": "linear", "factor": 8.0, "rope_theta": 1_000_000.0},
                "sliding_attention": {"rope_type": "default", "rope_theta": 10_000.0},
            },
            "pad_token_id": 0,
            "bos_token_id": 2,
            "eos_token_id": 1,
            "dtype": "bfloat16",
        },
        vision_config={
            **SHAPES[shape]["vision"],
            "model_type": "siglip_vision_model",
            "image_size": IMAGE_SIZE,
            "patch_size": 14,
            "num_channels": 3,
            "hidden_act": "gelu_pytorch_tanh",
            "layer_norm_eps": 1e-6,
            "vision_use_head": False,
            "dtype": "bfloat16",
        },
        mm_tokens_per_image=MM_TOKENS_PER_IMAGE,
        boi_token_index=SPECIALS["<start_of_image>"],
        eoi_token_index=SPECIALS["<end_of_image>"],
        image_token_index=SPECIALS["<image_soft_token>"],
        eos_token_id=[SPECIALS["<eos>"], SPECIALS["<end_of_turn>"]],
        tie_word_embeddings=True,
        dtype="bfloat16",
    )


def _build_processor(tokenizer: GemmaTokenizer) -> Gemma3Processor:
    """Gemma3Processor with the published image settings: 896 px squares, mean/std 0.5, no pan-and-scan."""
    from transformers import Gemma3ImageProcessor, Gemma3Processor

    image_processor = Gemma3ImageProcessor(
        size={"height": IMAGE_SIZE, "width": IMAGE_SIZE},
        resample=2,  # bilinear
        do_rescale=True,
        rescale_factor=1 / 255,
        do_normalize=True,
        image_mean=[0.5, 0.5, 0.5],
        image_std=[0.5, 0.5, 0.5],
        do_convert_rgb=True,
        do_pan_and_scan=False,
        pan_and_scan_min_crop_size=256,
        pan_and_scan_max_num_crops=4,
        pan_and_scan_min_ratio_to_activate=1.2,
    )
    return Gemma3Processor(
        image_processor=image_processor,
        tokenizer=tokenizer,
        chat_template=CHAT_TEMPLATE,
        image_seq_length=MM_TOKENS_PER_IMAGE,
    )


def _verify_saved(out_dir: Path) -> None:
    """Reload as SGLang will and check the ids and the rendered, expanded image prompt."""
    from PIL import Image
    from transformers import AutoProcessor

    processor = AutoProcessor.from_pretrained(out_dir, local_files_only=True)
    _assert_tokenizer(processor.tokenizer)
    messages = [{"role": "user", "content": [{"type": "image"}, {"type": "text", "text": "Hi"}]}]
    text = processor.tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
    want = "<bos><start_of_turn>user\n<start_of_image>Hi<end_of_turn>\n<start_of_turn>model\n"
    if text != want:
        raise AssertionError(f"chat template rendered {text!r}, want {want!r}")
    ids = processor(text=text, images=[Image.new("RGB", (256, 256))])["input_ids"][0]
    if ids.count(SPECIALS["<image_soft_token>"]) != MM_TOKENS_PER_IMAGE:
        raise AssertionError(f"image expands to {ids.count(SPECIALS['<image_soft_token>'])} soft tokens")


def build(out_dir: Path, seed: int, shape: str = "tiny", device: str | None = None) -> None:
    """Write the random-weight Gemma 3 checkpoint of ``shape`` (bf16, seed-fixed) into ``out_dir``.

    ``device`` is where the weights are initialised (default: ``cuda`` for a real-size shape when
    there is one; the values differ by device, the shapes do not).
    """
    import torch
    from transformers import Gemma3ForConditionalGeneration, GenerationConfig

    if device is None:
        device = "cuda" if shape != "tiny" and torch.cuda.is_available() else "cpu"
    out_dir = Path(out_dir)
    tokenizer = _build_tokenizer()
    processor = _build_processor(tokenizer)
    model = random_weights(Gemma3ForConditionalGeneration, _build_config(shape), seed, device)
    # Token ids only, no sampling defaults (the published one samples): tests ask for greedy.
    model.generation_config = GenerationConfig(bos_token_id=2, pad_token_id=0, eos_token_id=[1, 106])
    model.save_pretrained(out_dir)
    nest_vision_model(out_dir)  # the published (and SGLang's) vision_tower.vision_model.* names
    processor.save_pretrained(out_dir)
    clean_tokenizer_config(out_dir)
    write_bos_eos_flags(out_dir)
    _verify_saved(out_dir)


FAMILY = Family(
    name="gemma3",
    architecture="Gemma3ForConditionalGeneration",
    builder_version=BUILDER_VERSION,
    build=build,
    modalities=("image",),
    # SGLang turns multimodal off for Gemma3ForConditionalGeneration unless asked
    # (configs/model_config.py, mm_disabled_models): without it an image request gets HTTP 400.
    server_args=("--enable-multimodal",),
    notes=(
        "tokenizer: a 4000-piece BPE trained on stdlib text with fillers; only bos/eos/pad/unk/mask, "
        "the turn markers and the three image tokens sit on their published ids. "
        "Text: 2 layers, one sliding (window 1024) and one global (published: 5 sliding per global). "
        "generation_config carries ids only (published: sampling, top_k 64, top_p 0.95)."
    ),
    image_tokens={256: MM_TOKENS_PER_IMAGE, 512: MM_TOKENS_PER_IMAGE},
    shapes=tuple(SHAPES),
)
