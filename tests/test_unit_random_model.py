"""The random-weight model builder's shapes: the real-size ones must be the published checkpoints.

The GPU runs (issue 14) time the vision encoder and prefill of ``qwen3-vl-2b``/``-4b``; those timings
only stand for the real models if the parameter counts are theirs. The counts are taken on torch's
``meta`` device (no memory, no weights), so this runs in seconds on the CPU.
"""

from __future__ import annotations

import pytest

from sglang_mmtrace.harness.families import main
from sglang_mmtrace.harness.random_model import SHAPES, _build_config, ensure_tiny_model, is_complete

# Parameter counts the model cards publish (Qwen3-VL-2B-Instruct: 2.13B, -4B-Instruct: 4.44B).
PUBLISHED = {"qwen3-vl-2b": 2.13e9, "qwen3-vl-4b": 4.44e9}


def _counts(shape: str) -> tuple[int, int, bool]:
    import torch
    from transformers import Qwen3VLForConditionalGeneration

    with torch.device("meta"):
        model = Qwen3VLForConditionalGeneration(_build_config(shape))
    total = sum(p.numel() for p in model.parameters())
    vision = sum(p.numel() for p in model.model.visual.parameters())
    tied = model.lm_head.weight is model.model.language_model.embed_tokens.weight
    return total, vision, tied


@pytest.mark.parametrize("shape", sorted(PUBLISHED))
def test_real_size_shapes_have_the_published_parameter_count(shape: str) -> None:
    total, vision, tied = _counts(shape)
    assert total == pytest.approx(PUBLISHED[shape], rel=0.005), f"{shape}: {total:,} parameters"
    assert tied, "Qwen3-VL 2B/4B tie the LM head to the embeddings"
    assert 0.40e9 < vision < 0.42e9, f"{shape}: vision tower {vision:,} (the published ViT is ~0.4B)"


def test_tiny_shape_stays_tiny() -> None:
    total, vision, tied = _counts("tiny")
    assert total < 50e6 and vision < 1e6 and not tied  # the embeddings (151936 x 128, twice) dominate


def test_shapes_keep_qwen3vl_geometry() -> None:
    """M-RoPE sections cover half a head; the vision tower feeds the text width."""
    for shape, sizes in SHAPES.items():
        text = sizes["text"]
        assert sum(text["mrope_section"]) * 2 == text["head_dim"], shape
        cfg = _build_config(shape)
        assert cfg.vision_config.out_hidden_size == cfg.text_config.hidden_size, shape
        assert max(sizes["vision"]["deepstack_visual_indexes"]) < sizes["vision"]["depth"], shape


def test_cli_leaves_a_finished_build_alone(capsys: pytest.CaptureFixture[str]) -> None:
    model = ensure_tiny_model()
    before = {p.name: p.stat().st_mtime_ns for p in model.iterdir()}
    assert main([str(model)]) == 0
    assert {p.name: p.stat().st_mtime_ns for p in model.iterdir()} == before
    assert is_complete(model) and not is_complete(model, shape="qwen3-vl-2b")
    assert "tiny seed=0" in capsys.readouterr().out


def test_unknown_shape_is_refused(tmp_path) -> None:
    from sglang_mmtrace.harness.random_model import build_qwen3vl

    with pytest.raises(ValueError, match="unknown shape"):
        build_qwen3vl(tmp_path, shape="qwen3-vl-1t")
