def test_unobserved_lists_what_a_media_request_should_have_had():
    from sglang_mmtrace.stages import unobserved

    every = {"mm.process", "mm.load", "mm.decode", "mm.resize_normalize", "mm.expand", "model.vision_encoder"}
    assert unobserved(every, 1, "off", "miss") == []
    assert unobserved({"mm.process"}, 1, "off", None) == [
        "mm.load",
        "mm.decode",
        "mm.resize_normalize",
        "mm.expand",
        "model.vision_encoder",
    ]
    # a preprocessing-cache hit skips decode and resize; an embedding-cache hit skips the encoder
    assert unobserved({"mm.process", "mm.load", "mm.expand"}, 2, "hit", "hit") == []
    assert unobserved(set(), 0, "off", "off") == []  # a text request expects none of them


def test_the_embedding_outcome_is_never_a_hit_without_evidence():
    from sglang_mmtrace.join.collector import _embedding_outcome

    assert _embedding_outcome(True, set()) == "miss"
    assert _embedding_outcome(False, {"hit"}) == "hit"
    assert _embedding_outcome(False, {"unobserved"}) is None
    assert _embedding_outcome(False, set()) == "off"
