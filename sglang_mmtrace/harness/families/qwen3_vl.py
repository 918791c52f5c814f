"""Qwen3-VL: the harness's first family, built by ``random_model`` (which also has its real-size shapes)."""

from __future__ import annotations

from pathlib import Path

from ..random_model import BUILDER_VERSION, SHAPES, build_qwen3vl
from . import Family


def _build(out_dir: Path, seed: int, shape: str = "tiny", device: str | None = None) -> None:
    build_qwen3vl(out_dir, seed=seed, shape=shape, device=device)


FAMILY = Family(
    name="qwen3-vl",
    architecture="Qwen3VLForConditionalGeneration",
    builder_version=BUILDER_VERSION,
    build=_build,
    modalities=("image", "video"),
    image_tokens={256: 64, 512: 256},
    shapes=tuple(SHAPES),
)
