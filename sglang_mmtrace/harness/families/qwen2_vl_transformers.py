"""Qwen2-VL served through SGLang's transformers backend (``--model-impl transformers``).

The same tiny checkpoint as ``qwen2-vl``, another serving path: SGLang keeps its own Qwen-VL processor
(it declares ``supports_transformers_backend``) and runs the HF model's forward, which encodes images
and video through the HF model's ``get_image_features`` / ``get_video_features``. So the generic
processor stages and the transformers backend's encoder seam are both on the path, with M-RoPE.
"""

from __future__ import annotations

from dataclasses import replace

from .qwen2_vl import FAMILY as QWEN2_VL

FAMILY = replace(
    QWEN2_VL,
    name="qwen2-vl-transformers",
    server_args=("--model-impl", "transformers"),
    model_impl="transformers",
    notes=(
        "The qwen2-vl checkpoint, served with --model-impl transformers: SGLang's Qwen-VL processor, the HF "
        "model's forward; that backend turns the radix cache off for VLMs, so nothing is ever a prefix hit."
    ),
)
