"""sglang-mmtrace: a measured, per-stage breakdown of multimodal TTFT in SGLang."""

from .plugin import install, uninstall

__all__ = ["install", "uninstall", "__version__"]
__version__ = "0.1.0"
