"""Cache outcomes from evidence only (``join.outcomes``, issue 50): every combination of what was and
was not observed, against the truth table written out independently here."""

from __future__ import annotations

import itertools

import pytest

from sglang_mmtrace.join.outcomes import Embedding, Evidence, Placement, combine, decide, modality_embedding

PLACEMENTS = [
    None,  # admission not seen
    Placement(1, 0, 0),  # placed, outside the prefix
    Placement(1, 1, 0),  # placed, inside
    Placement(1, 0, 1),  # not placed
    Placement(2, 1, 0),  # one inside, one outside
    Placement(2, 1, 1),  # one inside, one not placed
]
EMBEDDINGS = [
    None,  # no forward embedded the modality (or its routine is not the generic one)
    Embedding(0, 0, 0, False),
    Embedding(1, 0, 0, False),  # needed, nothing proved (no lookup seen, encoder not hooked)
    Embedding(1, 1, 0, False),  # first lookup found it, encoder hooked and silent
    Embedding(1, 0, 1, False),  # first lookup found nothing
    Embedding(1, 0, 0, True),  # an encoder call took it
    Embedding(2, 1, 0, False),  # one proved hit, one unproved
    Embedding(2, 1, 1, False),  # one hit, one miss
    Embedding(2, 2, 0, False),  # both hits (a chunked item's two forwards)
]


def expected(p: Placement | None, e: Embedding | None) -> str | None:
    """The truth table, row by row, as the contract states it."""
    if e is not None and (e.encoded or e.miss):
        return "miss"
    if p is not None and p.items and not p.unplaced and p.in_prefix == p.items:
        return "off"
    if e is not None and e.needed and e.hit == e.needed:
        return "hit"
    return None


@pytest.mark.parametrize(("p", "e"), list(itertools.product(PLACEMENTS, EMBEDDINGS)))
def test_each_modality_follows_the_truth_table(p: Placement | None, e: Embedding | None) -> None:
    outcome, reason = modality_embedding(p, e)
    assert outcome == expected(p, e)
    assert (reason is None) == (outcome is not None)  # a null always says why


def _hit_evidence(e: Embedding | None) -> bool:
    return e is not None and e.hit > 0


@pytest.mark.parametrize(("p", "e"), list(itertools.product(PLACEMENTS, EMBEDDINGS)))
def test_never_a_hit_without_a_lookup_that_found_the_item(p: Placement | None, e: Embedding | None) -> None:
    """The property the issue asks for: ``hit`` only with an observed lookup that found the entry for
    every needed item, and ``off`` only for items placed inside the matched prefix."""
    outcome, _ = modality_embedding(p, e)
    if outcome == "hit":
        assert e is not None and e.hit == e.needed > 0 and not e.encoded and not e.miss
    if outcome == "off":
        assert p is not None and p.in_prefix == p.items > 0 and not p.unplaced
    if e is None or (not e.hit and not e.miss and not e.encoded):
        assert outcome in (None, "off")  # silence proves nothing


def test_the_request_combines_its_modalities() -> None:
    values = ["hit", "miss", "off", None]
    for combo in itertools.product(values, repeat=2):
        got = combine(list(combo))
        if "miss" in combo:
            assert got == "miss"
        elif None in combo:
            assert got is None
        elif combo == ("off", "off"):
            assert got == "off"
        else:
            assert got == "hit"


def test_a_new_audio_clip_beside_a_hooked_image_encoder_is_not_a_hit() -> None:
    """Gemma 4's false ``hit``: the audio clip's lookup found nothing (or was never seen), so whatever
    the image encoder's hook says, the clip is a miss, or unproved."""
    ev = Evidence({"audio": 1}, {"audio": Placement(1, 0, 0)}, {"audio": Embedding(1, 0, 1)})
    assert decide(ev).embedding == "miss"
    silent = Evidence({"audio": 1}, {"audio": Placement(1, 0, 0)}, {})
    out = decide(silent)
    assert out.embedding is None and "audio" in out.reasons["embedding"]
    assert out.modalities["audio"] == {
        "items": 1,
        "embedding": None,
        "in_prefix": False,
        "reason": "no embedding-cache lookup or encoder call was observed for its items",
    }


def test_a_model_with_its_own_forward_is_null_not_off_and_its_prefix_hit_is_seen() -> None:
    """LLaVA through SGLang's llava.py: no generic routine, so no lookup and no hooked encoder. A new
    image is null (was: ``off``); the same image again, placed inside the prefix by its pad values, is
    a prefix hit with nothing to embed (was: ``image_prefix_hit = false``)."""
    new = decide(Evidence({"image": 1}, {"image": Placement(1, 0, 0)}, {}))
    assert new.embedding is None and new.image_prefix_hit is False
    again = decide(Evidence({"image": 1}, {"image": Placement(1, 1, 0)}, {}))
    assert again.embedding == "off" and again.image_prefix_hit is True
    unplaced = decide(Evidence({"image": 1}, {"image": Placement(1, 0, 1)}, {}))
    assert unplaced.embedding is None and unplaced.image_prefix_hit is None
    assert set(unplaced.reasons) == {"embedding", "image_prefix_hit"}


def test_a_text_request_needed_no_embedding_and_hit_no_prefix() -> None:
    out = decide(Evidence({}, None, {}))
    assert (out.embedding, out.image_prefix_hit, out.reasons, out.modalities) == ("off", False, {}, {})
    assert out.as_record() == {"preprocess": "off", "embedding": "off", "image_prefix_hit": False}


def test_the_preprocessing_outcome() -> None:
    assert decide(Evidence({"image": 1}, None, {}, ("hit", "miss"))).preprocess == "miss"
    assert decide(Evidence({"image": 1}, None, {}, ("hit",))).preprocess == "hit"
    assert decide(Evidence({"image": 1}, None, {}, ())).preprocess == "off"
