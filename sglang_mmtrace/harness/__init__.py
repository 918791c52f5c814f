"""CPU harness: run the real SGLang server on CPU with a tiny offline Qwen3-VL, and talk to it.

Used by the tests, ``sglang-mmtrace demo`` and the bench (its servers, ``chat_request``); the plugin
code that SGLang loads never imports it. ``CpuServer`` starts ``sglang.launch_server`` with the
shims in ``shims/``; ``stream_chat`` talks to it with the stdlib only.
"""

from .images import data_url, make_image
from .random_model import (
    BUILDER_VERSION,
    TOKEN_IDS,
    build_qwen3vl,
    default_cache_dir,
    ensure_tiny_model,
)
from .server import DEFAULT_HEALTH_TIMEOUT_S, CpuServer, chat_request, image_message, stream_chat
from .shims import CPU_SHIMS_ENV, SHIMS_DIR, build_cuda_stub

__all__ = [
    "BUILDER_VERSION",
    "CPU_SHIMS_ENV",
    "DEFAULT_HEALTH_TIMEOUT_S",
    "SHIMS_DIR",
    "TOKEN_IDS",
    "CpuServer",
    "build_cuda_stub",
    "build_qwen3vl",
    "chat_request",
    "data_url",
    "default_cache_dir",
    "ensure_tiny_model",
    "image_message",
    "make_image",
    "stream_chat",
]
