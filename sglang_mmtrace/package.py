"""Which SGLang releases the plugin supports, and where their manifests live.

``_instruments`` declares the supported range the way OpenTelemetry instrumentations do (the
same requirement is the ``instruments`` extra in ``pyproject.toml``); ``SUPPORTED_VERSIONS`` are
the releases with a manifest under ``patches/``, the oldest and newest of which bound the range.
"""

from __future__ import annotations

import operator

_instruments = ("sglang >= 0.5.17, <= 0.5.23",)
SUPPORTED_RANGE: str = _instruments[0]
"""The supported range as one requirement string (``_instruments`` keeps OpenTelemetry's name and shape)."""
SUPPORTED_VERSIONS = ("0.5.17", "0.5.18", "0.5.19", "0.5.20", "0.5.21", "0.5.22", "0.5.23")
PRIMARY_VERSION = "0.5.23"

_OPS = {">=": operator.ge, "<=": operator.le, "==": operator.eq, "!=": operator.ne, ">": operator.gt, "<": operator.lt}


def version_key(v: str) -> tuple[int, ...]:
    """``0.5.23`` -> (0, 5, 23); a part's non-digits are ignored (``0.5.23rc1`` sorts as 0.5.23)."""
    return tuple(int("".join(ch for ch in part if ch.isdigit()) or 0) for part in v.split("."))


def requirement_clauses(requirement: str = SUPPORTED_RANGE) -> list[tuple[str, str]]:
    """``"sglang >= 0.5.17, <= 0.5.23"`` -> ``[(">=", "0.5.17"), ("<=", "0.5.23")]``."""
    spec = requirement.split(None, 1)[1] if " " in requirement.strip() else ""
    out = []
    for clause in filter(None, (c.strip() for c in spec.split(","))):
        op = next(o for o in sorted(_OPS, key=len, reverse=True) if clause.startswith(o))
        out.append((op, clause[len(op) :].strip()))
    return out


def in_supported_range(version: str) -> bool:
    """Whether an SGLang version satisfies ``_instruments`` (release numbers only; no pre-release rules)."""
    key = version_key(version)
    return all(_OPS[op](key, version_key(bound)) for op, bound in requirement_clauses())


def sglang_version() -> str | None:
    """The installed SGLang version, read from package metadata (no heavy import)."""
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("sglang")
    except PackageNotFoundError:
        return None
