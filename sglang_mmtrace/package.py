"""Which SGLang releases the plugin knows, and where their manifests live."""

from __future__ import annotations

_instruments = ("sglang >= 0.5.17, <= 0.5.23",)
SUPPORTED_VERSIONS = ("0.5.17", "0.5.23")
PRIMARY_VERSION = "0.5.23"


def sglang_version() -> str | None:
    """The installed SGLang version, read from package metadata (no heavy import)."""
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("sglang")
    except PackageNotFoundError:
        return None
