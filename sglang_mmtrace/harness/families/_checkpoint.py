"""Weight-name layout of the published checkpoints, which transformers 5 no longer writes itself.

transformers 5 drops the ``vision_model.`` level of CLIP/SigLIP towers inside a VLM when it saves
(``vision_tower.encoder...``), while the published Gemma 3 checkpoints, and SGLang's
loaders for them, have ``vision_tower.vision_model.encoder...``. transformers still reads the
published names, so the builders rename after saving and the checkpoint loads in both.
"""

from __future__ import annotations

from pathlib import Path


def nest_vision_model(out_dir: Path, tower: str = "vision_tower.") -> int:
    """Rename ``{tower}X`` to ``{tower}vision_model.X`` in ``model.safetensors``; return how many."""
    from safetensors import safe_open
    from safetensors.torch import save_file

    path = Path(out_dir) / "model.safetensors"
    nested = f"{tower}vision_model."
    flat = lambda key: key.startswith(tower) and not key.startswith(nested)  # noqa: E731
    with safe_open(path, "pt") as f:
        metadata = f.metadata()
        tensors = {k: f.get_tensor(k) for k in f.keys()}  # noqa: SIM118 (safe_open is not a mapping)
    save_file({(nested + k[len(tower) :] if flat(k) else k): v for k, v in tensors.items()}, str(path), metadata)
    return sum(map(flat, tensors))
