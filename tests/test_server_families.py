"""Every VLM family the harness builds, on the real CPU server: complete records and no false answer.

Per family: a new image, the same image again, a text prompt, and a new video where the family takes
video (issue 39). Each family's server is
started once for its tests (a module-scoped fixture, parametrized by family, so one server lives at
a time); Qwen3-VL uses the session's shared server. The assertions are on values SGLang reports
itself: ``usage`` (cached and image tokens) and whether the image was in the radix prefix.
"""

from __future__ import annotations

import shutil
import uuid
import zlib
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import pytest
from conftest import records, server_context, start_server
from record_checks import pretty

from sglang_mmtrace.harness import CpuServer, data_url, image_message, make_image, stream_chat
from sglang_mmtrace.harness.families import families
from sglang_mmtrace.harness.images import make_video, video_data_url

pytestmark = pytest.mark.server

MM_STAGES = {"mm.process", "mm.load", "mm.decode", "mm.resize_normalize", "mm.expand"}
"""The processor's stages every image request has when its image missed every cache."""
ENCODER_STAGES = {"model.vision_encoder", "model.embed"}


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
    # an image no other test sends (its content differs per family and run): a new image is new
    image = data_url(make_image(256, 256, seed=zlib.crc32(f"{family}-{uuid.uuid4()}".encode()) % 10_000))
    messages = {
        "new image": [image_message("What is in this picture?", [image])],
        "same image": [image_message("What is in this picture?", [image])],
        "text": [{"role": "user", "content": "Say something about the weather."}],
    }
    if "video" in families()[family].modalities and shutil.which("ffmpeg"):
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


def test_a_new_video_has_every_multimodal_stage_and_its_encoder_run(run: Run) -> None:
    if "video" not in families()[run.family].modalities:
        pytest.skip(f"{run.family}: SGLang's processor for it takes no video")
    if "new video" not in run.records:  # tests/run.sh installs it where it can
        pytest.skip("no ffmpeg here (apt-get install ffmpeg): SGLang's video decoder needs its libraries")
    rec, usage = run.records["new video"], run.usage["new video"]
    missing = (MM_STAGES | ENCODER_STAGES) - _stages(rec)
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


def _encoder_ran(record: dict[str, Any]) -> bool:
    return any(s["name"] == "model.vision_encoder" and not s["attrs"].get("skipped") for s in record["stages"])


def test_a_new_image_has_every_multimodal_stage_and_a_cache_miss(run: Run) -> None:
    rec, usage = run.records["new image"], run.usage["new image"]
    missing = (MM_STAGES | ENCODER_STAGES) - _stages(rec)
    assert not missing, f"{sorted(missing)}{run.context()}"
    assert rec["unobserved"] == [], run.context()
    # SGLang computed the image's tokens (they were not in its radix cache): the encoder ran
    assert usage["prompt_tokens_details"]["cached_tokens"] < usage["prompt_tokens"] - 1, usage
    assert _encoder_ran(rec) and rec["cache"]["embedding"] == "miss", rec["cache"]
    assert rec["cache"]["image_prefix_hit"] is False
    assert rec["images"] and rec["images"][0]["width"] == 256 and rec["images"][0]["height"] == 256, rec["images"]


def test_visual_tokens_equal_what_sglang_reports(run: Run) -> None:
    rec, usage = run.records["new image"], run.usage["new image"]
    assert [i["visual_tokens"] for i in rec["images"]] == [usage["prompt_tokens_details"]["image_tokens"]], (
        rec["images"],
        usage,
    )
    image_tokens = families()[run.family].image_tokens
    assert image_tokens.get(256, rec["images"][0]["visual_tokens"]) == rec["images"][0]["visual_tokens"]


def test_the_same_image_again_is_a_prefix_hit_and_never_a_false_encoder_run(run: Run) -> None:
    rec, usage = run.records["same image"], run.usage["same image"]
    # SGLang served all but the last prompt token from its radix cache, image included
    assert usage["prompt_tokens_details"]["cached_tokens"] == usage["prompt_tokens"] - 1, usage
    assert rec["cache"]["image_prefix_hit"] is True and not _encoder_ran(rec), rec["cache"]
    assert rec["cache"]["embedding"] != "miss" and rec["unobserved"] == [], run.context()
    assert _stages(rec) >= {"mm.process", "mm.load", "mm.expand"}


def test_a_text_prompt_has_no_multimodal_stage(run: Run) -> None:
    rec = run.records["text"]
    assert not (MM_STAGES | ENCODER_STAGES) & _stages(rec), _stages(rec)
    assert rec["cache"]["embedding"] == "off" and rec["unobserved"] == [] and rec["images"] == []


def test_cached_tokens_and_coverage_on_every_record(run: Run) -> None:
    for kind in run.records:
        rec, usage = run.records[kind], run.usage[kind]
        assert rec["status"] == "ok", (kind, rec["error"])
        assert rec["prompt_tokens"] == usage["prompt_tokens"], kind
        assert rec["cached_tokens"] == usage["prompt_tokens_details"]["cached_tokens"], kind
        # the whole record on failure: where the uncovered time lies (between which stages, which process)
        assert rec["coverage"] >= 0.99, f"{kind}: coverage {rec['coverage']}\n{pretty(rec)}{run.context()}"
