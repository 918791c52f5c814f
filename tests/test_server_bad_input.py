"""Bad input: SGLang answers exactly as it does without the plugin, and the plugin records it cleanly.

Two real servers, plugin on and ``SGLANG_MMTRACE=0``, get the same bad requests. Per input: the
same HTTP status and the same JSON error (keys and message, with memory addresses masked), a record
with status ``error`` and the error class (or ``ok`` where SGLang accepts the input), a good
request right after that succeeds, and afterwards no plugin state left and no contained errors.

Both servers run with ``REQUEST_TIMEOUT=5`` (SGLang's image-fetch timeout; the never-answering URL
fails in seconds) and serve a copy of the tiny model whose image processor caps images at 512x512
pixels (``size.longest_edge`` = 262144 in ``processor_config.json``; the weights are shared). With the
tiny model's own cap (16,777,216 px) an image at or above it becomes ~16k visual tokens, and on this
CPU harness the scheduler is then OOM-killed (observed with the plugin on, twice: 11.8 GB RSS); a far
larger image is resized down to that cap, so it dies the same way. With the lower cap the same request
shows what the cap is for: the image is resized and served.
The matrix goes to ``bad_input.md`` in the session's figures folder (``conftest.figures_dir``).
"""

from __future__ import annotations

import base64
import contextlib
import json
import re
import time
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import pytest
from conftest import HEALTH_TIMEOUT_S, capped_model_cache, figures_dir, read_records, records, server_context, state
from reliability import ImageHost, at_rest_problems, chat_body, post, settled_state, sse_usage

from sglang_mmtrace.cli.demo import DEMO_SERVER_ARGS
from sglang_mmtrace.config import Config
from sglang_mmtrace.harness import CpuServer, data_url, make_image

pytestmark = pytest.mark.server

ENV = {"REQUEST_TIMEOUT": "5"}
MAX_PIXELS = 512 * 512
QUESTION = {"type": "text", "text": "Bad input test: what is shown?"}
ADDRESS = re.compile(r"0x[0-9a-f]+|(?<=timeout=)[0-9.]+")  # object addresses; the time left on a timer


def _img(url: str) -> dict[str, Any]:
    return {"type": "image_url", "image_url": {"url": url}}


def _cases(host: ImageHost) -> dict[str, tuple[list[dict[str, Any]], int]]:
    """case -> (content parts, images sent)."""
    png = make_image(96, 96, seed=7301)
    return {
        "invalid base64": ([_img("data:image/png;base64,!!not*base64@@" + "A" * 30), QUESTION], 1),
        "truncated PNG": ([_img(data_url(png[: len(png) // 2])), QUESTION], 1),
        "zero-byte image": ([_img("data:image/png;base64,"), QUESTION], 1),
        "non-image file": (
            [_img("data:image/png;base64," + base64.b64encode(b"%PDF-1.4\n" * 64).decode()), QUESTION],
            1,
        ),
        "image URL 404": ([_img(host.url("/img/missing.png")), QUESTION], 1),
        "image URL never answers": ([_img(host.url("/hang/slow.png")), QUESTION], 1),
        "image 4096x4096 (64x the pixel cap)": ([_img(data_url(make_image(4096, 4096, seed=7302))), QUESTION], 1),
        "16 images": ([*[_img(data_url(make_image(64, 64, seed=7310 + k))) for k in range(16)], QUESTION], 16),
        "unknown content.type": ([{"type": "hologram", "hologram": {"url": "x"}}, QUESTION], 0),
    }


def _error_shape(status: int, raw: bytes) -> Any:
    """What must match between the two servers: the JSON error with addresses masked, or the stream's end."""
    if status == 200:
        return {"stream_ends_with_done": raw.rstrip().endswith(b"data: [DONE]"), "usage": sse_usage(raw) is not None}
    try:
        body = json.loads(raw)
    except ValueError:
        return {"non_json": ADDRESS.sub("0x?", raw.decode(errors="replace"))}
    if isinstance(body, dict) and isinstance(body.get("message"), str):
        body = {**body, "message": ADDRESS.sub("0x?", body["message"])}
    return body


@pytest.fixture(scope="module")
def servers(tmp_path_factory):
    cache = capped_model_cache(tmp_path_factory.mktemp("bad-input-model"), MAX_PIXELS)

    def make(name: str, plugin: bool) -> CpuServer:
        folder = tmp_path_factory.mktemp(name)
        srv = CpuServer(
            jsonl_path=folder / "records.jsonl",
            server_args=DEMO_SERVER_ARGS,
            log_path=folder / "server.log",
            health_timeout=HEALTH_TIMEOUT_S,
            plugin_enabled=plugin,
            cache_dir=cache,
            env=ENV,
        )
        return srv.start()

    with contextlib.ExitStack() as stack, ThreadPoolExecutor(2) as pool:
        futures = [pool.submit(make, "bad-input-on", True), pool.submit(make, "bad-input-off", False)]
        for f in futures:
            stack.callback(lambda f=f: f.exception() is None and f.result().stop())
        on, off = (f.result() for f in futures)
        yield on, off


@pytest.fixture(scope="module")
def host():
    h = ImageHost()
    yield h
    h.close()


@pytest.fixture(scope="module")
def matrix(servers, host) -> list[dict[str, Any]]:
    on, off = servers
    rows = []
    for i, (case, (content, n_images)) in enumerate(_cases(host).items()):
        row: dict[str, Any] = {"case": case, "images": n_images}
        for label, srv in (("on", on), ("off", off)):
            rid = f"bad-{i}-{label}-{int(time.time() * 1000)}"
            t0 = time.monotonic()
            status, raw = post(srv.port, chat_body(rid, content))
            row[label] = {
                "rid": rid,
                "status": status,
                "shape": _error_shape(status, raw),
                "seconds": time.monotonic() - t0,
            }
            good_rid = f"good-after-{i}-{label}-{int(time.time() * 1000)}"
            good = [_img(data_url(make_image(64, 64, seed=7400 + i))), QUESTION]
            g_status, g_raw = post(srv.port, chat_body(good_rid, good))
            row[label]["next_good"] = (g_status, sse_usage(g_raw), good_rid)
        rows.append(row)
    found = records(on, [r["on"]["next_good"][2] for r in rows], timeout=120)
    time.sleep(Config.from_env().grace_s + 1.0)  # every bad request finished before its good one
    written = {rec["rid"]: rec for rec in read_records(on.jsonl_path)}
    for row in rows:
        row["record"] = written.get(row["on"]["rid"])
        row["next_good_record"] = found[row["on"]["next_good"][2]]
    _write_figure(rows)
    return rows


def _write_figure(rows: list[dict[str, Any]]) -> None:
    lines = [
        "# Bad input: plugin on vs off (real SGLang 0.5.23, CPU, tiny Qwen3-VL)",
        "",
        f"Written by `tests/test_server_bad_input.py` on {time.strftime('%Y-%m-%d %H:%M:%S %Z')}. "
        "Both servers: `REQUEST_TIMEOUT=5`, image processor capped at 512x512 px. Error bodies compared with "
        "memory addresses and timer values masked.",
        "",
        "| input | HTTP plugin on | HTTP plugin off | same error body | record status | record error | next good request |",
        "|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        rec = r["record"]
        lines.append(
            f"| {r['case']} | {r['on']['status']} | {r['off']['status']} | {r['on']['shape'] == r['off']['shape']} "
            f"| {rec['status'] if rec else '(none)'} | {(rec or {}).get('error') or ''} "
            f"| {r['on']['next_good'][0]} / {r['off']['next_good'][0]} |"
        )
    (figures_dir() / "bad_input.md").write_text("\n".join(lines) + "\n")


def test_same_status_and_error_body_with_and_without_plugin(matrix, servers):
    diffs = [
        (r["case"], r["on"]["status"], r["off"]["status"], str(r["on"]["shape"])[:300], str(r["off"]["shape"])[:300])
        for r in matrix
        if r["on"]["status"] != r["off"]["status"] or r["on"]["shape"] != r["off"]["shape"]
    ]
    assert not diffs, f"plugin on and off answer differently: {diffs}" + server_context(servers[0])


def test_malformed_images_are_client_or_server_errors(matrix):
    """Every undecodable or unreachable image is refused (4xx/5xx); the size cases are served (200)."""
    status = {r["case"]: r["on"]["status"] for r in matrix}
    for case in ("invalid base64", "truncated PNG", "zero-byte image", "non-image file", "unknown content.type"):
        assert 400 <= status[case] < 500, (case, status[case])
    for case in ("image URL 404", "image URL never answers"):
        assert status[case] >= 400, (case, status[case])
    for case in ("image 4096x4096 (64x the pixel cap)", "16 images"):
        assert status[case] == 200, (case, status[case])
        assert matrix[[r["case"] for r in matrix].index(case)]["on"]["shape"] == {
            "stream_ends_with_done": True,
            "usage": True,
        }


def test_records_say_error_and_the_error_class(matrix, servers):
    """A refused request that reached the TokenizerManager has an ``error`` record naming the HTTP status
    and the exception class; one refused by request validation never got a rid, so it has no record."""
    problems = []
    for r in matrix:
        rec, status = r["record"], r["on"]["status"]
        if r["case"] == "unknown content.type":
            if rec is not None:
                problems.append((r["case"], "record for a request SGLang never admitted", rec))
            continue
        if rec is None:
            problems.append((r["case"], "no record"))
        elif status == 200:
            if rec["status"] != "ok" or len(rec["images"]) != r["images"] or rec["ttft_s"] is None:
                problems.append((r["case"], rec["status"], len(rec["images"])))
        elif rec["status"] != "error" or not re.fullmatch(
            rf"HTTP {status} [A-Za-z_][A-Za-z0-9_.]*", rec["error"] or ""
        ):
            problems.append((r["case"], rec["status"], rec["error"]))
    assert not problems, f"{problems}" + server_context(servers[0])


def test_pixel_limit_resizes_the_large_image(matrix):
    """The 4096x4096 image is recorded at its original size with the visual tokens of a <=512x512 one."""
    rec = next(r for r in matrix if r["case"].startswith("image 4096"))["record"]
    (image,) = rec["images"]
    assert (image["width"], image["height"]) == (4096, 4096), image
    assert 0 < image["visual_tokens"] <= (512 // 32) ** 2, image


def test_next_good_request_succeeds(matrix):
    bad = [
        (r["case"], label, r[label]["next_good"][:2])
        for r in matrix
        for label in ("on", "off")
        if r[label]["next_good"][0] != 200 or not r[label]["next_good"][1]
    ]
    assert not bad, bad
    assert all(r["next_good_record"]["status"] == "ok" for r in matrix)


def test_no_state_left_and_no_contained_errors(matrix, servers):
    st = settled_state(servers[0])
    assert not at_rest_problems(st), json.dumps(st, indent=1)
    assert st["api"]["errors"] == {} and all(p["errors"] == {} for p in st["peers"].values()), json.dumps(st, indent=1)
    assert state(servers[0])["api"]["live_requests"] == 0
