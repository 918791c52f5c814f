"""Qwen2-VL, and the checkpoint-writing helpers Qwen2.5-VL shares with it.

Both families pair a Qwen2 text model (M-RoPE, no ``head_dim`` key: it is hidden / heads) with a
14 px patch ViT whose 2x2 patch merger feeds the text width, the CLIP mean/std image processor and
the Qwen2 tokenizer, so one set of helpers writes either; only the config and the model and
processor classes differ. Sizes are tiny, the structure is the published checkpoints'.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any

from .. import random_model as rm
from . import TINY_TEXT, Family

if TYPE_CHECKING:  # transformers is slow to import; load it only when building
    from transformers import PretrainedConfig, ProcessorMixin

BUILDER_VERSION: str = "qwen2vl/1"
"""Bump when the build output changes, so cached builds are rebuilt."""

PATCH_SIZE: int = 14
MERGE_SIZE: int = 2
TEMPORAL_PATCH_SIZE: int = 2
MIN_PIXELS: int = 3136  # 56 x 56: the published preprocessor_config.json values
MAX_PIXELS: int = 12845056  # 16384 merged 28 px tokens
CLIP_MEAN: tuple[float, float, float] = (0.48145466, 0.4578275, 0.40821073)
CLIP_STD: tuple[float, float, float] = (0.26862954, 0.26130258, 0.27577711)

# The tiny Qwen2 text model both families use. head_dim is 128 / 4 = 32, so the M-RoPE sections
# (t, h, w) must cover 16 rotary pairs; [4, 6, 6] keeps the published [16, 24, 24] proportions.
TEXT: dict[str, Any] = TINY_TEXT
MROPE_SECTION: list[int] = [4, 6, 6]

# Qwen2-VL's vision tower at tiny width: embed_dim (ViT width) and mlp_ratio, not intermediate_size;
# hidden_size is the merger's output, i.e. the text width.
VISION: dict[str, Any] = {
    "depth": 2,
    "embed_dim": 64,
    "mlp_ratio": 4,
    "num_heads": 2,
    "hidden_act": "quick_gelu",
}


def text_config(
    max_position_embeddings: int,
    sizes: dict[str, Any] | None = None,
    mrope_section: list[int] | None = None,
    max_window_layers: int | None = None,
) -> dict[str, Any]:
    """The Qwen2 text config with the published non-size keys (rope theta, eps, ids): tiny ``TEXT`` sizes
    and M-RoPE sections unless ``sizes`` / ``mrope_section`` give a real shape's."""
    sizes = TEXT if sizes is None else sizes
    return {
        **sizes,
        "vocab_size": rm.VOCAB_SIZE,
        "hidden_act": "silu",
        "max_position_embeddings": max_position_embeddings,
        "rms_norm_eps": 1e-6,
        "use_sliding_window": False,
        "sliding_window": 32768,
        "max_window_layers": sizes["num_hidden_layers"] if max_window_layers is None else max_window_layers,
        "rope_parameters": {
            "rope_type": "default",
            "rope_theta": 1_000_000.0,
            "mrope_section": MROPE_SECTION if mrope_section is None else mrope_section,
        },
        "bos_token_id": rm.TOKEN_IDS[rm.PAD_TOKEN],
        "eos_token_id": rm.TOKEN_IDS[rm.EOS_TOKEN],
        "dtype": "bfloat16",
    }


def vision_common() -> dict[str, Any]:
    """Patching keys both vision towers share; ``in_chans`` too, as SGLang's Qwen2-VL tower reads it."""
    return {
        "in_channels": 3,
        "in_chans": 3,
        "patch_size": PATCH_SIZE,
        "spatial_patch_size": PATCH_SIZE,
        "spatial_merge_size": MERGE_SIZE,
        "temporal_patch_size": TEMPORAL_PATCH_SIZE,
        "dtype": "bfloat16",
    }


def token_ids() -> dict[str, int]:
    """The top-level vision token ids of the published configs (SGLang's processor reads them)."""
    ids = rm.TOKEN_IDS
    return {
        "image_token_id": ids["<|image_pad|>"],
        "video_token_id": ids["<|video_pad|>"],
        "vision_start_token_id": ids["<|vision_start|>"],
        "vision_end_token_id": ids["<|vision_end|>"],
        "vision_token_id": ids["<|vision_pad|>"],
    }


def build_config() -> PretrainedConfig:
    """Qwen2-VL's structure (ViT of embed_dim x depth, 2x2 merger to the text width) at tiny sizes."""
    from transformers import Qwen2VLConfig

    return Qwen2VLConfig(
        text_config=text_config(max_position_embeddings=32768),
        vision_config={**VISION, **vision_common(), "hidden_size": TEXT["hidden_size"]},
        tie_word_embeddings=True,  # as Qwen2-VL-2B
        dtype="bfloat16",
        **token_ids(),
    )


def build_processor(processor_class: str) -> ProcessorMixin:
    """``processor_class`` (Qwen2VLProcessor / Qwen2_5_VLProcessor) with the published image settings.

    Both families ship the same image and video processors: CLIP mean/std, 14 px patches, 2x2
    merge, 2-frame temporal patches; images span 3136..12845056 pixels, videos keep the video
    processor's own (published) frame-size bounds.
    """
    import transformers
    from transformers import Qwen2VLImageProcessor, Qwen2VLVideoProcessor

    common: dict[str, Any] = {
        "patch_size": PATCH_SIZE,
        "temporal_patch_size": TEMPORAL_PATCH_SIZE,
        "merge_size": MERGE_SIZE,
        "image_mean": list(CLIP_MEAN),
        "image_std": list(CLIP_STD),
    }
    size = {"shortest_edge": MIN_PIXELS, "longest_edge": MAX_PIXELS}
    return getattr(transformers, processor_class)(
        image_processor=Qwen2VLImageProcessor(size=size, **common),
        tokenizer=rm.build_tokenizer(),
        video_processor=Qwen2VLVideoProcessor(**common),
        chat_template=rm.CHAT_TEMPLATE,
    )


def write_checkpoint(
    out_dir: Path,
    seed: int,
    config: PretrainedConfig,
    model_class: str,
    processor_class: str,
    device: str = "cpu",
) -> None:
    """Write model (bf16, seed-fixed init), processor and tokenizer to ``out_dir``, then re-check them.

    The init runs under a forked RNG so building never moves the caller's torch seed; the saved
    processor is reloaded as SGLang will and its special ids and chat template verified. ``device`` is
    where the weights are initialised (``cuda`` for the real-size shapes: seconds instead of minutes;
    the values differ by device, the shapes do not).
    """
    import transformers
    from transformers import GenerationConfig

    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    processor = build_processor(processor_class)
    model = rm.random_weights(getattr(transformers, model_class), config, seed, device)
    # Token ids only, as random_model does: tests ask for greedy decoding explicitly.
    model.generation_config = GenerationConfig(
        bos_token_id=rm.TOKEN_IDS[rm.PAD_TOKEN],
        pad_token_id=rm.TOKEN_IDS[rm.PAD_TOKEN],
        eos_token_id=[rm.TOKEN_IDS[rm.EOS_TOKEN], rm.TOKEN_IDS[rm.PAD_TOKEN]],
    )
    model.save_pretrained(out_dir)
    processor.save_pretrained(out_dir)
    rm.clean_tokenizer_config(out_dir)
    rm.verify_saved(out_dir)


def _build(out_dir: Path, seed: int) -> None:
    write_checkpoint(out_dir, seed, build_config(), "Qwen2VLForConditionalGeneration", "Qwen2VLProcessor")


FAMILY = Family(
    name="qwen2-vl",
    architecture="Qwen2VLForConditionalGeneration",
    builder_version=BUILDER_VERSION,
    build=_build,
    modalities=("image", "video"),
    notes="LM head tied to the embeddings (as Qwen2-VL-2B); chat template without the default system prompt",
    image_tokens={256: 81, 512: 324},
)
