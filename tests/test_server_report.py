"""``sglang-mmtrace report`` on records of real requests to the real SGLang server (CPU, tiny Qwen3-VL).

The module sends one set of requests (a new image, the same image again, text only, two images,
two new images at once, a malformed image, and a text request whose rid and bench labels are
HTML), writes their records twice (plain, as the server wrote them, and with the ``bench`` key
``sglang-mmtrace bench`` adds), and checks the three outputs against the records:
- the table groups by bench experiment/variant (or by request kind for plain records);
- ``--chrome-trace`` obeys the Trace Event Format and holds one slice per stage per request;
- ``--html`` renders in headless Chromium with the breakdown, waterfalls and cache sections.
"""

from __future__ import annotations

import json
import statistics
import time
import urllib.error
import urllib.request
from collections import Counter, defaultdict
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import pytest
from conftest import records, server_context
from peers.chromium import dump_dom, ink, parse_dom

from sglang_mmtrace.cli.main import main
from sglang_mmtrace.harness import chat_request, data_url, image_message, make_image, stream_chat
from sglang_mmtrace.report.analysis import exclusive_times, is_ok, quantile, request_kind
from sglang_mmtrace.report.chrome_trace import PROCESS_PIDS
from sglang_mmtrace.stages import DISPLAY_ORDER

pytestmark = pytest.mark.server

QUESTION = "Report test: what is in this picture?"
HOSTILE_RID = 'report-<script>alert("rid")</script>&<b>'
HOSTILE_EXPERIMENT = "<img src=x onerror=alert(1)>"
SEEDS = iter(range(9700, 9800))  # seeds no other test module uses: every "new" image is new to the server


def _image() -> str:
    return data_url(make_image(256, 256, seed=next(SEEDS)))


def _post(port: int, rid: str, messages: list[dict[str, Any]]) -> tuple[int, float]:
    """A streamed chat request with the caller's rid (stream_chat lets the server pick one)."""
    body = chat_request(messages, 4, rid=rid)
    req = urllib.request.Request(
        f"http://127.0.0.1:{port}/v1/chat/completions",
        data=json.dumps(body).encode(),
        headers={"Content-Type": "application/json"},
    )
    t0 = time.perf_counter()
    try:
        with urllib.request.urlopen(req, timeout=120) as resp:
            resp.read()
            return resp.status, time.perf_counter() - t0
    except urllib.error.HTTPError as exc:
        return exc.code, time.perf_counter() - t0


def _chat(server, messages: list[dict[str, Any]]) -> tuple[str, float]:
    t0 = time.perf_counter()
    chunks, usage, _ = stream_chat(server.base_url, messages, max_tokens=4)
    assert usage is not None and chunks, "no usage in the stream" + server_context(server)
    return chunks[0]["id"], time.perf_counter() - t0


@pytest.fixture(scope="module")
def sent(server, tmp_path_factory) -> dict[str, Any]:
    """Send the requests; write ``plain.jsonl`` and ``bench.jsonl``; return paths and what was sent."""
    a = _image()
    rows: list[tuple[str, str, str, bool, float]] = []  # rid, experiment, variant, ok, client e2e

    def add(experiment: str, variant: str, rid_e2e: tuple[str, float], ok: bool = True) -> None:
        rows.append((rid_e2e[0], experiment, variant, ok, rid_e2e[1]))

    add("new-vs-repeat", "new", _chat(server, [image_message(QUESTION, [a])]))
    add("new-vs-repeat", "repeat", _chat(server, [image_message(QUESTION, [a])]))
    add("mixed", "text", _chat(server, [{"role": "user", "content": "Report test: say hello."}]))
    add("mixed", "two-images", _chat(server, [image_message(QUESTION, [_image(), _image()])]))
    urls = [_image(), _image()]
    with ThreadPoolExecutor(2) as pool:
        for result in pool.map(lambda u: _chat(server, [image_message(QUESTION, [u])]), urls):
            add("concurrency", "2", result)
    status, e2e = _post(server.port, "report-bad-image", [image_message(QUESTION, ["data:image/png;base64,AAAA%%%"])])
    assert status == 400, f"malformed image answered HTTP {status}" + server_context(server)
    add("errors", "bad-image", ("report-bad-image", e2e), ok=False)
    status, e2e = _post(server.port, HOSTILE_RID, [{"role": "user", "content": "Report test: escape me."}])
    assert status == 200, f"hostile rid answered HTTP {status}" + server_context(server)
    add(HOSTILE_EXPERIMENT, "<i>v</i>", (HOSTILE_RID, e2e))

    found = records(server, [r[0] for r in rows], timeout=60)
    folder = tmp_path_factory.mktemp("report")
    plain, bench = folder / "plain.jsonl", folder / "bench.jsonl"
    with plain.open("w") as fp, bench.open("w") as fb:
        for rid, experiment, variant, ok, e2e in rows:
            rec = found[rid]
            fp.write(json.dumps(rec) + "\n")
            extra = {"experiment": experiment, "variant": variant, "client_ttft_s": None, "client_e2e_s": e2e}
            fb.write(json.dumps({**rec, "bench": {**extra, "ok": ok, "error": None if ok else "HTTP 400"}}) + "\n")
    groups: dict[str, list[dict[str, Any]]] = defaultdict(list)
    for rid, experiment, variant, _, _ in rows:
        groups[f"{experiment} / {variant}"].append(found[rid])
    return {"plain": plain, "bench": bench, "folder": folder, "records": found, "groups": dict(groups)}


def _worked(rec: dict[str, Any]) -> list[dict[str, Any]]:
    """The stages that were work (a ``skipped`` encoder marker is not)."""
    return [s for s in rec["stages"] if not s["attrs"].get("skipped")]


def _report(capsys, *args: str) -> str:
    capsys.readouterr()
    assert main(["report", *map(str, args)]) == 0
    return capsys.readouterr().out


# -- the table ------------------------------------------------------------------------------------


def test_table_groups_by_bench_experiment_and_variant(sent, capsys) -> None:
    summary = json.loads(_report(capsys, sent["bench"], "--json"))
    assert list(summary) == list(sent["groups"]), "one group per experiment / variant, in the order sent"
    for label, recs in sent["groups"].items():
        g = summary[label]
        ok = [r for r in recs if r["status"] == "ok"]
        assert (g["n"], g["failed"]) == (len(ok), len(recs) - len(ok)), label
        if not ok:
            continue
        ttfts = sorted(r["ttft_s"] for r in ok)
        assert g["ttft_p50"] == pytest.approx(quantile(ttfts, 0.5)), label
        assert g["ttft_p95"] == pytest.approx(quantile(ttfts, 0.95)), label
        assert set(g["stages"]) == {s["name"] for r in ok for s in _worked(r)}, label
        assert g["coverage_min"] == min(r["coverage"] for r in ok), label
        prefix = [r["cache"]["image_prefix_hit"] for r in ok if r["images"]]
        assert g["cache"]["image_prefix"]["ratio"] == (statistics.mean(prefix) if prefix else None), label
        assert g["cache"]["prefix_tokens"]["cached"] == sum(r["cached_tokens"] for r in ok), label
    # what the server did, as the report shows it: the repeated image came from the radix cache
    assert summary["new-vs-repeat / repeat"]["cache"]["image_prefix"]["ratio"] == 1.0
    assert summary["new-vs-repeat / new"]["cache"]["image_prefix"]["ratio"] == 0.0
    assert "model.vision_encoder" in summary["new-vs-repeat / new"]["stages"]
    assert "model.vision_encoder" not in summary["new-vs-repeat / repeat"]["stages"]
    assert summary["errors / bad-image"] == {"n": 0, "failed": 1, "no_record": 0, "stages": {}}

    # exclusive stage times (the stacked breakdown) add up to the part of TTFT the collector says is covered
    for rec in sent["records"].values():
        if rec["ttft_s"]:
            covered = rec["coverage"] * rec["ttft_s"]
            assert sum(exclusive_times(rec).values()) == pytest.approx(covered, rel=1e-6, abs=1e-6), rec["rid"]

    table = _report(capsys, sent["bench"])
    for label, g in summary.items():
        assert f"== {label}  (n={g['n']}" in table


def test_table_groups_plain_records_by_request_kind(sent, capsys) -> None:
    summary = json.loads(_report(capsys, sent["plain"], "--json"))
    ok = [r for r in sent["records"].values() if r["status"] == "ok"]
    kinds = Counter(request_kind(r) for r in sent["records"].values())
    assert set(summary) == set(kinds)
    for kind, n in kinds.items():
        assert summary[kind]["n"] + summary[kind]["failed"] == n, kind
    new, repeat = sent["groups"]["new-vs-repeat / new"][0], sent["groups"]["new-vs-repeat / repeat"][0]
    assert request_kind(new) == "image: encoded" and request_kind(repeat) == "image: prefix-cache hit"
    assert sum(g["n"] for g in summary.values()) == len(ok)


# -- the Chrome trace -----------------------------------------------------------------------------


def _ns(us: float) -> int:
    return round(us * 1000)


def test_chrome_trace_obeys_trace_event_format(sent, capsys) -> None:
    out = sent["folder"] / "trace.json"
    _report(capsys, sent["bench"], "--chrome-trace", out)
    trace = json.loads(out.read_text())
    assert trace["displayTimeUnit"] == "ms"
    events = trace["traceEvents"]
    missing = [e for e in events if not all(k in e for k in ("name", "ph", "ts", "pid", "tid"))]
    assert not missing, missing[:3]
    names = {(e["pid"], e["args"]["name"]) for e in events if e["ph"] == "M" and e["name"] == "process_name"}
    assert names == {(pid, process) for process, pid in PROCESS_PIDS.items()}
    slices = [e for e in events if e["ph"] == "X"]
    assert all(e["dur"] >= 0 for e in slices)

    # slices on one thread nest without partial overlap (compared in integer ns)
    lanes: dict[tuple[int, int], list[tuple[int, int, str]]] = defaultdict(list)
    for e in slices:
        lanes[(e["pid"], e["tid"])].append((_ns(e["ts"]), _ns(e["ts"] + e["dur"]), e["name"]))
    for key, items in lanes.items():
        items.sort(key=lambda s: (s[0], -s[1]))
        open_ends: list[tuple[int, str]] = []
        for start, end, name in items:
            while open_ends and open_ends[-1][0] <= start:
                open_ends.pop()
            assert not open_ends or open_ends[-1][0] >= end, f"{key}: {name} overlaps {open_ends[-1][1]} partially"
            open_ends.append((end, name))

    # one slice per stage per request, rid in args, on its process's track, at arrival + start_s
    timed = [r for r in sent["records"].values() if r["stages"]]
    base = min(r["arrival_unix_s"] for r in timed)
    by_rid: dict[str, list[dict[str, Any]]] = defaultdict(list)
    for e in slices:
        by_rid[e["args"]["rid"]].append(e)
    assert set(by_rid) == {r["rid"] for r in timed}
    for rec in timed:
        got = by_rid[rec["rid"]]
        assert len(got) == len(rec["stages"]), rec["rid"]
        assert Counter((e["name"], e["pid"]) for e in got) == Counter(
            (s["name"], PROCESS_PIDS[s["process"]]) for s in rec["stages"]
        ), rec["rid"]
        if rec["ttft_s"] is None:  # the malformed image: stages up to the rejection, no first token
            assert "request" not in {e["name"] for e in got}, rec["rid"]
            continue
        root = next(e for e in got if e["name"] == "request")
        assert abs(root["ts"] - (rec["arrival_unix_s"] - base) * 1e6) < 1.0
        assert abs(root["dur"] - rec["ttft_s"] * 1e6) < 1.0
    # the two concurrent requests overlap in time, so they must sit on different threads
    c1, c2 = (next(e for e in by_rid[r["rid"]] if e["name"] == "request") for r in sent["groups"]["concurrency / 2"])
    assert c1["ts"] < c2["ts"] + c2["dur"] and c2["ts"] < c1["ts"] + c1["dur"], (
        "the concurrent requests did not overlap"
    )
    assert c1["tid"] != c2["tid"]


# -- the HTML page in headless Chromium -----------------------------------------------------------


def test_html_renders_in_headless_chromium(sent, capsys) -> None:
    page = sent["folder"] / "report.html"
    _report(capsys, sent["bench"], "--html", page)

    non_white, colours = ink(page, sent["folder"] / "report.png")
    assert non_white > 0.05 and colours > 50, f"blank-looking screenshot: {non_white:.3f} non-white, {colours} colours"

    dom = parse_dom(dump_dom(page))
    sections = {s.attrs.get("id"): s for s in dom.iter("section")}
    assert {"breakdown", "waterfalls", "cache", "coverage"} <= set(sections)
    assert not list(dom.iter("script")) and not list(dom.iter("img")), "hostile strings must not become elements"
    loads = [(e.tag, e.attrs) for e in dom.iter() if {"src", "href"} & set(e.attrs)]
    assert not loads, f"a self-contained page loads nothing: {loads}"
    text = dom.text_content()
    assert HOSTILE_RID in text and HOSTILE_EXPERIMENT in text, "hostile strings are shown as text"

    timed = {label: [r for r in recs if r["status"] == "ok"] for label, recs in sent["groups"].items()}
    timed = {label: recs for label, recs in timed.items() if recs}
    # breakdown: one stacked bar per group with timed requests, stages in catalogue order
    bars = {b.attrs["data-group"]: b for b in sections["breakdown"].iter("div", "bar")}
    assert list(bars) == list(timed)
    for label, bar in bars.items():
        segs = [(r.attrs["data-stage"], float(r.attrs["data-ms"])) for r in bar.iter("rect", "seg")]
        stages = [s for s, _ in segs if s != "unattributed"]
        assert stages == sorted(stages, key=DISPLAY_ORDER.__getitem__), label
        present = {s["name"] for r in timed[label] for s in r["stages"]}
        assert set(stages) <= present, label
        if len(timed[label]) == 1:  # one request: its stages partition its TTFT, and the stack ends on it
            rec = timed[label][0]
            assert sum(ms for _, ms in segs) == pytest.approx(rec["ttft_s"] * 1e3, rel=0.01), label
            encoder = [s["dur_s"] * 1e3 for s in _worked(rec) if s["name"] == "model.vision_encoder"]
            assert [ms for s, ms in segs if s == "model.vision_encoder"] == pytest.approx(encoder), label
    # waterfalls: the fastest, median and slowest request per group, one row per stage of its record
    by_rid = {r["rid"]: r for r in sent["records"].values()}
    groups = {g.attrs["data-group"]: g for g in sections["waterfalls"].iter("div", "wf-group")}
    assert list(groups) == list(timed)
    for label, group in groups.items():
        shown = list(group.iter("div", "waterfall"))
        assert len(shown) == min(3, len(timed[label])), label
        assert {w.attrs["data-rid"] for w in shown} <= {r["rid"] for r in timed[label]}, label
        for w in shown:
            rows = [row.attrs["data-stage"] for row in w.iter("g", "wf-row")]
            assert Counter(rows) == Counter(s["name"] for s in by_rid[w.attrs["data-rid"]]["stages"]), label
    # cache hit ratios: four bars per group, each the ratio the records give
    cache_rows = {row.attrs["data-group"]: row for row in sections["cache"].iter("tr") if "data-group" in row.attrs}
    assert list(cache_rows) == list(timed)
    for label, row in cache_rows.items():
        ratios = {b.attrs["data-cache"]: b.attrs["data-ratio"] for b in row.iter("rect", "cache-bar")}
        assert set(ratios) == {"preprocess", "embedding", "image_prefix", "prefix_tokens"}, label
        ok = timed[label]
        for cache in ("preprocess", "embedding"):
            looked_up = [r["cache"][cache] == "hit" for r in ok if r["cache"][cache] in ("hit", "miss")]
            expected = f"{statistics.mean(looked_up):.6f}" if looked_up else ""
            assert ratios[cache] == expected, (label, cache)
        with_images = [r["cache"]["image_prefix_hit"] for r in ok if r["images"]]
        assert ratios["image_prefix"] == (f"{statistics.mean(with_images):.6f}" if with_images else ""), label
    repeat = {
        b.attrs["data-cache"]: b.attrs["data-ratio"]
        for b in cache_rows["new-vs-repeat / repeat"].iter("rect", "cache-bar")
    }
    assert repeat["image_prefix"] == "1.000000", "the repeated image came from the radix cache"
    # coverage: one dot per timed request
    dots = len(list(sections["coverage"].iter("circle", "cov-dot")))
    assert dots == sum(len(v) for v in timed.values()) == sum(1 for r in sent["records"].values() if is_ok(r))
