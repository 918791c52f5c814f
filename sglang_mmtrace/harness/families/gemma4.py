"""Gemma 4 (``Gemma4ForConditionalGeneration``, the E2B layout): vision and audio towers feeding Gemma 4.

Real structure at tiny sizes: the Gemma 4 vision encoder on 16 px patches with 2D positions, pooled
3 x 3 into soft tokens (at most 280 per image: a 256 px square is resized to 768 px, 48 x 48 patches,
256 tokens), the conformer audio encoder on 128-bin log-mel frames (16 kHz, 20 ms frames, 10 ms hop)
subsampled 4x by two stride-2 convolutions (a 1 s clip: 25 tokens), each projected to the text width
by an RMS-normed linear embedder, and a Gemma 4 text model with per-layer input embeddings (PLE),
one sliding-window and one global layer (the global one with the wider ``global_head_dim`` and
proportional RoPE on a quarter of it), single-KV-head attention, double-wide MLPs and final logit
soft-capping. SGLang serves it with ``models/gemma4_mm.py`` and preprocesses with its ``gemma4.py``
processor around transformers' ``Gemma4Processor``, which expands ``<|image|>`` to
``<|image>`` + N x ``<|image|>`` + ``<image|>`` and ``<|audio|>`` to ``<|audio>`` + N x ``<|audio|>`` + ``<audio|>``.

The tokenizer carries Gemma 4's special tokens on their published ids (bos/eos/pad, the turn markers
``<|turn>`` 105 / ``<turn|>`` 106, the image, audio and video markers 255999, 256000, 258880..258884).
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any

from ..random_model import clean_tokenizer_config, random_weights
from . import TINY_TEXT, Family
from ._sentencepiece import assert_ids, layout_vocab, train_pieces, write_bos_eos_flags

if TYPE_CHECKING:
    from transformers import Gemma4Config, Gemma4Processor, GemmaTokenizer

BUILDER_VERSION = "gemma4/1"

VOCAB_SIZE = 262144
"""The model's embedding rows and the tokenizer's entries (``text_config.vocab_size``)."""
BPE_PIECES = 4000
MAX_SOFT_TOKENS = 280
"""Soft tokens per image at most (the published image processor's ``max_soft_tokens``)."""
SAMPLE_RATE = 16_000

SPECIALS: dict[str, int] = {
    "<pad>": 0,
    "<eos>": 1,
    "<bos>": 2,
    "<unk>": 3,
    "<mask>": 4,
    "<|turn>": 105,
    "<turn|>": 106,
    "<|image>": 255999,
    "<|audio>": 256000,
    "<|image|>": 258880,
    "<|audio|>": 258881,
    "<image|>": 258882,
    "<audio|>": 258883,
    "<|video|>": 258884,
}
"""Gemma 4's special tokens on their published ids (transformers' ``Gemma4Config`` defaults agree)."""
ADDED_SPECIAL = (
    "<|turn>",
    "<turn|>",
    "<|image>",
    "<|audio>",
    "<|image|>",
    "<|audio|>",
    "<image|>",
    "<audio|>",
    "<|video|>",
)
"""Never split by the tokenizer (added tokens in the published tokenizer.json)."""
BYTE_START = 107
"""First byte-fallback id: right after the turn markers (the published layout is not reproduced there)."""

# Gemma 4's turn shape: bos, <|turn>role ... <turn|> turns (roles system/user/model), an image part as
# <|image|>, an audio part as <|audio|> and a video part as <|video|> where they stand (the processor
# expands each between its begin/end markers).
CHAT_TEMPLATE = (
    "{{ bos_token }}\n"
    "{%- if messages[0]['role'] == 'system' -%}\n"
    "    {%- if messages[0]['content'] is string -%}\n"
    "        {{ '<|turn>system\n' + messages[0]['content'] | trim + '<turn|>\n' }}\n"
    "    {%- else -%}\n"
    "        {{ '<|turn>system\n' + messages[0]['content'][0]['text'] | trim + '<turn|>\n' }}\n"
    "    {%- endif -%}\n"
    "    {%- set loop_messages = messages[1:] -%}\n"
    "{%- else -%}\n"
    "    {%- set loop_messages = messages -%}\n"
    "{%- endif -%}\n"
    "{%- for message in loop_messages -%}\n"
    "    {%- if (message['role'] == 'assistant') -%}\n"
    '        {%- set role = "model" -%}\n'
    "    {%- else -%}\n"
    "        {%- set role = message['role'] -%}\n"
    "    {%- endif -%}\n"
    "    {{ '<|turn>' + role + '\n' }}\n"
    "    {%- if message['content'] is string -%}\n"
    "        {{ message['content'] | trim }}\n"
    "    {%- elif message['content'] is iterable -%}\n"
    "        {%- for item in message['content'] -%}\n"
    "            {%- if item['type'] == 'image' -%}\n"
    "                {{ '<|image|>' }}\n"
    "            {%- elif item['type'] == 'audio' -%}\n"
    "                {{ '<|audio|>' }}\n"
    "            {%- elif item['type'] == 'video' -%}\n"
    "                {{ '<|video|>' }}\n"
    "            {%- elif item['type'] == 'text' -%}\n"
    "                {{ item['text'] | trim }}\n"
    "            {%- endif -%}\n"
    "        {%- endfor -%}\n"
    "    {%- else -%}\n"
    '        {{ raise_exception("Invalid content type") }}\n'
    "    {%- endif -%}\n"
    "    {{ '<turn|>\n' }}\n"
    "{%- endfor -%}\n"
    "{%- if add_generation_prompt -%}\n"
    "    {{ '<|turn>model\n' }}\n"
    "{%- endif -%}\n"
)

TEXT: dict[str, Any] = {
    **TINY_TEXT,
    "num_key_value_heads": 1,
    "head_dim": 32,
    "global_head_dim": 64,
    "hidden_size_per_layer_input": 16,
    "layer_types": ["sliding_attention", "full_attention"],
    "num_kv_shared_layers": 0,
    "use_double_wide_mlp": True,
}
"""Tiny text sizes with E2B's structure: one KV head, global heads twice the sliding ones (published
256 / 512), PLE, double-wide MLPs; one layer of each attention kind (published: 4 sliding per global,
35 layers, the last 20 sharing KV, which two layers cannot)."""
VISION: dict[str, Any] = {
    "hidden_size": 64,
    "intermediate_size": 128,
    "num_hidden_layers": 2,
    "num_attention_heads": 2,
    "num_key_value_heads": 2,
    "head_dim": 32,
}
"""Tiny vision sizes (published: 768 wide, 16 layers, 12 heads of 64); patch, pooling and positions stay real."""
AUDIO: dict[str, Any] = {
    "hidden_size": 64,
    "num_hidden_layers": 2,
    "num_attention_heads": 2,
    "output_proj_dims": TINY_TEXT["hidden_size"],
}
"""Tiny conformer sizes (published: 1024 wide, 12 layers, 8 heads, output 1536 = the E2B text width);
convolutions, chunked attention context and clipping stay real."""


def _build_tokenizer() -> GemmaTokenizer:
    """GemmaTokenizer over a trained BPE laid out on Gemma 4's ids, with its media tokens named."""
    from tokenizers import AddedToken
    from transformers import GemmaTokenizer

    pieces, merges = train_pieces(BPE_PIECES)
    vocab = layout_vocab(VOCAB_SIZE, {i: t for t, i in SPECIALS.items()}, pieces, BYTE_START)
    tok = GemmaTokenizer(
        vocab=vocab,
        merges=merges,
        add_bos_token=True,
        add_eos_token=False,
        # Gemma4Processor reads these by name (tokenizer.image_token, .boi_token, .audio_token, ...).
        extra_special_tokens={
            "image_token": "<|image|>",
            "boi_token": "<|image>",
            "eoi_token": "<image|>",
            "audio_token": "<|audio|>",
            "boa_token": "<|audio>",
            "eoa_token": "<audio|>",
        },
    )
    tok.add_tokens([AddedToken(t, special=True, normalized=False) for t in ADDED_SPECIAL], special_tokens=True)
    tok.model_max_length = 131072
    tok.chat_template = CHAT_TEMPLATE
    _assert_tokenizer(tok)
    return tok


def _assert_tokenizer(tok: GemmaTokenizer) -> None:
    """Fail the build unless the specials, bos/eos/pad and the media tokens sit on Gemma 4's ids."""
    assert_ids(tok, {t: i for t, i in SPECIALS.items() if t not in ("<pad>", "<eos>", "<bos>", "<unk>", "<mask>")})
    got = (tok.bos_token_id, tok.eos_token_id, tok.pad_token_id, tok.image_token_id, tok.audio_token_id)
    if got != (2, 1, 0, 258880, 258881):
        raise AssertionError(f"bos/eos/pad/image/audio ids are {got}")
    if len(tok) != VOCAB_SIZE:
        raise AssertionError(f"tokenizer has {len(tok)} entries, want {VOCAB_SIZE}")


def _build_config() -> Gemma4Config:
    """Gemma 4 config: published token ids, RoPE, norms, soft-capping and tower geometry; tiny widths."""
    from transformers import Gemma4Config

    return Gemma4Config(
        text_config={
            **TEXT,
            "vocab_size": VOCAB_SIZE,
            "vocab_size_per_layer_input": VOCAB_SIZE,
            "hidden_activation": "gelu_pytorch_tanh",
            "max_position_embeddings": 131072,
            "rms_norm_eps": 1e-6,
            "sliding_window": 512,
            "final_logit_softcapping": 30.0,
            "attention_bias": False,
            "attention_k_eq_v": False,
            "enable_moe_block": False,
            "rope_parameters": {
                "full_attention": {
                    "rope_type": "proportional",
                    "partial_rotary_factor": 0.25,
                    "rope_theta": 1_000_000.0,
                },
                "sliding_attention": {"rope_type": "default", "rope_theta": 10_000.0},
            },
            "pad_token_id": 0,
            "bos_token_id": 2,
            "eos_token_id": 1,
            "tie_word_embeddings": True,
            "dtype": "bfloat16",
        },
        vision_config={
            **VISION,
            "hidden_activation": "gelu_pytorch_tanh",
            "rms_norm_eps": 1e-6,
            "patch_size": 16,
            "pooling_kernel_size": 3,
            "position_embedding_size": 10 * 1024,
            "dtype": "bfloat16",
        },
        audio_config={
            **AUDIO,
            "hidden_act": "silu",
            "subsampling_conv_channels": [128, 32],
            "conv_kernel_size": 5,
            "residual_weight": 0.5,
            "attention_chunk_size": 12,
            "attention_context_left": 13,
            "attention_context_right": 0,
            "attention_logit_cap": 50.0,
            "use_clipped_linears": True,
            "rms_norm_eps": 1e-6,
            "dtype": "bfloat16",
        },
        boi_token_id=SPECIALS["<|image>"],
        eoi_token_id=SPECIALS["<image|>"],
        image_token_id=SPECIALS["<|image|>"],
        video_token_id=SPECIALS["<|video|>"],
        boa_token_id=SPECIALS["<|audio>"],
        eoa_token_index=SPECIALS["<audio|>"],
        audio_token_id=SPECIALS["<|audio|>"],
        eos_token_id=[SPECIALS["<eos>"], SPECIALS["<turn|>"]],
        tie_word_embeddings=True,
        dtype="bfloat16",
    )


def _build_processor(tokenizer: GemmaTokenizer) -> Gemma4Processor:
    """Gemma4Processor with the published settings: 280 soft tokens per image at most, 16 px patches
    pooled 3 x 3, no normalisation; 128-bin mel at 16 kHz (20 ms frames, 10 ms hop); 40 ms per audio token."""
    from transformers import Gemma4AudioFeatureExtractor, Gemma4ImageProcessor, Gemma4Processor, Gemma4VideoProcessor

    common = {"patch_size": 16, "pooling_kernel_size": 3, "max_soft_tokens": MAX_SOFT_TOKENS}
    return Gemma4Processor(
        feature_extractor=Gemma4AudioFeatureExtractor(
            feature_size=128,
            sampling_rate=SAMPLE_RATE,
            frame_length_ms=20.0,
            hop_length_ms=10.0,
            min_frequency=0.0,
            max_frequency=8000.0,
            mel_floor=1e-3,
            dither=0.0,
            return_attention_mask=True,
        ),
        image_processor=Gemma4ImageProcessor(**common),
        tokenizer=tokenizer,
        video_processor=Gemma4VideoProcessor(**common),
        chat_template=CHAT_TEMPLATE,
        image_seq_length=MAX_SOFT_TOKENS,
        audio_seq_length=750,
        audio_ms_per_token=40,
    )


def _verify_saved(out_dir: Path) -> None:
    """Reload as SGLang will and check the ids, the rendered prompt, and an image's and a clip's expansion."""
    import numpy as np
    from PIL import Image
    from transformers import AutoProcessor

    processor = AutoProcessor.from_pretrained(out_dir, local_files_only=True)
    _assert_tokenizer(processor.tokenizer)
    content = [{"type": "image"}, {"type": "audio"}, {"type": "text", "text": "Hi"}]
    text = processor.tokenizer.apply_chat_template(
        [{"role": "user", "content": content}], tokenize=False, add_generation_prompt=True
    )
    want = "<bos><|turn>user\n<|image|><|audio|>Hi<turn|>\n<|turn>model\n"
    if text != want:
        raise AssertionError(f"chat template rendered {text!r}, want {want!r}")
    out = processor(
        text=[text],
        images=[[Image.new("RGB", (256, 256))]],
        audio=[np.zeros(SAMPLE_RATE, dtype=np.float32)],
        return_tensors="np",
    )
    ids = out["input_ids"][0].tolist()
    got = (ids.count(SPECIALS["<|image|>"]), ids.count(SPECIALS["<|audio|>"]))
    if got != (256, 25):
        raise AssertionError(f"a 256 px image and a 1 s clip expand to {got} soft tokens, want (256, 25)")


def build(out_dir: Path, seed: int) -> None:
    """Write a tiny random-weight Gemma 4 (bf16 weights, tokenizer, processor) to ``out_dir``."""
    from transformers import Gemma4ForConditionalGeneration, GenerationConfig

    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    tokenizer = _build_tokenizer()
    processor = _build_processor(tokenizer)
    model = random_weights(Gemma4ForConditionalGeneration, _build_config(), seed)
    # Token ids only, no sampling defaults (the published one samples): tests ask for greedy.
    model.generation_config = GenerationConfig(bos_token_id=2, pad_token_id=0, eos_token_id=[1, 106])
    model.save_pretrained(out_dir)
    processor.save_pretrained(out_dir)
    clean_tokenizer_config(out_dir)
    write_bos_eos_flags(out_dir)
    _verify_saved(out_dir)


FAMILY = Family(
    name="gemma4",
    architecture="Gemma4ForConditionalGeneration",
    builder_version=BUILDER_VERSION,
    build=build,
    modalities=("image", "audio"),
    # SGLang's default CPU attention (torch_native) cannot serve Gemma 4's hybrid sliding-window layout.
    server_args=("--attention-backend", "intel_amx"),
    notes=(
        "gemma-4-E2B layout. Tokenizer: a 4000-piece BPE trained on stdlib text with fillers; only "
        "bos/eos/pad/unk/mask, the turn markers and the image/audio/video tokens sit on their published "
        "ids (the thinking, tool and other added tokens are left out). Chat template: the turn and "
        "media-marker shape only (no thinking or tool handling). Text: 2 layers, one sliding (window "
        "512) and one global, no KV sharing (published: 35 layers, 4 sliding per global, the last 20 "
        "sharing KV); PLE 16 wide (published 256). generation_config carries ids only."
    ),
    image_tokens={256: 256, 512: 256},
)
