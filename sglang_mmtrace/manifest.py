"""Version manifests (``patches/sglang-<version>.toml``): version differences as data."""

from __future__ import annotations

import os
import tomllib
from dataclasses import dataclass, field
from importlib import resources

from . import environment_variables as ev
from .package import PRIMARY_VERSION, SUPPORTED_VERSIONS, version_key


@dataclass(frozen=True)
class HookEntry:
    hook_id: str
    target: str
    kind: str
    process: str
    stages: tuple[str, ...]
    required: bool = True
    applies_to: str | None = None
    """``processor`` or ``model``: ``target`` is then a method name, hooked on the class SGLang builds at
    run time (its multimodal processor, the model it loads), not a dotted path. Every model overrides
    these methods (``process_mm_data_async``, ``get_image_feature``) without calling a shared base, so
    the override of the served class is the one generic seam (``plugin.apply_late``)."""


@dataclass(frozen=True)
class Manifest:
    version: str
    hooks: tuple[HookEntry, ...]
    exact: bool  # False when the installed SGLang has no manifest of its own
    override: str | None = None  # the SGLANG_MMTRACE_MANIFEST file, when one replaced the packaged manifest
    absent: dict[str, str] = field(default_factory=dict)
    """The manifest's ``[absent]`` table: stage -> why this release has no target for it."""

    def for_process(self, process: str) -> list[HookEntry]:
        return [h for h in self.hooks if h.process == process]


def _parse(version: str, path: str | None = None) -> tuple[tuple[HookEntry, ...], dict[str, str]]:
    """(hooks, the ``[absent]`` table) of the packaged manifest of ``version``, or of the file ``path``."""
    if path is not None:
        with open(path, encoding="utf-8") as fh:
            text = fh.read()
    else:
        text = resources.files("sglang_mmtrace.patches").joinpath(f"sglang-{version}.toml").read_text()
    data = tomllib.loads(text)
    hooks = tuple(
        HookEntry(
            hook_id,
            h["target"],
            h["kind"],
            h["process"],
            tuple(h.get("stages", ())),
            h.get("required", True),
            h.get("applies_to"),
        )
        for hook_id, h in data["hooks"].items()
    )
    return hooks, dict(data.get("absent", {}))


def load(sglang_version: str | None) -> Manifest:
    """The manifest of this version, or of the nearest supported one not newer (else the primary).

    ``SGLANG_MMTRACE_MANIFEST=path`` replaces it with that file (a patched SGLang build, drift tests).
    """
    override = os.environ.get(ev.SGLANG_MMTRACE_MANIFEST)
    if override:
        hooks, absent = _parse("", override)
        return Manifest(sglang_version or "unknown", hooks, True, override, absent)
    if sglang_version in SUPPORTED_VERSIONS:
        hooks, absent = _parse(sglang_version)
        return Manifest(sglang_version, hooks, True, absent=absent)
    candidates = [v for v in SUPPORTED_VERSIONS if sglang_version and version_key(v) <= version_key(sglang_version)]
    base = max(candidates, key=version_key) if candidates else PRIMARY_VERSION
    hooks, absent = _parse(base)
    return Manifest(base, hooks, False, absent=absent)
