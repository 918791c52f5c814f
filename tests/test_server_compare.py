"""``sglang-mmtrace report --compare`` on records of two real SGLang servers (CPU, tiny Qwen3-VL).

Server A runs with the preprocessing cache on (the demo's 64 MB), server B with it off
(``--mm-preprocess-cache-size-mb 0``); they run one after the other, never both at once. Each gets
one untimed pair of warm-up requests, then ``ROUNDS`` rounds of a new image followed by the same
image again. The repeat is where the preprocessing cache matters: on A it hits, and decoding and
resizing do not run; on B they run again. So:
- A vs B: for the repeated image (``image: prefix-cache hit`` on both servers: the radix prefix
  holds it either way) the leading stage is ``mm.resize_normalize`` or ``mm.decode``, slower in B,
  with an interval clear of zero;
- A vs A (odd rounds against even rounds of server A, interleaved so drift of the shared machine
  falls on both halves alike), at ``--confidence 0.999``: TTFT and the leading stages of the
  repeated image are ``no change``;
- ``--html`` of A vs B renders in headless Chromium with both stacks and the delta chart drawn.

Sizes, from measurements on the shared 2-core machine. A busy neighbour moves other stages
between the two servers' runs: by 15 ms (``transport.prepare`` switches between ~4 and ~19 ms for
stretches of requests) and, when the scheduler is starved, by ~100 ms (``model.prefill``,
``scheduler.overlap_wait``). With 512 px images, decoding and resizing (~5 ms each) ranked below
such a stage in more than half of the windows tried. So the images are 2048x2048 px and both
servers serve the tiny model with its image processor capped at 512x512 px
(:func:`conftest.capped_model_cache`): the repeat's decode and resize are the full-size ones (tens
of ms each) while the encoder sees a 512 px image, so a round stays short. 12 rounds give the A/A
comparison 6 requests a side: with 4 a side, the percentile bootstrap's interval is too narrow
(TTFT came out "changed" in ~9% of the splits tried). The A/A check is TTFT and the leading
stages (the two largest leaf stages of A's repeats, and the two a cache hit skips), not every
stage: with ~20 stages each at 95%, one false "change" or more per group is the expected outcome
(every stage came out "no change" in only ~50-75% of the 6-a-side splits tried). And it asks for
99.9% intervals: at 95% even those five checks call chance a change in several percent of CI runs
(one did: a starved scheduler put a 377 ms repeat into one half, and TTFT's interval ended at
-0.29 ms). A vs B stays at the default 95%: the skipped decode and resize clear zero by far.
"""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path
from typing import Any

import pytest
from conftest import capped_model_cache, records, server_context, start_server
from peers.chromium import dump_dom, ink, parse_dom

from sglang_mmtrace.cli.main import main
from sglang_mmtrace.harness import CpuServer, data_url, image_message, make_image, stream_chat
from sglang_mmtrace.report.analysis import request_kind

pytestmark = pytest.mark.server

ROUNDS = 12
SIZE = 2048  # px: decoding and resizing well above the neighbour's noise (see above)
MAX_PIXELS = 512 * 512  # the image processor's cap: what the encoder sees
QUESTION = "Compare test: what is in this picture?"
REPEAT = "image: prefix-cache hit"
NEW = "image: encoded"
CACHE_SKIPS = {"mm.resize_normalize", "mm.decode"}  # what a preprocessing-cache hit does not run


def _ask(server: CpuServer, url: str) -> str:
    chunks, usage, _ = stream_chat(server.base_url, [image_message(QUESTION, [url])], max_tokens=4)
    assert usage is not None and chunks, "no usage in the stream" + server_context(server)
    return chunks[0]["id"]


def _rounds(server: CpuServer, urls: list[str]) -> list[tuple[dict[str, Any], dict[str, Any]]]:
    """Warm up with ``urls[0]`` (one pair, not returned), then per further URL a (new image, same image
    again) pair of records."""
    for _ in range(2):
        _ask(server, urls[0])
    rids = [(_ask(server, url), _ask(server, url)) for url in urls[1:]]
    found = records(server, [rid for pair in rids for rid in pair], timeout=60)
    return [(found[a], found[b]) for a, b in rids]


def _write(path: Path, recs: list[dict[str, Any]]) -> Path:
    path.write_text("".join(json.dumps(r) + "\n" for r in recs))
    return path


@pytest.fixture(scope="module")
def files(tmp_path_factory) -> dict[str, Path]:
    """``a``, ``b``: every measured record of server A and B; ``a_odd``, ``a_even``: A's rounds split."""
    urls = [data_url(make_image(SIZE, SIZE, seed=9800 + i)) for i in range(ROUNDS + 1)]
    cache = capped_model_cache(tmp_path_factory.mktemp("compare-model"), MAX_PIXELS)
    with start_server(tmp_path_factory, "compare-a", cache_dir=cache) as srv:  # demo arguments: preprocess cache on
        a = _rounds(srv, urls)
    off = ("--mm-preprocess-cache-size-mb", "0")
    with start_server(tmp_path_factory, "compare-b", server_args=off, cache_dir=cache) as srv:
        b = _rounds(srv, urls)
    for label, pairs in (("A", a), ("B", b)):
        kinds = Counter((request_kind(new), request_kind(again)) for new, again in pairs)
        assert kinds == {(NEW, REPEAT): ROUNDS}, f"server {label}: (new, repeat) kinds {kinds}"
    assert all(again["cache"]["preprocess"] == "hit" for _, again in a), "A: the repeat hits the preprocessing cache"
    assert all(again["cache"]["preprocess"] == "off" for _, again in b), "B: no preprocessing cache"
    folder = tmp_path_factory.mktemp("compare")
    return {
        "a": _write(folder / "a.jsonl", [r for pair in a for r in pair]),
        "b": _write(folder / "b.jsonl", [r for pair in b for r in pair]),
        "a_odd": _write(folder / "a-odd.jsonl", [r for pair in a[0::2] for r in pair]),
        "a_even": _write(folder / "a-even.jsonl", [r for pair in a[1::2] for r in pair]),
        "folder": folder,
    }


def _compare(capsys, base: Path, new: Path, *args: Any) -> tuple[dict[str, Any], str]:
    """The comparison as JSON, and the text table of the same files (for failure messages)."""
    capsys.readouterr()
    assert main(["report", "--compare", str(base), str(new), "--json", *map(str, args)]) == 0
    result = json.loads(capsys.readouterr().out)
    assert main(["report", "--compare", str(base), str(new)]) == 0
    return result, capsys.readouterr().out


def test_cache_off_ranks_decode_or_resize_first_for_the_repeated_image(files, capsys) -> None:
    result, table = _compare(capsys, files["a"], files["b"])
    assert list(result["groups"]) == [NEW, REPEAT] and not result["only_base"] and not result["only_new"], table
    g = result["groups"][REPEAT]
    assert g["n"] == {"base": ROUNDS, "new": ROUNDS}
    first = g["stages"][0]
    assert first["stage"] in CACHE_SKIPS, table
    assert first["verdict"] == "slower" and first["ci"][0] > 0.0, table
    skipped = {s["stage"]: s for s in g["stages"] if s["stage"] in CACHE_SKIPS}
    for stage, s in skipped.items():  # the hit skipped them on A: 0 ms there, their whole time in the delta
        assert s["present"] == {"base": 0, "new": ROUNDS} and s["base_p50"] == 0.0, (stage, table)
        assert s["delta_p50"] == pytest.approx(s["new_p50"]) and s["delta_p50"] > 0.0, (stage, table)
    assert g["cache"]["base"]["preprocess"]["ratio"] == 1.0 and g["cache"]["new"]["preprocess"]["lookups"] == 0
    lines = table.splitlines()
    block = lines[lines.index(f"== {REPEAT}  (n={ROUNDS} vs {ROUNDS})") :]
    row = next(line for line in block if line.startswith(f"   {first['stage']} "))
    assert row.endswith("slower"), table


def test_a_against_a_is_no_change(files, capsys) -> None:
    """Two halves of one server's rounds: the repeated image's TTFT and leading stages are "no change"
    (the module docstring says why not every stage)."""
    result, table = _compare(capsys, files["a_odd"], files["a_even"], "--confidence", "0.999")
    g = result["groups"][REPEAT]
    assert g["n"] == {"base": ROUNDS // 2, "new": ROUNDS // 2}
    leaves = sorted((s for s in g["stages"] if s["leaf"]), key=lambda s: -(s["base_p50"] + s["new_p50"]))
    leading = {s["stage"] for s in leaves[:2]} | CACHE_SKIPS
    changed = {s["stage"]: s["ci"] for s in g["stages"] if s["stage"] in leading and s["verdict"] != "no change"}
    assert g["ttft"]["verdict"] == "no change" and not changed, f"leading stages {sorted(leading)}\n{table}"


def test_compare_html_renders_in_headless_chromium(files, capsys) -> None:
    page = files["folder"] / "compare.html"
    capsys.readouterr()
    assert main(["report", "--compare", str(files["a"]), str(files["b"]), "--html", str(page)]) == 0
    non_white, colours = ink(page, files["folder"] / "compare.png")
    assert non_white > 0.03 and colours > 50, f"blank-looking screenshot: {non_white:.3f} non-white, {colours} colours"

    dom = parse_dom(dump_dom(page))
    loads = [(e.tag, e.attrs) for e in dom.iter() if {"src", "href"} & set(e.attrs)]
    assert not loads and not list(dom.iter("script")), f"a self-contained page loads nothing: {loads}"
    sections = {s.attrs["data-group"]: s for s in dom.iter("section", "group")}
    assert list(sections) == [NEW, REPEAT]
    for label, section in sections.items():
        segs = [r for r in section.iter("rect", "seg")]
        assert {r.attrs["data-side"] for r in segs} == {"base", "new"}, label
        for side in ("base", "new"):  # each side's stack is drawn (the widest group's fills the chart)
            assert sum(float(r.attrs["width"]) for r in segs if r.attrs["data-side"] == side) > 5, (label, side)
        rows = list(section.iter("g", "delta-row"))
        assert rows[0].attrs["data-stage"] == "TTFT" and len(list(section.iter("path", "ci"))) == len(rows), label
        assert all(float(b.attrs["width"]) >= 1.0 for b in section.iter("rect", "delta-bar")), label
    first = list(sections[REPEAT].iter("g", "delta-row"))[1]
    assert first.attrs["data-stage"] in CACHE_SKIPS and first.attrs["data-verdict"] == "slower"
    assert float(first.attrs["data-lo"]) > 0.0
