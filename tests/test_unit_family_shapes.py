"""Real-size family shapes (the published configs, random weights) and the GPU run that used them.

The shapes are checked on the meta device (no weights are allocated): the parameter counts of the
published checkpoints. The committed GPU results (``RESULTS``) are re-read through
``summarize_families.table``.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

from sglang_mmtrace.harness.families import ensure_shape, families

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "benchmarks" / "results" / "families-gpu-20261207"


@pytest.mark.parametrize(
    ("name", "shape", "model_class", "billions"),
    [
        ("qwen2.5-vl", "qwen2.5-vl-3b", "Qwen2_5_VLForConditionalGeneration", 3.755),
        ("gemma3", "gemma-3-4b", "Gemma3ForConditionalGeneration", 4.300),
    ],
)
def test_real_size_shape_matches_published_parameter_count(name, shape, model_class, billions):
    import importlib

    import torch
    import transformers

    assert shape in families()[name].shapes and "tiny" in families()[name].shapes
    mod = importlib.import_module(f"sglang_mmtrace.harness.families.{name.replace('.', '_').replace('-', '_')}")
    config = mod.build_config(shape) if hasattr(mod, "build_config") else mod._build_config(shape)
    with torch.device("meta"):
        model = getattr(transformers, model_class)(config)
    assert sum(p.numel() for p in model.parameters()) / 1e9 == pytest.approx(billions, abs=0.001)


def test_ensure_shape_rejects_an_unknown_shape(tmp_path):
    with pytest.raises(ValueError, match="no shape"):
        ensure_shape("gemma3", tmp_path, "gemma-3-27b")


def test_committed_family_results_are_complete():
    sys.path.insert(0, str(ROOT / "benchmarks" / "gpu"))
    try:
        import summarize_families
    finally:
        sys.path.pop(0)
    paths = sorted(RESULTS.glob("families_*.json"))
    assert len(paths) == 2
    for path in paths:
        r = json.loads(path.read_text())
        assert r["records"] == r["requests"] == 24
        assert r["missing_mm_stages"] == [] and r["unobserved"] == [] and r["unobserved_field_present"]
        assert r["new_image_kinds_miss"] and r["repeats_without_encoder"] == r["repeats"] == 12
        assert r["cached_tokens_equal_usage"] == 24 and r["coverage_min"] >= 0.99
        assert r["encoder_clock"] == ["cuda"] and r["encoder_within_tol"] == r["encoder_compared"] == 10
    assert "10/10" in summarize_families.table([str(p) for p in paths])
