"""Unobserved stages and honest cache outcomes: what a record says about what the plugin did not see (issue 39)."""

from __future__ import annotations

from sglang_mmtrace.report.analysis import format_table, summarize
from sglang_mmtrace.stages import unobserved


def test_unobserved_lists_what_a_media_request_should_have_had():
    every = {"mm.process", "mm.load", "mm.decode", "mm.resize_normalize", "mm.expand", "model.vision_encoder"}
    assert unobserved(every, {"image": 1}, "off", {"image": "miss"}) == []
    assert unobserved({"mm.process"}, {"image": 1}, "off", {"image": None}) == [
        "mm.load",
        "mm.decode",
        "mm.resize_normalize",
        "mm.expand",
        "model.vision_encoder",
    ]
    # a preprocessing-cache hit skips decode and resize; an embedding-cache hit skips the encoder
    assert unobserved({"mm.process", "mm.load", "mm.expand"}, {"image": 2}, "hit", {"image": "hit"}) == []
    assert unobserved(set(), {}, "off", {}) == []  # a text request expects none of them


def test_an_audio_clip_expects_the_audio_encoder_and_an_image_the_vision_encoder():
    every = {"mm.process", "mm.load", "mm.decode", "mm.resize_normalize", "mm.expand"}
    # an audio clip whose embedding is unproved expects its encoder; the image's hit does not
    assert unobserved(every, {"image": 1, "audio": 1}, "off", {"image": "hit", "audio": None}) == [
        "model.audio_encoder"
    ]
    assert unobserved(every | {"model.audio_encoder"}, {"audio": 1}, "off", {"audio": "miss"}) == []
    assert unobserved(every, {"video": 1}, "off", {"video": "miss"}) == ["model.vision_encoder"]


def test_report_says_which_stages_were_unobserved():
    rec = {
        "status": "ok",
        "ttft_s": 0.1,
        "coverage": 1.0,
        "images": [{"visual_tokens": 4}],
        "cache": {"preprocess": "off", "embedding": None, "image_prefix_hit": False},
        "stages": [{"name": "request", "start_s": 0.0, "dur_s": 0.1, "attrs": {}}],
        "unobserved": ["mm.expand", "model.vision_encoder"],
    }
    summary = summarize([rec, {**rec, "unobserved": ["model.vision_encoder"]}], lambda r: "image")
    assert summary["image"]["unobserved"] == {"mm.expand": 1, "model.vision_encoder": 2}
    assert "UNOBSERVED (expected, not seen; their time is inside the enclosing stage): mm.expand (1 of 2)" in (
        format_table(summary)
    )
