"""Records of real image requests on the real SGLang server (CPU, tiny Qwen3-VL, plugin on).

The module sends one fixed sequence of requests once (cache state matters: a repeated image must
follow its first request) and then checks each record two ways:
- per case, what that case must show (stage set, cache outcomes, images, attributes);
- per request, what every successful record must satisfy (tokens equal to SGLang's ``usage``,
  image fields, transport, catalogue fields, intervals inside ``[0, ttft_s]``, causal order,
  coverage).
Images use seeds no other test module uses, so every "new" image is new to the shared server.
"""

from __future__ import annotations

import http.server
import json
import math
import socket
import threading
import time
import urllib.request
from collections import Counter
from typing import Any

import pytest
from conftest import read_records, records, server_context
from record_checks import (
    CORE_STAGES,
    ENCODER_STAGES,
    IMAGE_WORK_STAGES,
    MM_STAGES,
    TRANSPORT_STAGES,
    Exchange,
    Img,
    bounds_problems,
    catalogue_problems,
    exchange_problems,
    image_cache,
    names,
    one,
    order_problems,
    pretty,
    prompt_layout,
    stage_set_problems,
    stages_named,
    visual_tokens,
)
from reliability import chat_body, get, post

from sglang_mmtrace.harness import data_url, image_message, make_image, stream_chat

pytestmark = pytest.mark.server

Q1 = "What is in this image?"
Q_IMAGE_FIRST = ("Describe the colours you can see.", "Which shape is the largest one?")
Q_QUESTION_FIRST = ("Count the shapes in the picture:", "Name the brightest region here:")
TEXT_ONLY = "Records test: say something short about the weather."

# label -> number of requests of that case, in sending order (also the parametrize ids)
CASES: dict[str, int] = {
    "new_image": 1,
    "same_image_again": 1,
    "different_image_same_question": 1,
    "image_first_other_question": len(Q_IMAGE_FIRST),
    "question_first_new_question": len(Q_QUESTION_FIRST),
    "question_first_repeated": 1,
    "text_only": 1,
    "two_images": 1,
    "png": 1,
    "jpeg": 1,
    "image_url": 1,
    "image_1024x768": 1,
    "chunked_prefill": 1,
}
ALL = [(label, i) for label, n in CASES.items() for i in range(n)]
ALL_IDS = [f"{label}-{i}" for label, i in ALL]


def chunk_size(server) -> int:
    """SGLang's ``--chunked-prefill-size`` as the server runs it (its default depends on the machine)."""
    with urllib.request.urlopen(f"{server.base_url}/server_info", timeout=30) as resp:
        return int(json.load(resp)["chunked_prefill_size"])


def _img(width: int, height: int, seed: int, fmt: str = "PNG") -> Img:
    return Img(width, height, fmt, make_image(width, height, seed=seed, fmt=fmt))


class _ImageHandler(http.server.BaseHTTPRequestHandler):
    files: dict[str, bytes] = {}
    hits: list[str] = []

    def do_GET(self) -> None:  # noqa: N802 (http.server API)
        type(self).hits.append(self.path)
        body = self.files.get(self.path)
        if body is None:
            self.send_error(404)
            return
        self.send_response(200)
        self.send_header("Content-Type", "image/png")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, format: str, *args: Any) -> None:  # keep pytest output clean
        pass


@pytest.fixture(scope="module")
def image_host():
    """A local ``http.server`` thread serving images by path.

    SGLang fetches ``http(s)`` image URLs itself; ``--allowed-media-domains`` is empty by default,
    which SGLang documents as "remote media from any domain is allowed" (``_assert_media_url_allowed``
    only rejects hosts when the allowlist is non-empty), so 127.0.0.1 needs no server flag.
    """

    class Handler(_ImageHandler):
        files: dict[str, bytes] = {}
        hits: list[str] = []

    httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=httpd.serve_forever, name="image-host", daemon=True)
    thread.start()
    try:
        yield httpd, Handler
    finally:
        httpd.shutdown()
        httpd.server_close()


@pytest.fixture(scope="module")
def exchanges(server, image_host) -> dict[str, list[Exchange]]:
    httpd, handler = image_host
    a = _img(512, 512, seed=7001)
    b = _img(512, 512, seed=7002)
    c, d = _img(256, 256, seed=7003), _img(512, 512, seed=7004)
    png, jpeg = _img(512, 512, seed=7005), _img(512, 512, seed=7006, fmt="JPEG")
    hosted = _img(256, 256, seed=7007)
    big = _img(1024, 768, seed=7008)
    chunked = _img(256, 256, seed=7009)
    long_question = "Chunked prefill check: " + "word " * (chunk_size(server) * 3 // 2)  # ~1.5 chunks
    handler.files["/hosted.png"] = hosted.data
    url = f"http://127.0.0.1:{httpd.server_address[1]}/hosted.png"

    plan: list[tuple[str, list[dict[str, Any]], list[Img]]] = [
        ("new_image", [image_message(Q1, [data_url(a.data)])], [a]),
        ("same_image_again", [image_message(Q1, [data_url(a.data)])], [a]),
        ("different_image_same_question", [image_message(Q1, [data_url(b.data)])], [b]),
        *[("image_first_other_question", [image_message(q, [data_url(a.data)])], [a]) for q in Q_IMAGE_FIRST],
        *[
            ("question_first_new_question", [image_message(q, [data_url(a.data)], image_first=False)], [a])
            for q in Q_QUESTION_FIRST
        ],
        (
            "question_first_repeated",
            [image_message(Q_QUESTION_FIRST[0], [data_url(a.data)], image_first=False)],
            [a],
        ),
        ("text_only", [{"role": "user", "content": TEXT_ONLY}], []),
        ("two_images", [image_message(Q1, [data_url(c.data), data_url(d.data)])], [c, d]),
        ("png", [image_message(Q1, [data_url(png.data, "PNG")])], [png]),
        ("jpeg", [image_message(Q1, [data_url(jpeg.data, "JPEG")])], [jpeg]),
        ("image_url", [image_message(Q1, [url])], [hosted]),
        ("image_1024x768", [image_message(Q1, [data_url(big.data)])], [big]),
        ("chunked_prefill", [image_message(long_question, [data_url(chunked.data)])], [chunked]),
    ]
    out: dict[str, list[Exchange]] = {}
    for label, messages, images in plan:
        try:
            chunks, usage, raw = stream_chat(server.base_url, messages, max_tokens=4)
            assert usage is not None, "no usage chunk in the stream"
            ex = Exchange(label, messages, images, chunks[0]["id"], usage, raw)
        except (AssertionError, OSError, RuntimeError) as exc:  # fail that case's tests, not the module
            ex = Exchange(label, messages, images, "", {}, b"", failure=f"{type(exc).__name__}: {exc}")
        out.setdefault(label, []).append(ex)
    assert {k: len(v) for k, v in out.items()} == CASES
    found = records(server, [ex.rid for exs in out.values() for ex in exs if ex.failure is None])
    for exs in out.values():
        for ex in exs:
            ex.record = found.get(ex.rid, {})
    return out


@pytest.fixture
def case(exchanges, server):
    """``case(label)`` -> that case's exchanges; a request that failed fails the test asking for it."""

    def get(label: str) -> list[Exchange]:
        failed = [ex.failure for ex in exchanges[label] if ex.failure]
        assert not failed, f"{label}: request failed: {failed}" + server_context(server)
        return exchanges[label]

    return get


def _fail(problems: list[str], *exs: Exchange) -> str:
    return "\n".join(problems) + "\n" + "\n\n".join(ex.describe() for ex in exs)


def _check(problems: list[str], *exs: Exchange) -> None:
    assert not problems, _fail(problems, *exs)


# -- per request: what every successful record must satisfy -----------------------------------


@pytest.mark.parametrize(("label", "i"), ALL, ids=ALL_IDS)
def test_record_matches_usage_images_and_transport(case, server, label, i):
    """status ok; prompt/cached/output tokens == usage; image_prefix_hit == (cached covers the
    image token span); images[] sizes, visual tokens, encoded bytes; transport cpu with the pixel bytes."""
    ex = case(label)[i]
    _check(exchange_problems(ex, str(server.model_path)), ex)


@pytest.mark.parametrize(("label", "i"), ALL, ids=ALL_IDS)
def test_stage_fields_match_catalogue(case, label, i):
    ex = case(label)[i]
    _check(catalogue_problems(ex.record), ex)


@pytest.mark.parametrize(("label", "i"), ALL, ids=ALL_IDS)
def test_stage_intervals_inside_ttft(case, label, i):
    """Every stage lies inside [0, ttft_s]: the breakdown explains TTFT, nothing after it."""
    ex = case(label)[i]
    _check(bounds_problems(ex.record), ex)


@pytest.mark.parametrize(("label", "i"), ALL, ids=ALL_IDS)
def test_stages_nest_and_follow_the_request_path(case, label, i):
    """Nesting from the catalogue's parent field (mm.* in mm.process in tokenize, transport.prepare
    in dispatch, model.* in model.forward) and siblings starting in request-path order
    (http.parse, openai.convert, tokenize, dispatch, scheduler.*, model.forward, scheduler.output,
    detokenize, response.first_chunk)."""
    ex = case(label)[i]
    _check(order_problems(ex.record), ex)


@pytest.mark.parametrize(("label", "i"), ALL, ids=ALL_IDS)
def test_coverage(case, label, i):
    """Successful image requests: the stages explain at least 95% of TTFT; coverage is consistent."""
    ex = case(label)[i]
    rec = ex.record
    assert rec["ttft_s"] and rec["ttft_s"] > 0, ex.describe()
    assert rec["attributed_s"] == pytest.approx(rec["coverage"] * rec["ttft_s"], abs=1e-5), ex.describe()
    if ex.images:
        assert rec["coverage"] >= 0.95, ex.describe()


# -- per case ---------------------------------------------------------------------------------


def test_new_image(case):
    (ex,) = case("new_image")
    rec = ex.record
    _check(stage_set_problems(rec, absent=()), ex)  # every core stage happens for a new image
    assert rec["cache"] == image_cache("miss", "miss", False), ex.describe()
    vit = stages_named(rec, "model.vision_encoder")
    assert all(s["attrs"]["embedding_cache"] == "miss" and s["attrs"]["skipped"] is False for s in vit), ex.describe()
    assert sum(s["attrs"]["images"] for s in vit) == 1, ex.describe()
    assert one(rec, "mm.preprocess_cache")["attrs"]["result"] == "miss"
    assert one(rec, "mm.load")["attrs"]["bytes"] == len(ex.images[0].data)
    assert {k: one(rec, "mm.decode")["attrs"][k] for k in ("width", "height")} == {"width": 512, "height": 512}
    assert one(rec, "model.embed")["attrs"]["embedding_cache"] == "miss"


def test_same_image_again(case):
    (first,), (ex,) = case("new_image"), case("same_image_again")
    rec = ex.record
    # Preprocessing-cache hit: no pixel work; the whole image is in the radix prefix: no encoder, no injection.
    _check(stage_set_problems(rec, absent=IMAGE_WORK_STAGES | ENCODER_STAGES), ex)
    assert rec["cache"]["preprocess"] == "hit" and rec["cache"]["image_prefix_hit"] is True, ex.describe()
    # inside the radix prefix, placed by its offsets: nothing to embed (the evidence, not a silence)
    assert rec["cache"]["embedding"] == "off" and rec["cache"]["modalities"]["image"]["in_prefix"] is True, (
        ex.describe()
    )
    assert rec["cache"]["embedding"] != "miss", ex.describe()
    assert one(rec, "mm.preprocess_cache")["attrs"]["result"] == "hit"
    assert rec["images"][0]["content_hash"] == first.record["images"][0]["content_hash"], _fail([], first, ex)
    assert rec["cached_tokens"] > first.record["cached_tokens"], _fail([], first, ex)


def test_different_image_same_question(case):
    (first,), (ex,) = case("new_image"), case("different_image_same_question")
    rec = ex.record
    _check(stage_set_problems(rec, absent=()), ex)
    assert rec["cache"] == image_cache("miss", "miss", False), ex.describe()
    assert rec["images"][0]["content_hash"] != first.record["images"][0]["content_hash"], _fail([], first, ex)


def test_image_first_other_questions_hit_the_image_prefix(case, server):
    """Image first, new question: the prefix runs through <|vision_end|>, so the image's KV is reused."""
    for ex in case("image_first_other_question"):
        rec = ex.record
        _check(stage_set_problems(rec, absent=IMAGE_WORK_STAGES | ENCODER_STAGES), ex)
        assert rec["cache"]["image_prefix_hit"] is True and rec["cache"]["preprocess"] == "hit", ex.describe()
        assert rec["cache"]["embedding"] != "miss", ex.describe()
        mp = str(server.model_path)
        _, spans = prompt_layout(mp, ex.messages, [visual_tokens(mp, 512, 512)])
        # the question differs from every earlier one: the cache ends between the image and the prompt's end
        assert spans[0][1] < rec["cached_tokens"] < rec["prompt_tokens"], ex.describe()


def test_question_first_new_question_uses_embedding_cache(case, server):
    """Question first, new question: the image's KV cannot be reused (image_prefix_hit False), but its
    embedding comes from SGLang's multimodal embedding cache: no vision encoder, an embed stage that says hit."""
    for ex in case("question_first_new_question"):
        rec = ex.record
        _check(stage_set_problems(rec, absent=IMAGE_WORK_STAGES | {"model.vision_encoder"}), ex)
        assert rec["cache"] == image_cache("hit", "hit", False), ex.describe()
        assert one(rec, "model.embed")["attrs"]["embedding_cache"] == "hit", ex.describe()
        mp = str(server.model_path)
        _, spans = prompt_layout(mp, ex.messages, [visual_tokens(mp, 512, 512)])
        assert rec["cached_tokens"] <= spans[0][0], ex.describe()


def test_question_first_repeated_hits_the_image_prefix(case):
    (ex,) = case("question_first_repeated")
    rec = ex.record
    _check(stage_set_problems(rec, absent=IMAGE_WORK_STAGES | ENCODER_STAGES), ex)
    assert rec["cache"]["image_prefix_hit"] is True, ex.describe()


def test_text_only(case):
    (ex,) = case("text_only")
    rec = ex.record
    _check(stage_set_problems(rec, absent=MM_STAGES | TRANSPORT_STAGES | ENCODER_STAGES), ex)
    assert not any(n.startswith("mm.") for n in names(rec)), ex.describe()
    assert rec["images"] == [] and rec["transport"] == {"mode": "none", "bytes": 0}, ex.describe()
    assert rec["cache"] == {"preprocess": "off", "embedding": "off", "image_prefix_hit": False}, ex.describe()


def test_two_images_in_one_request(case, server):
    (ex,) = case("two_images")
    rec = ex.record
    _check(stage_set_problems(rec, absent=()), ex)
    small, large = ex.images
    assert len(stages_named(rec, "mm.load")) == 2 and len(stages_named(rec, "mm.decode")) == 2, ex.describe()
    assert Counter(s["attrs"]["bytes"] for s in stages_named(rec, "mm.load")) == Counter(
        [len(small.data), len(large.data)]
    ), ex.describe()
    assert Counter((s["attrs"]["width"], s["attrs"]["height"]) for s in stages_named(rec, "mm.decode")) == Counter(
        [(small.width, small.height), (large.width, large.height)]
    ), ex.describe()
    # images[] in request order, each with its own size, visual tokens and bytes
    mp = str(server.model_path)
    assert [(i["width"], i["visual_tokens"], i["bytes"]) for i in rec["images"]] == [
        (small.width, visual_tokens(mp, small.width, small.height), len(small.data)),
        (large.width, visual_tokens(mp, large.width, large.height), len(large.data)),
    ], ex.describe()
    expand = one(rec, "mm.expand")["attrs"]
    assert expand["images"] == 2 and expand["visual_tokens"] == sum(i["visual_tokens"] for i in rec["images"])
    assert rec["images"][0]["content_hash"] != rec["images"][1]["content_hash"]


@pytest.mark.parametrize(("label", "magic"), [("png", b"\x89PNG\r\n\x1a\n"), ("jpeg", b"\xff\xd8\xff")])
def test_png_and_jpeg(case, label, magic):
    (ex,) = case(label)
    rec = ex.record
    assert ex.images[0].data.startswith(magic)  # the input really is that format
    _check(stage_set_problems(rec, absent=()), ex)
    decode = one(rec, "mm.decode")["attrs"]
    assert (decode["width"], decode["height"]) == (512, 512), ex.describe()
    assert rec["images"][0]["bytes"] == len(ex.images[0].data) == one(rec, "mm.load")["attrs"]["bytes"]


def test_image_url_from_local_http_server(case, image_host):
    _, handler = image_host
    (ex,) = case("image_url")
    rec = ex.record
    assert handler.hits.count("/hosted.png") == 1, f"SGLang fetched {handler.hits}"
    _check(stage_set_problems(rec, absent=()), ex)
    assert rec["images"][0]["bytes"] == len(ex.images[0].data) == one(rec, "mm.load")["attrs"]["bytes"]
    # the URL itself is content: never in the record unless SGLANG_MMTRACE_CAPTURE_CONTENT=1
    assert "hosted.png" not in repr(rec), ex.describe()


def test_image_1024x768(case, server):
    (ex,) = case("image_1024x768")
    rec = ex.record
    _check(stage_set_problems(rec, absent=()), ex)
    assert rec["images"][0]["visual_tokens"] == 1024 * 768 // 1024, ex.describe()
    assert (rec["images"][0]["width"], rec["images"][0]["height"]) == (1024, 768)
    decode = one(rec, "mm.decode")["attrs"]
    assert (decode["width"], decode["height"]) == (1024, 768), ex.describe()


def test_chunked_prefill(case, server):
    """A prompt longer than SGLang's ``--chunked-prefill-size`` is prefilled in chunks, one forward
    each, the next chunk launched before the last one's result is processed (overlap scheduling).
    Every stage still comes once (the contract), and the forward's stages say how many parts they
    hold (``chunks``, ``chunks_s``). The image sits in the first chunk: the encoder and the embedding
    injection run there alone, and say so by having no parts."""
    (ex,) = case("chunked_prefill")
    rec = ex.record
    size = chunk_size(server)
    assert rec["prompt_tokens"] - rec["cached_tokens"] > size, ex.describe()  # the case really chunks
    _check(stage_set_problems(rec, absent=()), ex)
    n = math.ceil((rec["prompt_tokens"] - rec["cached_tokens"]) / size)
    for name in ("model.forward", "model.prefill", "model.sample"):
        stage = one(rec, name)
        assert stage["attrs"].get("chunks") == n, f"{name}: {stage['attrs']}\n" + ex.describe()
        assert 0 < stage["attrs"]["chunks_s"] <= stage["dur_s"] + 1e-9, ex.describe()
    for name in ("model.vision_encoder", "model.embed", "scheduler.batch", "scheduler.output"):
        assert "chunks" not in one(rec, name)["attrs"], ex.describe()
    assert rec["cache"] == image_cache("miss", "miss", False), ex.describe()


def test_parallel_sampling_gives_each_sample_a_whole_record(server):
    """``n=2``: SGLang tokenizes the prompt under a rid it never sends, runs a prefix request
    (``max_new_tokens=0``) and then the two samples, each under a new rid (the stream's chunk ids).
    Each sample's record has the prompt's API stages and its own tokens, as ``usage`` counts them;
    the prefix request's record is marked ``warmup`` (it ran the encoder); the exchange makes no
    other record (before, the prompt's rids made two empty ``ok`` records without a TTFT)."""
    img = _img(256, 256, seed=7010)
    chunks, usage, _ = stream_chat(server.base_url, [image_message(Q1, [data_url(img.data)])], max_tokens=4, n=2)
    sample_rids = sorted({c["id"] for c in chunks})
    assert len(sample_rids) == 2 and usage is not None, chunks
    found = records(server, sample_rids)
    arrival = found[sample_rids[0]]["arrival_unix_s"]
    exchange = [r for r in read_records(server.jsonl_path) if r["arrival_unix_s"] == arrival]
    warm = [r for r in exchange if r["rid"] not in found]
    assert len(exchange) == 3 and len(warm) == 1 and warm[0].get("warmup") is True, [r["rid"] for r in exchange]
    assert "model.vision_encoder" in names(warm[0]) and warm[0]["output_tokens"] == 0
    for rid in sample_rids:
        rec = found[rid]
        assert rec["status"] == "ok" and not rec.get("warmup") and rec["ttft_s"] > 0, pretty(rec)
        assert {"tokenize", "mm.process", "mm.decode", "mm.resize_normalize", "dispatch"} <= set(names(rec)), pretty(
            rec
        )
        assert (rec["prompt_tokens"], rec["cached_tokens"]) == (
            usage["prompt_tokens"],
            usage["prompt_tokens_details"]["cached_tokens"],
        ), pretty(rec)
        assert rec["cache"]["preprocess"] == "miss" and rec["images"][0]["width"] == 256, pretty(rec)
        assert not bounds_problems(rec) and not order_problems(rec), pretty(rec)
    assert sum(found[r]["output_tokens"] for r in sample_rids) == usage["completion_tokens"]


def test_contract_stage_catalogue_is_what_the_cases_cover(exchanges, server):
    """Across the cases, every core (non-extra) stage shows up at least once (no dead stage in the catalogue)."""
    seen = {n for exs in exchanges.values() for ex in exs if ex.failure is None for n in names(ex.record)}
    missing = sorted(CORE_STAGES - seen)
    assert not missing, f"core stages never recorded: {missing}" + server_context(server)


def test_warmup_requests_are_marked_and_no_other(server, exchanges):
    """SGLang's own start-up request (sent while its server status is "Starting", the JIT-bound first
    request) and a request sent with ``X-Mmtrace-Warmup: 1`` carry ``"warmup": true``; the requests
    this module sent without the header do not. (Other modules' bench runs on this shared server send
    their own warm-ups with the header, so the file may hold more marked records.)"""
    from sglang_mmtrace.bench.client import timed_chat

    messages = [image_message("What is in this picture?", [data_url(make_image(48, 40, seed=913))])]
    out = timed_chat(server.base_url, messages, max_tokens=2, warmup=True)
    assert records(server, [out["id"]])[out["id"]]["warmup"] is True
    first = read_records(server.jsonl_path)[0]  # SGLang answers /health only after its warm-up: it comes first
    assert first.get("warmup") is True and first["status"] == "ok", server_context(server)
    ours = [ex for exs in exchanges.values() for ex in exs if not ex.failure]
    assert len(ours) > 10 and all("warmup" not in ex.record for ex in ours)


# -- media fetch and failures (issue 50 item 6) ----------------------------------------------------


def _failure_count(server, stage: str, error_type: str) -> float:
    """``sglang_mmtrace_stage_failures_total{stage, modality="image", error_type}`` on the server's /metrics."""
    from prometheus_client.parser import text_string_to_metric_families

    status, body = get(server.port, "/metrics")
    assert status == 200, status
    want = {"stage": stage, "modality": "image", "error_type": error_type}
    return sum(
        sample.value
        for family in text_string_to_metric_families(body.decode())
        for sample in family.samples
        if sample.name == "sglang_mmtrace_stage_failures_total" and want.items() <= sample.labels.items()
    )


def test_image_url_download_is_its_own_stage_with_the_file_size(server, image_host):
    """An image sent by URL: SGLang's HTTP download of it is ``mm.download``, inside ``mm.load``, with
    exactly the served file's bytes; the URL is in no part of the record."""
    httpd, handler = image_host
    img = _img(160, 120, seed=7021)
    handler.files["/download-stage.png"] = img.data
    url = f"http://127.0.0.1:{httpd.server_address[1]}/download-stage.png"
    chunks, usage, _ = stream_chat(server.base_url, [image_message(Q1, [url])], max_tokens=4)
    assert chunks and usage is not None, server_context(server)
    rid = chunks[0]["id"]
    rec = records(server, [rid])[rid]
    assert handler.hits.count("/download-stage.png") == 1, handler.hits
    download = one(rec, "mm.download")
    assert download["attrs"] == {"bytes": len(img.data), "modality": "image"}, pretty(rec)
    load = one(rec, "mm.load")
    assert load["start_s"] <= download["start_s"], pretty(rec)
    assert download["start_s"] + download["dur_s"] <= load["start_s"] + load["dur_s"] + 1e-9, pretty(rec)
    assert rec["status"] == "ok" and rec["failures"] == [], pretty(rec)
    assert "download-stage" not in repr(rec), pretty(rec)


def test_unreachable_image_url_is_a_counted_download_failure(server):
    """An image URL nothing listens on: SGLang refuses the request; its record says which stage failed
    with which exception class (never the message, which names the URL), and the failure counter on
    /metrics goes up by one for that stage and class."""
    with socket.socket() as sock:  # a loopback port that was free a moment ago: connection refused
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    before = _failure_count(server, "mm.download", "ConnectionError")
    rid = f"unreachable-image-{int(time.time() * 1000)}"
    content = [
        {"type": "image_url", "image_url": {"url": f"http://127.0.0.1:{port}/nowhere-{rid}.png"}},
        {"type": "text", "text": Q1},
    ]
    status, raw = post(server.port, chat_body(rid, content))
    assert status >= 400, (status, raw[:300])
    rec = records(server, [rid])[rid]
    assert rec["status"] == "error", pretty(rec)
    assert rec["failures"] == [{"stage": "mm.download", "modality": "image", "error_type": "ConnectionError"}], pretty(
        rec
    )
    assert "mm.download" not in names(rec) and "nowhere" not in repr(rec), pretty(rec)
    deadline = time.monotonic() + 30
    while _failure_count(server, "mm.download", "ConnectionError") < before + 1 and time.monotonic() < deadline:
        time.sleep(0.5)
    assert _failure_count(server, "mm.download", "ConnectionError") == before + 1, server_context(server)
