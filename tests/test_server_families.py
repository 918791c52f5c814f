"""Every VLM family the harness builds, on the real CPU server: complete records and no false answer.

Per family and modality it takes (issues 39 and 50): a new item, the same item again (images and audio
clips), a new video where the family takes video, and a text prompt. Each family's server is started
once for its tests (a module-scoped fixture, parametrized by family, so one server lives at a time);
Qwen3-VL uses the session's shared server. The assertions are on values SGLang reports itself (``usage``:
cached, image and audio tokens), and on what ``sglang-mmtrace doctor`` predicts from SGLang's source for
the family's model class: a new item's record lists in ``unobserved`` exactly the stages doctor says
are lost, and claims an embedding outcome only where doctor says the encoder is seen.
"""

from __future__ import annotations

import functools
import shutil
import uuid
import zlib
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import pytest
from conftest import records, server_context, start_server
from record_checks import pretty

from sglang_mmtrace import manifest_check as mc
from sglang_mmtrace.harness import CpuServer, data_url, image_message, make_image, stream_chat
from sglang_mmtrace.harness.audio import audio_data_url, audio_message, make_audio
from sglang_mmtrace.harness.families import families
from sglang_mmtrace.harness.images import make_video, video_data_url

pytestmark = pytest.mark.server

MM_STAGES = {"mm.process", "mm.load", "mm.decode", "mm.resize_normalize", "mm.expand"}
"""The processor's stages every image request has when its image missed every cache."""
ENCODER_STAGES = {"model.vision_encoder", "model.audio_encoder", "model.embed"}
ENCODER = {"image": "model.vision_encoder", "video": "model.vision_encoder", "audio": "model.audio_encoder"}


@dataclass
class Run:
    """One family's three requests: their records and SGLang's own ``usage``."""

    family: str
    server: CpuServer
    records: dict[str, dict[str, Any]]
    usage: dict[str, dict[str, Any]]

    def context(self) -> str:
        return f"\nfamily {self.family}" + server_context(self.server)


def _send(srv: CpuServer, family: str) -> Run:
    fam = families()[family]
    # items no other test sends (their content differs per family and run): a new item is new
    seed = zlib.crc32(f"{family}-{uuid.uuid4()}".encode()) % 10_000
    messages: dict[str, list[dict[str, Any]]] = {}
    if "image" in fam.modalities:
        image = data_url(make_image(256, 256, seed=seed))
        messages["new image"] = [image_message("What is in this picture?", [image])]
        messages["same image"] = [image_message("What is in this picture?", [image])]
    if "audio" in fam.modalities:
        clip = audio_data_url(make_audio(1.5, seed=seed))
        messages["new audio"] = [audio_message("What do you hear?", [clip])]
        messages["same audio"] = [audio_message("What do you hear?", [clip])]
    messages["text"] = [{"role": "user", "content": "Say something about the weather."}]
    if "video" in fam.modalities and shutil.which("ffmpeg"):
        video = video_data_url(make_video(128, 128, frames=8, seed=zlib.crc32(family.encode()) % 1000))
        messages["new video"] = [
            {
                "role": "user",
                "content": [
                    {"type": "video_url", "video_url": {"url": video}},
                    {"type": "text", "text": "What happens?"},
                ],
            }
        ]
    rids, usage = {}, {}
    for kind in messages:
        rid = f"family-{family}-{kind.replace(' ', '-')}-{uuid.uuid4().hex[:8]}"
        _, usage[kind], _ = stream_chat(srv.base_url, messages[kind], max_tokens=2, rid=rid)
        rids[kind] = rid
    found = records(srv, rids.values(), timeout=60)
    return Run(family, srv, {kind: found[rid] for kind, rid in rids.items()}, usage)


@functools.cache
def _predicted(family: str, modality: str) -> dict[str, tuple[str, str]]:
    """What ``sglang-mmtrace doctor`` predicts for a new item of ``modality`` (the installed SGLang)."""
    source = mc.installed_source("0.5.23")
    assert source is not None
    fam = families()[family]
    return mc.family_stages(mc.Tree(source), fam.architecture, (modality,), fam.model_impl, fam.vision_type)


def _lost(family: str, modality: str) -> set[str]:
    return {stage for stage, (state, _) in _predicted(family, modality).items() if state != "ok"}


def test_a_new_video_has_every_multimodal_stage_and_its_encoder_run(run: Run) -> None:
    if "video" not in families()[run.family].modalities:
        pytest.skip(f"{run.family}: SGLang's processor for it takes no video")
    if "new video" not in run.records:  # tests/run.sh installs it where it can
        pytest.skip("no ffmpeg here (apt-get install ffmpeg): SGLang's video decoder needs its libraries")
    rec, usage = run.records["new video"], run.usage["new video"]
    # model.embed is the generic routine's; the transformers backend's HF forward embeds in itself
    generic = families()[run.family].model_impl == "sglang"
    missing = (MM_STAGES | {"model.vision_encoder"} | ({"model.embed"} if generic else set())) - _stages(rec)
    assert not missing and rec["unobserved"] == [], f"{sorted(missing)} {rec['unobserved']}{run.context()}"
    by_name = {s["name"]: s for s in rec["stages"]}
    assert by_name["mm.decode"]["attrs"]["modality"] == "video" and by_name["mm.decode"]["attrs"]["frames"] > 0
    assert by_name["model.vision_encoder"]["attrs"]["modality"] == "video", by_name["model.vision_encoder"]
    assert rec["cache"]["embedding"] == "miss" and rec["status"] == "ok"
    assert rec["cached_tokens"] == usage["prompt_tokens_details"]["cached_tokens"] < usage["prompt_tokens"] - 1


@pytest.fixture(scope="module", params=sorted(families()))
def run(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Run]:
    family = request.param
    if family == "qwen3-vl":
        yield _send(request.getfixturevalue("server"), family)
        return
    # SGLang's default arguments: no preprocessing cache, so Qwen2/2.5-VL take the base processor's path
    with start_server(tmp_path_factory, f"family-{family}", server_args=(), family=family) as srv:
        yield _send(srv, family)


def _stages(record: dict[str, Any]) -> set[str]:
    return {s["name"] for s in record["stages"]}


def _encoder_ran(record: dict[str, Any], modality: str = "image") -> bool:
    return any(
        s["name"] == ENCODER[modality] and not s["attrs"].get("skipped") and s["attrs"].get("modality") == modality
        for s in record["stages"]
    )


def _cached(usage: dict[str, Any]) -> int:
    return int((usage.get("prompt_tokens_details") or {}).get("cached_tokens") or 0)


@pytest.mark.parametrize("modality", ["image", "audio"])
def test_a_new_item_shows_every_stage_doctor_predicts_and_lists_the_rest(run: Run, modality: str) -> None:
    """A new image or audio clip: every stage doctor says is seen is in the record, every stage it says
    is lost is in ``unobserved`` (no more, no fewer), the family loses what its builder declares, and
    the embedding outcome is ``miss`` where the encoder is seen and ``null`` where it is not."""
    fam = families()[run.family]
    if modality not in fam.modalities:
        pytest.skip(f"{run.family} takes no {modality}")
    rec, usage = run.records[f"new {modality}"], run.usage[f"new {modality}"]
    predicted = _predicted(run.family, modality)
    lost = _lost(run.family, modality)
    why = f"\ndoctor: {predicted}\n{pretty(rec)}{run.context()}"
    assert lost == set(fam.expected_lost), f"doctor predicts {sorted(lost)}, the builder declares {fam.expected_lost}"
    assert set(rec["unobserved"]) == lost, why
    assert set(predicted) - lost <= _stages(rec), why
    # SGLang computed the item's tokens (they were not in its radix cache)
    assert _cached(usage) < usage["prompt_tokens"] - 1, usage
    entry = rec["cache"]["modalities"][modality]
    assert entry["embedding"] == mc.predicted_embedding(predicted, modality), why
    assert _encoder_ran(rec, modality) == (entry["embedding"] == "miss"), why
    assert entry["in_prefix"] in (False, None) and rec["cache"]["image_prefix_hit"] in (False, None), why
    if modality == "image" and "mm.expand" not in lost:
        assert rec["images"] and (rec["images"][0]["width"], rec["images"][0]["height"]) == (256, 256), rec["images"]
    elif modality == "image":  # the processor's work was not seen: the record claims no image
        assert rec["images"] == [], why


def test_visual_tokens_equal_what_sglang_reports(run: Run) -> None:
    if "image" not in families()[run.family].modalities:
        pytest.skip(f"{run.family} takes no image")
    rec, usage = run.records["new image"], run.usage["new image"]
    reported = usage["prompt_tokens_details"].get("image_tokens")
    if reported is None or "mm.expand" in _lost(run.family, "image"):
        # SGLang counts none (LLaVA's items carry no offsets), or the expansion was not seen: the
        # record claims no image
        assert rec["images"] == [], (rec["images"], usage)
        return
    assert [i["visual_tokens"] for i in rec["images"]] == [reported], (rec["images"], usage)
    image_tokens = families()[run.family].image_tokens
    assert image_tokens.get(256, rec["images"][0]["visual_tokens"]) == rec["images"][0]["visual_tokens"]


@pytest.mark.parametrize("modality", ["image", "audio"])
def test_the_same_item_again_is_a_prefix_hit_and_never_a_false_encoder_run(run: Run, modality: str) -> None:
    if modality not in families()[run.family].modalities:
        pytest.skip(f"{run.family} takes no {modality}")
    rec, usage = run.records[f"same {modality}"], run.usage[f"same {modality}"]
    why = f"\n{pretty(rec)}{run.context()}"
    if _cached(usage) == 0:
        # SGLang's radix cache is off (the transformers backend turns it off for VLMs): nothing is in a
        # prefix, and the record says so; its embedding outcome is what a new item's is
        entry = rec["cache"]["modalities"][modality]
        assert rec["cache"]["image_prefix_hit"] is False and entry["in_prefix"] is False, why
        assert entry["embedding"] == mc.predicted_embedding(_predicted(run.family, modality), modality), why
        assert set(rec["unobserved"]) == _lost(run.family, modality), why
        return
    # SGLang served all but the last prompt token from its radix cache, the item included
    assert _cached(usage) == usage["prompt_tokens"] - 1, usage
    assert rec["cache"]["image_prefix_hit"] is True and not _encoder_ran(rec, modality), why
    assert rec["cache"]["modalities"][modality] == {"items": 1, "embedding": "off", "in_prefix": True}, why
    # the encoder was not needed; what else doctor says is lost stays listed
    assert set(rec["unobserved"]) == _lost(run.family, modality) - {ENCODER[modality]}, why


def test_a_text_prompt_has_no_multimodal_stage(run: Run) -> None:
    rec = run.records["text"]
    assert not (MM_STAGES | ENCODER_STAGES) & _stages(rec), _stages(rec)
    assert rec["cache"]["embedding"] == "off" and rec["unobserved"] == [] and rec["images"] == []


def test_cached_tokens_and_coverage_on_every_record(run: Run) -> None:
    for kind in run.records:
        rec, usage = run.records[kind], run.usage[kind]
        assert rec["status"] == "ok", (kind, rec["error"])
        assert rec["prompt_tokens"] == usage["prompt_tokens"], kind
        assert rec["cached_tokens"] == _cached(usage), kind
        # the whole record on failure: where the uncovered time lies (between which stages, which process)
        assert rec["coverage"] >= 0.99, f"{kind}: coverage {rec['coverage']}\n{pretty(rec)}{run.context()}"


def false_outcomes(rec: dict[str, Any], usage: dict[str, Any]) -> list[str]:
    """Every cache outcome of the record that its own evidence does not prove: a ``hit`` whose items'
    first lookups did not all find them, an ``off`` for an item outside the matched prefix (by SGLang's
    offsets, and with SGLang's own ``usage`` reporting cached tokens), a ``miss`` with no encoder run or
    failed lookup."""
    problems = []
    match = next((s for s in rec["stages"] if s["name"] == "scheduler.prefix_match"), None)
    placement = (match or {}).get("attrs", {}).get("placement") or {}
    embeds = [s["attrs"].get("items") or {} for s in rec["stages"] if s["name"] == "model.embed"]
    for modality, entry in (rec["cache"].get("modalities") or {}).items():
        outcome = entry["embedding"]
        proved = [e[modality] for e in embeds if modality in e]
        if outcome == "hit" and not (proved and all(n == h > 0 for n, h, _ in proved)):
            problems.append(f"{modality}: hit without a lookup that found every item ({proved})")
        if outcome == "off":
            items, inside, unplaced = placement.get(modality, (0, 0, 0))
            if not (items and inside == items and not unplaced and _cached(usage) > 0):
                problems.append(f"{modality}: off for an item outside the matched prefix ({placement}, {usage})")
        if outcome == "miss" and not (_encoder_ran(rec, modality) or any(m > 0 for _, _, m in proved)):
            problems.append(f"{modality}: miss without an encoder run or a lookup that missed")
    return problems


def test_no_record_claims_an_outcome_its_evidence_does_not_prove(run: Run) -> None:
    for kind, rec in run.records.items():
        assert not false_outcomes(rec, run.usage[kind]), (
            f"{kind}: {false_outcomes(rec, run.usage[kind])}\n{pretty(rec)}"
        )
