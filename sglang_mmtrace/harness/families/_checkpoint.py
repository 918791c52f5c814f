"""Weight-name layout of the published checkpoints, which transformers 5 no longer writes itself.

transformers 5 drops the ``vision_model.`` level of CLIP/SigLIP towers inside a VLM when it saves
(``vision_tower.encoder...``), while the published Gemma 3 checkpoints, and SGLang's
loaders for them, have ``vision_tower.vision_model.encoder...``. transformers still reads the
published names, so the builders rename after saving and the checkpoint loads in both.
"""

from __future__ import annotations

import json
from pathlib import Path

INDEX_NAME = "model.safetensors.index.json"


def nest_vision_model(out_dir: Path, tower: str = "vision_tower.") -> int:
    """Rename ``{tower}X`` to ``{tower}vision_model.X`` in the saved weights; return how many.

    One ``model.safetensors``, or every shard of a sharded save (a real-size model) and its index.
    """
    from safetensors import safe_open
    from safetensors.torch import save_file

    out_dir = Path(out_dir)
    nested = f"{tower}vision_model."
    flat = lambda key: key.startswith(tower) and not key.startswith(nested)  # noqa: E731
    rename = lambda key: nested + key[len(tower) :] if flat(key) else key  # noqa: E731
    index_path = out_dir / INDEX_NAME
    index = json.loads(index_path.read_text(encoding="utf-8")) if index_path.exists() else None
    files = sorted(set(index["weight_map"].values())) if index else ["model.safetensors"]
    renamed = 0
    for name in files:
        path = out_dir / name
        with safe_open(path, "pt") as f:
            metadata = f.metadata()
            keys = list(f.keys())
            if not any(map(flat, keys)):
                continue
            tensors = {k: f.get_tensor(k) for k in keys}
        save_file({rename(k): v for k, v in tensors.items()}, str(path), metadata)
        renamed += sum(map(flat, keys))
    if index:
        index["weight_map"] = {rename(k): v for k, v in index["weight_map"].items()}
        index_path.write_text(json.dumps(index, indent=2, sort_keys=True) + "\n", encoding="utf-8")
    return renamed
