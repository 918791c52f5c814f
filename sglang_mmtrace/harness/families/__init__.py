"""Tiny random-weight checkpoints of the VLM families SGLang serves, one builder per family.

Each family module defines ``FAMILY``: a ``Family`` whose ``build(out_dir, seed)`` writes a complete
checkpoint offline (config, bf16 weights, tokenizer with the family's real special-token ids,
processor with its real settings, chat template), small enough for the CPU server. ``ensure`` caches
one build per family, seed and builder version, as ``random_model.ensure_tiny_model`` does for
Qwen3-VL (which is the family ``qwen3-vl`` here). A family may also list real-size ``shapes`` (the
published configuration of a checkpoint, random weights) for GPU timing: ``ensure_shape`` builds one
into a given folder, initialised on the GPU where there is one (``main``).

    python -m sglang_mmtrace.harness.families OUT_DIR [--family qwen2.5-vl] [--shape qwen2.5-vl-3b] [--device cuda]

builds into OUT_DIR unless a finished build of that family, shape and seed is already there.
"""

from __future__ import annotations

import argparse
import importlib
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ..random_model import MARKER_NAME, cached_build, default_cache_dir, ensure_tiny_model

TINY_TEXT: dict[str, Any] = {
    "hidden_size": 128,
    "intermediate_size": 256,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
}
"""The text model's sizes every tiny family shares (Qwen3-VL's, ``random_model.SHAPES``): small enough
for the CPU server, the family's own structure (heads, KV heads) kept."""


@dataclass(frozen=True)
class Family:
    """One VLM family as the harness builds and serves it."""

    name: str
    """The family's short name (``qwen2.5-vl``): the tests' parameter, ``doctor``'s model column."""
    architecture: str
    """The checkpoint's ``architectures[0]``: the SGLang model class that serves it."""
    builder_version: str
    """Bumped when the build output changes, so cached builds are rebuilt."""
    build: Callable[..., None]
    """``build(out_dir, seed)`` writes the tiny checkpoint into an empty folder (deterministic for a seed;
    offline); a family with more ``shapes`` also takes ``shape=`` and ``device=`` (where to initialise)."""
    modalities: tuple[str, ...] = ("image",)
    """What the family's SGLang processor accepts on the CPU server (``image``, ``video``, ``audio``)."""
    server_args: tuple[str, ...] = ()
    """Extra SGLang flags the family needs on the CPU server."""
    expected_lost: tuple[str, ...] = ()
    """The stages a new item of this family loses (``doctor``'s prediction, which the tests check against
    its records), each for a reason its ``notes`` give: empty for a family the plugin covers fully."""
    vision_type: str | None = None
    """The checkpoint's ``vision_config.model_type`` (``pixtral``): SGLang picks some processors by it."""
    model_impl: str = "sglang"
    """SGLang's ``--model-impl`` the family is served with (``transformers``: the transformers backend,
    whose flag is then among ``server_args``); ``doctor``'s prediction depends on it."""
    notes: str = ""
    """What differs from the published checkpoints (sizes aside), for the README's family table."""
    image_tokens: dict[int, int] = field(default_factory=dict)
    """Image side (px, square) -> visual tokens, as the family's processor expands it (tests check it)."""
    shapes: tuple[str, ...] = ("tiny",)
    """The sizes ``build`` knows: ``tiny`` (the CPU server's, the default) and real-size ones named after
    the published checkpoint whose config.json they copy (``qwen2.5-vl-3b``), for GPU timing."""


MODULES: tuple[str, ...] = (
    "qwen2_5_vl",
    "qwen2_vl",
    "internvl",
    "mistral3",
    "glm4v",
    "gemma3",
    "qwen2_audio",
    "gemma4",
    "llava",
    "llava_hf",
    "qwen2_vl_transformers",
)
"""The family modules of this package, in the order the README lists them."""


def families() -> dict[str, Family]:
    """Every family the harness can build, by name (Qwen3-VL first)."""
    out: dict[str, Family] = {}
    for mod in ("qwen3_vl", *MODULES):
        fam: Family = importlib.import_module(f"{__name__}.{mod}").FAMILY
        out[fam.name] = fam
    return out


def _marker(fam: Family, seed: int) -> str:
    return f"{fam.builder_version} seed={seed}"


def is_complete(model_dir: Path, fam: Family, seed: int = 0) -> bool:
    """True when ``model_dir`` holds a finished build of this family, builder version and seed."""
    try:
        return (Path(model_dir) / MARKER_NAME).read_text(encoding="utf-8").strip() == _marker(fam, seed)
    except OSError:
        return False


def _shape_marker(fam: Family, shape: str, seed: int) -> str:
    return _marker(fam, seed) if shape == "tiny" else f"{fam.builder_version} {shape} seed={seed}"


def ensure_shape(name: str, out_dir: Path, shape: str = "tiny", seed: int = 0, device: str | None = None) -> Path:
    """``out_dir``, holding a finished build of family ``name`` at ``shape`` (built there first unless one is).

    The GPU scripts' way to get a model: one folder per family and shape, no cache or lock (a
    one-user machine). Real-size shapes are initialised on ``device`` (default: ``cuda`` when there is
    one: a 4B model's random init takes minutes on a CPU, seconds on a GPU).
    """
    out_dir = Path(out_dir)
    if name == "qwen3-vl":
        from ..random_model import build_qwen3vl
        from ..random_model import is_complete as qwen3_complete

        if not qwen3_complete(out_dir, seed, shape):
            build_qwen3vl(out_dir, seed=seed, shape=shape, device=device)
        return out_dir
    fam = families()[name]
    if shape not in fam.shapes:
        raise ValueError(f"family {name} has no shape {shape!r}; one of {', '.join(fam.shapes)}")
    marker = out_dir / MARKER_NAME
    try:
        if marker.read_text(encoding="utf-8").strip() == _shape_marker(fam, shape, seed):
            return out_dir
    except OSError:
        pass
    out_dir.mkdir(parents=True, exist_ok=True)
    marker.unlink(missing_ok=True)
    if shape == "tiny":
        fam.build(out_dir, seed)
    else:
        fam.build(out_dir, seed, shape=shape, device=device)
    marker.write_text(_shape_marker(fam, shape, seed) + "\n", encoding="utf-8")
    return out_dir


def ensure_family_model(name: str, cache_dir: Path | None = None, seed: int = 0) -> Path:
    """A finished build of family ``name`` in the cache, built first if needed.

    The build goes to a temporary sibling and is renamed into place, so readers never see a
    partial model; a lock makes parallel test workers build it once.
    """
    if name == "qwen3-vl":  # its own builder's cache entry, shared with the GPU scripts' shapes
        return ensure_tiny_model(cache_dir, seed)
    fam = families()[name]
    cache = Path(cache_dir) if cache_dir is not None else default_cache_dir()

    def build(out: Path) -> None:
        fam.build(out, seed)
        (out / MARKER_NAME).write_text(_marker(fam, seed) + "\n", encoding="utf-8")

    return cached_build(cache, f"tiny-{name.replace('.', '')}-seed{seed}", lambda d: is_complete(d, fam, seed), build)


def main(argv: list[str] | None = None) -> int:
    """Build OUT_DIR (the GPU scripts' one way to get a model) unless a finished build is there.

    ``--family`` (default ``qwen3-vl``) picks the family and ``--shape`` one of its shapes (``tiny`` or a
    real size such as ``qwen3-vl-2b``).
    """
    ap = argparse.ArgumentParser(description="Build a random-weight VLM checkpoint offline (Qwen3-VL by default).")
    ap.add_argument("out_dir", type=Path)
    ap.add_argument("--family", default="qwen3-vl", help="a harness family (sglang_mmtrace.harness.families)")
    ap.add_argument("--shape", default="tiny", help="tiny or a real size of the family (qwen3-vl-2b, qwen2.5-vl-3b)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--device", default=None, help="where to initialize the weights (default: see ensure_shape)")
    args = ap.parse_args(argv)
    known = families()
    if args.family not in known:
        ap.error(f"unknown family {args.family!r}; one of {', '.join(known)}")
    if args.shape not in known[args.family].shapes:
        ap.error(f"unknown shape {args.shape!r}; one of {', '.join(known[args.family].shapes)}")
    ensure_shape(args.family, args.out_dir, args.shape, args.seed, args.device)
    print(f"{args.out_dir}: {(args.out_dir / MARKER_NAME).read_text(encoding='utf-8').strip()}")
    return 0
