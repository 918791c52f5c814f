"""Build a random-weight Qwen3-VL offline: tiny for the CPU server, real-size shapes for GPU timing.

No model can be downloaded, so the checkpoint is generated: real Qwen3-VL architecture and real
special-token ids (SGLang's Qwen-VL code keys on them) with a locally trained byte-level BPE
tokenizer. The ``tiny`` shape (2 layers of width 128) lets the real server run on CPU in tests.
GPU timings depend on shapes, not on weight values, so ``qwen3-vl-2b`` and ``qwen3-vl-4b`` carry the
published configurations of those checkpoints (layers, widths, heads, vision tower, deepstack
layers) with random weights: a GPU run with them times the vision encoder and prefill a user
of the real model sees. Builds are deterministic for a given seed, shape and library versions, and
cached: a ``.complete`` marker written last tells a finished build from a partial.

Its command line is the family registry's (``python -m sglang_mmtrace.harness.families``), which sits
above this module: Qwen3-VL is the family ``qwen3-vl`` there.
"""

from __future__ import annotations

import fcntl
import json
import os
import shutil
import sysconfig
import tempfile
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # transformers is slow to import; load it only when building
    from transformers import PreTrainedTokenizerBase, Qwen2Tokenizer, Qwen3VLConfig, Qwen3VLProcessor

BUILDER_VERSION: str = "qwen3vl/2"
"""Bump when the build output changes, so cached builds are rebuilt."""

MARKER_NAME: str = ".complete"
CACHE_ENV: str = "SGLANG_MMTRACE_CACHE"

VOCAB_SIZE: int = 151936
BPE_VOCAB_SIZE: int = 4000
FIRST_SPECIAL_ID: int = 151643
MODEL_MAX_LENGTH: int = 262144

# The 26 added tokens of the Qwen2/Qwen3 tokenizers, in id order from 151643: (content, special).
ADDED_TOKENS: tuple[tuple[str, bool], ...] = (
    ("<|endoftext|>", True),
    ("<|im_start|>", True),
    ("<|im_end|>", True),
    ("<|object_ref_start|>", True),
    ("<|object_ref_end|>", True),
    ("<|box_start|>", True),
    ("<|box_end|>", True),
    ("<|quad_start|>", True),
    ("<|quad_end|>", True),
    ("<|vision_start|>", True),
    ("<|vision_end|>", True),
    ("<|vision_pad|>", True),
    ("<|image_pad|>", True),
    ("<|video_pad|>", True),
    ("<tool_call>", False),
    ("</tool_call>", False),
    ("<|fim_prefix|>", True),
    ("<|fim_middle|>", True),
    ("<|fim_suffix|>", True),
    ("<|fim_pad|>", True),
    ("<|repo_name|>", True),
    ("<|file_sep|>", True),
    ("<tool_response>", False),
    ("</tool_response>", False),
    ("<think>", False),
    ("</think>", False),
)
TOKEN_IDS: dict[str, int] = {tok: FIRST_SPECIAL_ID + i for i, (tok, _) in enumerate(ADDED_TOKENS)}
EOS_TOKEN: str = "<|im_end|>"
PAD_TOKEN: str = "<|endoftext|>"

# Stdlib files to train the BPE on: always present, plain text, enough merges for 4000 entries.
_CORPUS_FILES: tuple[str, ...] = (
    "argparse.py",
    "textwrap.py",
    "string.py",
    "functools.py",
    "json/encoder.py",
    "json/decoder.py",
)


def chatml_template(image_part: str, video_part: str | None = None) -> str:
    """A ChatML chat template (``<|im_start|>role ... <|im_end|>``) whose image parts render as
    ``image_part`` (and video parts as ``video_part``): the Qwen-VL and InternVL families' shape.
    The words "image"/"video" in it also make SGLang pick its 'openai' (list) content format."""
    video = (
        f"{{%- elif content['type'] == 'video' or 'video' in content %}}{{{{- '{video_part}' }}}}" if video_part else ""
    )
    return (
        "{%- for message in messages %}"
        "{{- '<|im_start|>' + message['role'] + '\\n' }}"
        "{%- if message['content'] is string %}"
        "{{- message['content'] }}"
        "{%- elif message['content'] is not none %}"
        "{%- for content in message['content'] %}"
        "{%- if content['type'] == 'image' or 'image' in content or 'image_url' in content %}"
        f"{{{{- '{image_part}' }}}}"
        f"{video}"
        "{%- elif 'text' in content %}"
        "{{- content['text'] }}"
        "{%- endif %}"
        "{%- endfor %}"
        "{%- endif %}"
        "{{- '<|im_end|>\\n' }}"
        "{%- endfor %}"
        "{%- if add_generation_prompt %}"
        "{{- '<|im_start|>assistant\\n' }}"
        "{%- endif %}"
    )


# Qwen3-VL: an image part renders as <|vision_start|><|image_pad|><|vision_end|>.
CHAT_TEMPLATE: str = chatml_template(
    "<|vision_start|><|image_pad|><|vision_end|>", "<|vision_start|><|video_pad|><|vision_end|>"
)

# Run-time keys transformers 5 writes into tokenizer_config.json; they are not configuration.
_DROP_TOKENIZER_KEYS: tuple[str, ...] = ("is_local", "local_files_only")


def default_cache_dir() -> Path:
    """``$SGLANG_MMTRACE_CACHE`` or ``~/.cache/sglang-mmtrace``: shared by model and stub builds."""
    env = os.environ.get(CACHE_ENV)
    return Path(env).expanduser() if env else Path.home() / ".cache" / "sglang-mmtrace"


def corpus() -> list[str]:
    """Text of the fixed stdlib files the tokenizer is trained on."""
    stdlib = Path(sysconfig.get_paths()["stdlib"])
    return [(stdlib / rel).read_text(encoding="utf-8") for rel in _CORPUS_FILES]


def train_bpe() -> tuple[dict[str, int], list[tuple[str, str]]]:
    """Train a Qwen2-style byte-level BPE (4000 entries) and return its vocab and merges."""
    from tokenizers import Regex, Tokenizer, decoders, models, normalizers, pre_tokenizers, trainers
    from transformers.models.qwen2.tokenization_qwen2 import PRETOKENIZE_REGEX

    tok = Tokenizer(models.BPE(unk_token=None, byte_fallback=False))
    tok.normalizer = normalizers.NFC()
    tok.pre_tokenizer = pre_tokenizers.Sequence(
        [
            pre_tokenizers.Split(Regex(PRETOKENIZE_REGEX), behavior="isolated", invert=False),
            pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
        ]
    )
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=BPE_VOCAB_SIZE,
        min_frequency=2,
        show_progress=False,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        special_tokens=[],
    )
    tok.train_from_iterator(corpus(), trainer=trainer)
    model = json.loads(tok.to_str())["model"]
    vocab: dict[str, int] = model["vocab"]
    merges = [tuple(m) if isinstance(m, list) else tuple(m.split(" ", 1)) for m in model["merges"]]
    if sorted(vocab.values()) != list(range(BPE_VOCAB_SIZE)):
        raise RuntimeError(f"BPE training gave {len(vocab)} entries, expected {BPE_VOCAB_SIZE}")
    return vocab, [(a, b) for a, b in merges]


def build_tokenizer() -> Qwen2Tokenizer:
    """Trained BPE + filler tokens up to 151642, then the 26 specials on their real ids."""
    from tokenizers import AddedToken
    from transformers import Qwen2Tokenizer

    vocab, merges = train_bpe()
    # Fillers are printable ASCII, so the byte-level decoder renders them if the random model
    # samples them; digits are split by the pre-tokenizer, so encoding never produces them.
    for i in range(BPE_VOCAB_SIZE, FIRST_SPECIAL_ID):
        vocab[f"<f{i}>"] = i
    if len(vocab) != FIRST_SPECIAL_ID:
        raise RuntimeError("filler tokens collided with trained BPE entries")

    # Pitfall: Qwen2Tokenizer.__init__ adds eos/pad/unk as added tokens *first*. Passing
    # eos="<|im_end|>" here would put it on 151643. Start with <|endoftext|> only (its real id
    # 151643), add the rest in order, and switch eos to <|im_end|> afterwards.
    tok = Qwen2Tokenizer(
        vocab=vocab,
        merges=merges,
        unk_token=None,
        bos_token=None,
        eos_token=PAD_TOKEN,
        pad_token=PAD_TOKEN,
    )
    for content, special in ADDED_TOKENS[1:]:
        tok.add_tokens([AddedToken(content, special=special, normalized=False)], special_tokens=special)
    tok.eos_token = EOS_TOKEN
    tok.pad_token = PAD_TOKEN
    tok.model_max_length = MODEL_MAX_LENGTH
    tok.chat_template = CHAT_TEMPLATE
    _assert_tokenizer(tok)
    return tok


def _assert_tokenizer(tok: PreTrainedTokenizerBase) -> None:
    """Fail the build unless every special token sits on its real Qwen id."""
    got = {t: tok.convert_tokens_to_ids(t) for t in TOKEN_IDS}
    wrong = {t: (got[t], want) for t, want in TOKEN_IDS.items() if got[t] != want}
    if wrong:
        raise AssertionError(f"special token ids shifted (got, want): {wrong}")
    if tok.eos_token != EOS_TOKEN or tok.eos_token_id != TOKEN_IDS[EOS_TOKEN]:
        raise AssertionError(f"eos is {tok.eos_token!r}/{tok.eos_token_id}, want {EOS_TOKEN}")
    if tok.pad_token != PAD_TOKEN or tok.pad_token_id != TOKEN_IDS[PAD_TOKEN]:
        raise AssertionError(f"pad is {tok.pad_token!r}/{tok.pad_token_id}, want {PAD_TOKEN}")
    if len(tok) != FIRST_SPECIAL_ID + len(ADDED_TOKENS):
        raise AssertionError(f"tokenizer has {len(tok)} entries")
    ids = tok.encode("<|vision_start|><|image_pad|><|vision_end|>", add_special_tokens=False)
    if ids != [TOKEN_IDS["<|vision_start|>"], TOKEN_IDS["<|image_pad|>"], TOKEN_IDS["<|vision_end|>"]]:
        raise AssertionError(f"vision markers do not encode as single tokens: {ids}")


# The vision tower Qwen3-VL-2B and -4B share (the 8B has a wider one).
VISION_2B_4B: dict[str, Any] = {
    "depth": 24,
    "hidden_size": 1024,
    "intermediate_size": 4096,
    "num_heads": 16,
    "deepstack_visual_indexes": [5, 11, 17],
}

# Sizes per shape; everything else (vocab, token ids, RoPE, patching) is common to Qwen3-VL.
# qwen3-vl-2b / -4b: the published Qwen3-VL-2B/4B-Instruct config.json values.
SHAPES: dict[str, dict[str, dict[str, Any]]] = {
    "tiny": {
        "text": {
            "hidden_size": 128,
            "intermediate_size": 256,
            "num_hidden_layers": 2,
            "num_attention_heads": 4,
            "num_key_value_heads": 2,
            "head_dim": 32,
            "mrope_section": [6, 5, 5],
            "tie_word_embeddings": False,
        },
        "vision": {
            "depth": 2,
            "hidden_size": 64,
            "intermediate_size": 128,
            "num_heads": 2,
            "deepstack_visual_indexes": [0, 1],
        },
    },
    "qwen3-vl-2b": {
        "text": {
            "hidden_size": 2048,
            "intermediate_size": 6144,
            "num_hidden_layers": 28,
            "num_attention_heads": 16,
            "num_key_value_heads": 8,
            "head_dim": 128,
            "mrope_section": [24, 20, 20],
            "tie_word_embeddings": True,
        },
        "vision": VISION_2B_4B,
    },
    "qwen3-vl-4b": {
        "text": {
            "hidden_size": 2560,
            "intermediate_size": 9728,
            "num_hidden_layers": 36,
            "num_attention_heads": 32,
            "num_key_value_heads": 8,
            "head_dim": 128,
            "mrope_section": [24, 20, 20],
            "tie_word_embeddings": True,
        },
        "vision": VISION_2B_4B,
    },
}


def _build_config(shape: str = "tiny") -> Qwen3VLConfig:
    """The Qwen3-VL config of ``shape``: real structure and token ids, that shape's sizes."""
    from transformers import Qwen3VLConfig

    text, vision = dict(SHAPES[shape]["text"]), SHAPES[shape]["vision"]
    mrope_section = text.pop("mrope_section")
    tie = text["tie_word_embeddings"]
    return Qwen3VLConfig(
        text_config={
            **text,
            "vocab_size": VOCAB_SIZE,
            "hidden_act": "silu",
            "max_position_embeddings": MODEL_MAX_LENGTH,
            "rms_norm_eps": 1e-6,
            "rope_parameters": {
                "rope_type": "default",
                "rope_theta": 5_000_000.0,
                "mrope_section": mrope_section,
                "mrope_interleaved": True,
            },
            "dtype": "bfloat16",
        },
        vision_config={
            **vision,
            "hidden_act": "gelu_pytorch_tanh",
            "in_channels": 3,
            "patch_size": 16,
            "spatial_merge_size": 2,
            "temporal_patch_size": 2,
            "out_hidden_size": text["hidden_size"],
            "num_position_embeddings": 2304,
            "dtype": "bfloat16",
        },
        image_token_id=TOKEN_IDS["<|image_pad|>"],
        video_token_id=TOKEN_IDS["<|video_pad|>"],
        vision_start_token_id=TOKEN_IDS["<|vision_start|>"],
        vision_end_token_id=TOKEN_IDS["<|vision_end|>"],
        tie_word_embeddings=tie,
        dtype="bfloat16",
    )


def _build_processor(tokenizer: Qwen2Tokenizer) -> Qwen3VLProcessor:
    """Qwen3VLProcessor with the Qwen3-VL image/video processor settings (mean/std 0.5)."""
    from transformers import Qwen2VLImageProcessor, Qwen3VLProcessor, Qwen3VLVideoProcessor

    image_processor = Qwen2VLImageProcessor(
        size={"shortest_edge": 65536, "longest_edge": 16777216},
        patch_size=16,
        temporal_patch_size=2,
        merge_size=2,
        image_mean=[0.5, 0.5, 0.5],
        image_std=[0.5, 0.5, 0.5],
    )
    video_processor = Qwen3VLVideoProcessor(
        patch_size=16,
        temporal_patch_size=2,
        merge_size=2,
        image_mean=[0.5, 0.5, 0.5],
        image_std=[0.5, 0.5, 0.5],
    )
    return Qwen3VLProcessor(
        image_processor=image_processor,
        tokenizer=tokenizer,
        video_processor=video_processor,
        chat_template=CHAT_TEMPLATE,
    )


def clean_tokenizer_config(out_dir: Path) -> None:
    """Drop run-time keys transformers 5 saves into tokenizer_config.json."""
    path = out_dir / "tokenizer_config.json"
    cfg = json.loads(path.read_text(encoding="utf-8"))
    for key in _DROP_TOKENIZER_KEYS:
        cfg.pop(key, None)
    path.write_text(json.dumps(cfg, indent=2, ensure_ascii=False) + "\n", encoding="utf-8")


def verify_saved(out_dir: Path) -> None:
    """Reload from disk, as SGLang will, and re-check ids and the rendered image prompt."""
    from transformers import AutoProcessor

    processor = AutoProcessor.from_pretrained(out_dir, local_files_only=True)
    _assert_tokenizer(processor.tokenizer)
    messages = [{"role": "user", "content": [{"type": "image"}, {"type": "text", "text": "Hi"}]}]
    text = processor.tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
    want = "<|im_start|>user\n<|vision_start|><|image_pad|><|vision_end|>Hi<|im_end|>\n<|im_start|>assistant\n"
    if text != want:
        raise AssertionError(f"chat template rendered {text!r}, want {want!r}")


def random_weights(model_class: Any, config: Any, seed: int, device: str = "cpu") -> Any:
    """``model_class(config)`` with seed-fixed random weights, in bf16 and eval mode, built on ``device``.

    The global RNG is forked, so a build leaves the caller's random state as it was."""
    import torch

    with torch.random.fork_rng(devices=[]), torch.device(device):
        torch.manual_seed(seed)
        return model_class(config).to(torch.bfloat16).eval()


def _marker(shape: str, seed: int) -> str:
    return f"{BUILDER_VERSION} {shape} seed={seed}"


def build_qwen3vl(out_dir: Path, seed: int = 0, shape: str = "tiny", device: str | None = None) -> Path:
    """Write a random-weight Qwen3-VL checkpoint (model, tokenizer, processor) of ``shape`` to ``out_dir``.

    Deterministic for a given seed; offline; the ``.complete`` marker is written last so a crash
    leaves a directory that ``is_complete`` reports as partial. ``device`` is where the weights are
    initialized (default: ``cuda`` for the real-size shapes when there is one: a 2B model's random
    init takes minutes on a CPU, seconds on a GPU; the values differ by device, the shapes do not).
    """
    if shape not in SHAPES:
        raise ValueError(f"unknown shape {shape!r}; one of {', '.join(SHAPES)}")
    import torch
    from transformers import GenerationConfig, Qwen3VLForConditionalGeneration

    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    (out_dir / MARKER_NAME).unlink(missing_ok=True)

    tokenizer = build_tokenizer()
    processor = _build_processor(tokenizer)

    if device is None:
        device = "cuda" if shape != "tiny" and torch.cuda.is_available() else "cpu"
    model = random_weights(Qwen3VLForConditionalGeneration, _build_config(shape), seed, device)
    # Token ids only (as in Qwen3-VL), no sampling defaults: tests ask for greedy explicitly.
    model.generation_config = GenerationConfig(
        bos_token_id=TOKEN_IDS[PAD_TOKEN],
        pad_token_id=TOKEN_IDS[PAD_TOKEN],
        eos_token_id=[TOKEN_IDS[EOS_TOKEN], TOKEN_IDS[PAD_TOKEN]],
    )

    model.save_pretrained(out_dir)
    processor.save_pretrained(out_dir)
    clean_tokenizer_config(out_dir)
    verify_saved(out_dir)

    (out_dir / MARKER_NAME).write_text(_marker(shape, seed) + "\n", encoding="utf-8")
    return out_dir


def is_complete(model_dir: Path, seed: int = 0, shape: str = "tiny") -> bool:
    """True when ``model_dir`` holds a finished build of this builder version, shape and seed."""
    marker = Path(model_dir) / MARKER_NAME
    try:
        return marker.read_text(encoding="utf-8").strip() == _marker(shape, seed)
    except OSError:
        return False


@contextmanager
def _locked(lock_path: Path) -> Iterator[None]:
    """Exclusive inter-process lock, so parallel test workers build the model once."""
    lock_path.parent.mkdir(parents=True, exist_ok=True)
    with lock_path.open("a") as fh:
        fcntl.flock(fh, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(fh, fcntl.LOCK_UN)


def ensure_model(out_dir: Path, shape: str = "tiny", seed: int = 0) -> Path:
    """``out_dir``, built there first unless a finished build of ``shape`` and ``seed`` is there
    (the GPU scripts' model: one directory per shape, no cache lock needed on a one-user machine)."""
    out_dir = Path(out_dir)
    if not is_complete(out_dir, seed, shape):
        build_qwen3vl(out_dir, seed=seed, shape=shape)
    return out_dir


def cached_build(cache: Path, folder: str, complete: Callable[[Path], bool], build: Callable[[Path], None]) -> Path:
    """``cache/folder`` once ``complete`` says it holds a finished build, built there first if needed.

    The build goes to a temporary sibling and is renamed into place, so readers never see a partial
    model; a stale or partial folder is replaced; a lock makes parallel test workers build it once.
    """
    final = cache / folder
    if complete(final):
        return final
    with _locked(cache / f".{folder}.lock"):
        if complete(final):
            return final
        for stale in cache.glob(f"{folder}.tmp-*"):
            shutil.rmtree(stale, ignore_errors=True)
        tmp = Path(tempfile.mkdtemp(prefix=f"{folder}.tmp-", dir=cache))
        try:
            build(tmp)
            if final.exists():
                shutil.rmtree(final)
            os.rename(tmp, final)
        except BaseException:
            shutil.rmtree(tmp, ignore_errors=True)
            raise
    return final


def ensure_tiny_model(cache_dir: Path | None = None, seed: int = 0) -> Path:
    """A finished tiny-model folder in the cache (``cached_build``), built first if needed."""
    cache = Path(cache_dir) if cache_dir is not None else default_cache_dir()
    return cached_build(
        cache, f"tiny-qwen3vl-seed{seed}", lambda d: is_complete(d, seed), lambda d: build_qwen3vl(d, seed=seed)
    )


__all__ = [
    "ADDED_TOKENS",
    "BUILDER_VERSION",
    "CHAT_TEMPLATE",
    "SHAPES",
    "TOKEN_IDS",
    "build_qwen3vl",
    "default_cache_dir",
    "ensure_model",
    "ensure_tiny_model",
    "is_complete",
]

if __name__ == "__main__":
    # The builder command moved with the family list (importing it here would close an import cycle).
    raise SystemExit(
        "the model builder is now: python -m sglang_mmtrace.harness.families OUT_DIR [--family F] [--shape S]"
    )
