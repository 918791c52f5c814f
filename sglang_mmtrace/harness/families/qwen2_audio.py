"""Qwen2-Audio (``Qwen2AudioForConditionalGeneration``): a Whisper-style audio encoder feeding Qwen2.

Real structure at tiny sizes (Qwen2-Audio-7B-Instruct's layout): a 30 s window of 128-bin log-mel
frames (Whisper feature extractor, 16 kHz, hop 160: 3000 frames) through the encoder's two convolutions
(the second stride 2: 1500 positions, ``max_source_positions``), its transformer layers and a stride-2
average pool, then a linear projector to the text width. The Qwen2 text model is full multi-head
attention as published (32 heads, 32 KV heads at 7B). SGLang serves it with ``models/qwen2_audio.py``
and preprocesses with ``multimodal/processors/qwen_audio.py`` around transformers'
``Qwen2AudioProcessor``, which expands ``<|AUDIO|>`` between ``<|audio_bos|>``/``<|audio_eos|>`` to one
token per 40 ms of audio (a 1 s clip: 100 mel frames -> 50 -> 25 tokens).

The tokenizer is Qwen2's layout: text tokens 0..151642, then the six added tokens from 151643
(``<|endoftext|>``, ``<|im_start|>``, ``<|im_end|>``, ``<|AUDIO|>`` 151646, ``<|audio_bos|>`` 151647,
``<|audio_eos|>`` 151648); the embedding has the published 156032 rows.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any

from ..random_model import random_weights
from . import TINY_TEXT, Family
from ._tokenizer import assert_token_ids, qwen2_tokenizer, save_tokenizer

if TYPE_CHECKING:
    from transformers import Qwen2AudioConfig, Qwen2AudioProcessor, Qwen2Tokenizer

BUILDER_VERSION = "qwen2audio/1"

FIRST_SPECIAL_ID = 151643
VOCAB_SIZE = 156032
"""The model's embedding rows (``text_config.vocab_size``); the tokenizer has 151649 entries."""
ADDED_TOKENS: tuple[tuple[str, bool], ...] = (
    ("<|endoftext|>", True),
    ("<|im_start|>", True),
    ("<|im_end|>", True),
    ("<|AUDIO|>", True),
    ("<|audio_bos|>", True),
    ("<|audio_eos|>", True),
)
"""Qwen2-Audio's added tokens, in id order from 151643 (the published tokenizer's)."""
TOKEN_IDS: dict[str, int] = {tok: FIRST_SPECIAL_ID + i for i, (tok, _) in enumerate(ADDED_TOKENS)}
AUDIO_MARKERS = "<|audio_bos|><|AUDIO|><|audio_eos|>"

SAMPLE_RATE = 16_000
MEL_BINS = 128
CHUNK_SECONDS = 30
HOP_LENGTH = 160
N_FFT = 400
MAX_SOURCE_POSITIONS = 1500
"""3000 mel frames of the 30 s window after the encoder's stride-2 convolution (what the tower requires)."""

# The published Qwen2-Audio-7B-Instruct chat template (tokenizer_config.json): a default system turn,
# each audio part numbered as "Audio N: <|audio_bos|><|AUDIO|><|audio_eos|>\n". SGLang hands a
# template {"type": "audio"} for an ``audio_url`` part, which the published test ('audio' in content)
# misses; the type test transformers' own default template carries is added, so the audio renders.
CHAT_TEMPLATE = (
    "{% set audio_count = namespace(value=0) %}"
    "{% for message in messages %}"
    "{% if loop.first and message['role'] != 'system' %}"
    "<|im_start|>system\nYou are a helpful assistant.<|im_end|>\n"
    "{% endif %}"
    "<|im_start|>{{ message['role'] }}\n"
    "{% if message['content'] is string %}"
    "{{ message['content'] }}<|im_end|>\n"
    "{% else %}"
    "{% for content in message['content'] %}"
    "{% if 'audio' in content or 'audio_url' in content or content['type'] == 'audio' %}"
    "{% set audio_count.value = audio_count.value + 1 %}"
    "Audio {{ audio_count.value }}: <|audio_bos|><|AUDIO|><|audio_eos|>\n"
    "{% elif 'text' in content %}"
    "{{ content['text'] }}"
    "{% endif %}"
    "{% endfor %}"
    "<|im_end|>\n"
    "{% endif %}"
    "{% endfor %}"
    "{% if add_generation_prompt %}"
    "<|im_start|>assistant\n"
    "{% endif %}"
)

TEXT: dict[str, Any] = {**TINY_TEXT, "num_key_value_heads": TINY_TEXT["num_attention_heads"]}
"""Tiny text sizes; full multi-head attention, as the published Qwen2 text model."""
AUDIO: dict[str, Any] = {
    "d_model": 64,
    "encoder_layers": 2,
    "encoder_attention_heads": 2,
    "encoder_ffn_dim": 128,
}
"""Tiny encoder sizes (published: 1280 wide, 32 layers, 20 heads, MLP 5120); mel bins and window stay real."""


def _build_tokenizer() -> Qwen2Tokenizer:
    """Qwen2Tokenizer: trained BPE + fillers up to 151642, the six added tokens on their real ids."""
    tok = qwen2_tokenizer(
        ADDED_TOKENS, FIRST_SPECIAL_ID, eos="<|im_end|>", pad="<|endoftext|>", chat_template=CHAT_TEMPLATE
    )
    tok.model_max_length = 32768
    # Qwen2AudioProcessor reads these three by name when the tokenizer has them.
    tok.audio_token, tok.audio_bos_token, tok.audio_eos_token = "<|AUDIO|>", "<|audio_bos|>", "<|audio_eos|>"
    _assert_tokenizer(tok)
    return tok


def _assert_tokenizer(tok: Any) -> None:
    """Fail the build unless the added tokens, eos and pad sit on Qwen2-Audio's ids."""
    assert_token_ids(tok, TOKEN_IDS, markers=AUDIO_MARKERS)
    got = (tok.eos_token_id, tok.pad_token_id, len(tok))
    if got != (TOKEN_IDS["<|im_end|>"], TOKEN_IDS["<|endoftext|>"], FIRST_SPECIAL_ID + len(ADDED_TOKENS)):
        raise AssertionError(f"eos/pad/length are {got}")


def _build_config() -> Qwen2AudioConfig:
    """Qwen2-Audio's config: published token ids, RoPE, norms and encoder geometry; tiny widths and depths."""
    from transformers import Qwen2AudioConfig

    return Qwen2AudioConfig(
        audio_config={
            **AUDIO,
            "model_type": "qwen2_audio_encoder",
            "num_mel_bins": MEL_BINS,
            "max_source_positions": MAX_SOURCE_POSITIONS,
            "activation_function": "gelu",
            "scale_embedding": False,
            "dtype": "bfloat16",
        },
        text_config={
            **TEXT,
            "model_type": "qwen2",
            "vocab_size": VOCAB_SIZE,
            "hidden_act": "silu",
            "max_position_embeddings": 8192,
            "rms_norm_eps": 1e-5,
            "rope_parameters": {"rope_type": "default", "rope_theta": 10_000.0},
            "use_sliding_window": False,
            "sliding_window": 32768,
            "max_window_layers": TEXT["num_hidden_layers"],
            "bos_token_id": TOKEN_IDS["<|endoftext|>"],
            "eos_token_id": TOKEN_IDS["<|im_end|>"],
            "tie_word_embeddings": False,
            "dtype": "bfloat16",
        },
        audio_token_index=TOKEN_IDS["<|AUDIO|>"],
        tie_word_embeddings=False,
        dtype="bfloat16",
    )


def _build_processor(tokenizer: Qwen2Tokenizer) -> Qwen2AudioProcessor:
    """Qwen2AudioProcessor with the published Whisper feature extractor (128 mel bins, 16 kHz, 30 s)."""
    from transformers import Qwen2AudioProcessor, WhisperFeatureExtractor

    feature_extractor = WhisperFeatureExtractor(
        feature_size=MEL_BINS,
        sampling_rate=SAMPLE_RATE,
        hop_length=HOP_LENGTH,
        chunk_length=CHUNK_SECONDS,
        n_fft=N_FFT,
        padding_value=0.0,
        dither=0.0,
        return_attention_mask=True,
    )
    return Qwen2AudioProcessor(feature_extractor=feature_extractor, tokenizer=tokenizer, chat_template=CHAT_TEMPLATE)


def _verify_saved(out_dir: Path) -> None:
    """Reload as SGLang will and check the ids, the rendered prompt and a 1 s clip's expansion (25 tokens)."""
    import numpy as np
    from transformers import AutoProcessor

    processor = AutoProcessor.from_pretrained(out_dir, local_files_only=True)
    _assert_tokenizer(processor.tokenizer)
    messages = [{"role": "user", "content": [{"type": "audio"}, {"type": "text", "text": "Hi"}]}]
    text = processor.tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
    want = (
        "<|im_start|>system\nYou are a helpful assistant.<|im_end|>\n<|im_start|>user\n"
        f"Audio 1: {AUDIO_MARKERS}\nHi<|im_end|>\n<|im_start|>assistant\n"
    )
    if text != want:
        raise AssertionError(f"chat template rendered {text!r}, want {want!r}")
    clip = np.zeros(SAMPLE_RATE, dtype=np.float32)
    out = processor(text=[text], audio=[clip], sampling_rate=SAMPLE_RATE, return_tensors="np")
    n = int((out["input_ids"][0] == TOKEN_IDS["<|AUDIO|>"]).sum())
    if n != 25 or out["input_features"].shape[-2:] != (MEL_BINS, 2 * MAX_SOURCE_POSITIONS):
        raise AssertionError(f"a 1 s clip expands to {n} audio tokens, features {out['input_features'].shape}")


def _published_names(out_dir: Path) -> int:
    """Rename the saved ``language_model.model.model.X`` to the published ``language_model.model.X``; return how many.

    transformers 5.19 writes one ``model.`` too many when it reverses Qwen2-Audio's load-time renaming
    on save (its ``qwen2_audio`` and ``Qwen2AudioModel`` rules both seem to apply), while the published
    checkpoint, and SGLang's loader (``Qwen2ForCausalLM`` under ``language_model``), have one.
    transformers reads the published names back.
    """
    from safetensors import safe_open
    from safetensors.torch import save_file

    path = Path(out_dir) / "model.safetensors"
    doubled = "language_model.model.model."
    with safe_open(path, "pt") as f:
        metadata = f.metadata()
        tensors = {k: f.get_tensor(k) for k in f.keys()}  # noqa: SIM118 (safe_open is not a mapping)
    renamed = sum(k.startswith(doubled) for k in tensors)
    if renamed:
        fixed = {
            ("language_model.model." + k[len(doubled) :] if k.startswith(doubled) else k): v for k, v in tensors.items()
        }
        save_file(fixed, str(path), metadata)
    return renamed


def build(out_dir: Path, seed: int) -> None:
    """Write a tiny random-weight Qwen2-Audio (bf16 weights, tokenizer, processor) to ``out_dir``."""
    from transformers import GenerationConfig, Qwen2AudioForConditionalGeneration

    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    model = random_weights(Qwen2AudioForConditionalGeneration, _build_config(), seed)
    # Token ids only, no sampling defaults (the published one samples): tests ask for greedy.
    model.generation_config = GenerationConfig(
        bos_token_id=TOKEN_IDS["<|endoftext|>"],
        pad_token_id=TOKEN_IDS["<|endoftext|>"],
        eos_token_id=[TOKEN_IDS["<|im_end|>"], TOKEN_IDS["<|endoftext|>"]],
    )
    model.save_pretrained(out_dir)
    _published_names(out_dir)
    processor = _build_processor(_build_tokenizer())
    processor.save_pretrained(out_dir)
    save_tokenizer(processor.tokenizer, out_dir)
    _verify_saved(out_dir)


FAMILY = Family(
    name="qwen2-audio",
    architecture="Qwen2AudioForConditionalGeneration",
    builder_version=BUILDER_VERSION,
    build=build,
    modalities=("audio",),
    # The harness asks for a 32768-token context; SGLang refuses more than max_position_embeddings
    # (8192, as published) unless SGLANG_ALLOW_OVERWRITE_LONGER_CONTEXT_LEN is set.
    server_args=("--context-length", "8192"),
    notes=(
        "Qwen2-Audio-7B-Instruct layout. Tokenizer: a 4000-entry byte-level BPE with fillers; only the six "
        "added tokens (151643..151648) sit on their published ids. Chat template: the published one plus a "
        "content['type'] == 'audio' test (SGLang renders audio_url parts as {'type': 'audio'}, which the "
        "published template skips). generation_config carries ids only (published: sampling)."
    ),
)
