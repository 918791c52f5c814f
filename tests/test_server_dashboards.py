"""Every PromQL query of the dashboard, and the shipped Prometheus rules, against real data.

A real ``prometheus`` (Debian package) scrapes a real CPU server every second and loads
``docker/prometheus/rules/``. The server is this module's own, so that the plugin-health panels
have something to show: its OTLP endpoint is a closed port (spans are dropped:
``dropped_total{sink="otlp"}``) and the test-only switch makes one hook's plugin code raise
(``errors_total{component=INJECTED}``, the ``mm.resize_normalize`` stage goes missing and nothing
else). After a short load (new images, repeated images, a different image, text, in two rounds)
each panel query, with the template variables at "All" and ``$__rate_interval`` spanning the load,
must return at least one series with a finite value; a query that legitimately has none on the
CPU must be named in ``NO_DATA_ON_CPU`` with the reason.
"""

from __future__ import annotations

import math
import re
import sys
import time
import urllib.parse
from pathlib import Path
from typing import Any

import pytest
from conftest import records, server_context, start_server
from peers.prometheus import PrometheusServer, free_port, require_tools
from reliability import ImageHost, chat_body, post

from sglang_mmtrace.harness import CpuServer, data_url, image_message, make_image, stream_chat
from sglang_mmtrace.sinks.prometheus import PREFIX

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "tools"))
import generate_grafana_dashboards as gen  # noqa: E402

pytestmark = pytest.mark.server

RULES = sorted((REPO / "docker" / "prometheus" / "rules").glob("*.yml"))
INJECTED = "mm_processor.resize_normalize"
ROUNDS = 2
HEALTH_TIMEOUT_S = 180.0  # dropped spans are counted once the exporter gives up on the closed port
_NO_CUDA = "the cuda_ipc transport needs CUDA: the CPU server has no cuda_ipc pool"
NO_DATA_ON_CPU: dict[tuple[str, str], str] = {
    ("Feature transport: bytes in flight", "B"): _NO_CUDA,
    ("Feature transport: bytes in flight", "C"): _NO_CUDA,
    ("Shared-memory segments in flight; cuda_ipc fallbacks/s", "B"): _NO_CUDA,
}
"""(panel title, refId) -> why the CPU server legitimately gives it no series."""
MAY_BE_ABSENT = {
    "detokenize.inbox_wait": "joined gap: exists only when the detokenizer picked the hand-off up after it was sent",
    "response.inbox_wait": "joined gap: exists only when the API loop received the output after it was detokenized",
    "scheduler.inbox_wait": "joined gap: exists only when the scheduler received the request after it was sent",
    "scheduler.encoder_wait": "joined gap: exists only on a language-only server (encoder disaggregation)",
}
"""Top-level stages the load may not produce; the stacked panels show them as 0 s (``or vector(0)``)."""


def load_plan(round_no: int) -> list[tuple[str, list[dict[str, Any]]]]:
    a = data_url(make_image(512, 512, seed=9100 + 2 * round_no))
    b = data_url(make_image(256, 256, seed=9101 + 2 * round_no))
    question = f"Dashboard test {round_no}: what is in this image?"
    text = [{"role": "user", "content": f"Dashboard test {round_no}: say something about the sea."}]
    return [
        ("new image", [image_message(question, [a])]),
        ("same image again", [image_message(question, [a])]),
        ("different image", [image_message(question, [b])]),
        ("question first", [image_message(question, [a], image_first=False)]),
        ("text", text),
        ("same text", text),
    ]


def fetch_requests(server: CpuServer, host: ImageHost, round_no: int) -> list[str]:
    """An image by URL (``mm.download``, media bytes) and one the host answers 404 for (a counted
    ``mm.download`` failure): the rids, for the media fetch and failure panels."""
    name = f"dashboards-{round_no}.png"
    host.files[name] = make_image(128, 128, seed=9120 + round_no)
    question = f"Dashboard test {round_no}: what is in the fetched image?"
    chunks, usage, _ = stream_chat(server.base_url, [image_message(question, [host.url(f"/img/{name}")])], max_tokens=4)
    assert chunks and usage, "image URL: no stream/usage" + server_context(server)
    rid = f"dashboards-missing-{round_no}-{int(time.time() * 1000)}"
    missing = [{"type": "image_url", "image_url": {"url": host.url("/img/missing.png")}}, {"type": "text", "text": "?"}]
    status, raw = post(server.port, chat_body(rid, missing))
    assert status >= 400, (status, raw[:300])
    return [chunks[0]["id"], rid]


class Loaded:
    """The server, the Prometheus that scraped it, and the rate window that spans the load."""

    def __init__(self, server: CpuServer, prom: PrometheusServer, window: str, recs: dict[str, dict[str, Any]]):
        self.server, self.prom, self.window, self.records = server, prom, window, recs

    def query(self, expr: str) -> list[dict[str, Any]]:
        return self.prom.query(gen.substitute(expr, self.window))


def wait_series(prom: PrometheusServer, promql: str, timeout: float) -> list[dict[str, Any]]:
    deadline = time.monotonic() + timeout
    while True:
        result = prom.query(promql)
        if result or time.monotonic() > deadline:
            return result
        time.sleep(1.0)


@pytest.fixture(scope="module")
def loaded(tmp_path_factory: pytest.TempPathFactory):
    require_tools()
    env = {
        "SGLANG_MMTRACE_OTLP_ENDPOINT": f"http://127.0.0.1:{free_port()}",  # nothing listens there
        "SGLANG_MMTRACE_OTLP_PROTOCOL": "http/protobuf",
        "SGLANG_MMTRACE_TEST_RAISE": INJECTED,
    }
    host = ImageHost()
    with start_server(tmp_path_factory, "mmtrace-dashboards", env=env) as server:
        prom = PrometheusServer(
            f"127.0.0.1:{server.port}", tmp_path_factory.mktemp("prometheus-dashboards"), rule_files=RULES
        )
        prom.start()
        try:
            prom.wait_scrape_after(time.time())
            t0 = time.time()
            rids: list[str] = []
            for round_no in range(ROUNDS):
                for label, messages in load_plan(round_no):
                    chunks, usage, _ = stream_chat(server.base_url, messages, max_tokens=4)
                    assert chunks and usage, f"{label}: no stream/usage" + server_context(server)
                    rids.append(chunks[0]["id"])
                rids.extend(fetch_requests(server, host, round_no))
                # Every record of the round observed, then a scrape: each series the first round
                # created is seen to grow in the second, so rate() has an increase. A whole load
                # between two scrapes (a fast machine) would show every series at its final value.
                records(server, rids, timeout=120)
                prom.wait_scrape_after(time.time())
            recs = records(server, rids, timeout=120)
            for what in ("errors_total", "dropped_total"):
                found = wait_series(prom, f"{PREFIX}{what} > 0", HEALTH_TIMEOUT_S)
                assert found, f"{PREFIX}{what} never scraped" + server_context(server)
            prom.wait_scrape_after(time.time())
            window = f"{math.ceil(time.time() - t0) + 30}s"
            yield Loaded(server, prom, window, recs)
        finally:
            prom.stop()
            host.close()


def test_every_panel_query_returns_data(loaded: Loaded):
    targets = gen.prometheus_targets(gen.dashboard())
    assert len(targets) > 50, len(targets)
    empty, unexpected = [], []
    for title, ref, expr in targets:
        finite = [r for r in loaded.query(expr) if math.isfinite(r["value"])]
        if (title, ref) in NO_DATA_ON_CPU:
            if finite:
                unexpected.append(f"{title} {ref}: listed as no-data but returned {finite[:3]}")
        elif not finite:
            empty.append(f"{title} {ref}: {gen.substitute(expr, loaded.window)}")
    assert not empty, f"{len(empty)} of {len(targets)} queries without a finite series:\n" + "\n".join(empty)
    assert not unexpected, "\n".join(unexpected)


def test_stacked_stages_were_observed(loaded: Loaded):
    """The stacked breakdowns fall back to 0 s for a stage with no series; every stage that always
    happens must therefore have real series, so the fallback hides no broken query."""
    seen = {r["metric"]["stage"] for r in loaded.prom.query(f"count by (stage) ({PREFIX}stage_seconds_count)")}
    expected = set(gen.top_level_stages()) - set(MAY_BE_ABSENT)
    assert expected <= seen, f"top-level stages never observed: {sorted(expected - seen)}"
    stacked = {t["legendFormat"] for p in gen.dashboard()["panels"] if p["title"].startswith("TTFT breakdown")
               for t in p["targets"] if "or vector(0)" in t["expr"]}  # fmt: skip
    assert stacked <= set(gen.top_level_stages()) | {"unattributed", "TTFT (mean)"}, stacked


def test_panel_values_match_the_load(loaded: Loaded):
    """The series say what the load did: the injected hook fails, OTLP drops, CPU hand-off, image misses."""
    panels = {p["title"]: p for p in gen.dashboard()["panels"]}

    def series(title: str, ref: str = "A") -> dict[str, float]:
        (target,) = [t for t in panels[title]["targets"] if t["refId"] == ref]
        return {",".join(r["metric"].values()): r["value"] for r in loaded.query(target["expr"])}

    errors = series("Contained plugin errors/s by component")
    assert set(errors) == {INJECTED}, errors
    assert set(series("Dropped records/spans/events per second by sink")) == {"otlp"}
    modes = {r["transport"]["mode"] for r in loaded.records.values() if r.get("images")}
    assert set(series("Feature transport bytes/s by mode")) == modes - {"none"}, modes
    by_modality = series("TTFT p50 / p95 / p99 by modality")
    assert set(by_modality) == {"image", "text"}, by_modality
    prefixes = {
        "hit" if r["cache"]["image_prefix_hit"] else "not"
        for r in loaded.records.values()
        if r.get("images") and r["status"] == "ok"
    }
    ratio = series("Cache hit ratios", "C")[""]
    assert (ratio > 0) == ("hit" in prefixes) and (ratio < 1) == ("not" in prefixes), (ratio, prefixes)


def test_template_variables_list_the_server(loaded: Loaded):
    """``label_values(selector, label)``: the values Grafana offers include this server and its model."""
    models = {r["model"] for r in loaded.records.values()}
    want = {"model": models, "instance": {f"127.0.0.1:{loaded.server.port}"}}
    for name, query in gen.variable_queries(gen.dashboard()).items():
        m = re.fullmatch(r"label_values\((.+),\s*(\w+)\)", query)
        assert m, query
        selector = gen.substitute(m.group(1), "1m")
        values = loaded.prom.api(f"label/{urllib.parse.quote(m.group(2))}/values", **{"match[]": selector})
        assert want[name] <= set(values), (name, values, want[name])


def test_shipped_rules_record_and_alert(loaded: Loaded):
    """The rules load, every recording rule yields a series, and the two health alerts are active."""
    groups = loaded.prom.api("rules")["groups"]
    rules = [r for g in groups for r in g["rules"]]
    assert {g["file"] for g in groups} == {str(p.resolve()) for p in RULES}
    assert rules and all(r["health"] == "ok" for r in rules), [(r["name"], r.get("lastError")) for r in rules]
    for rule in (r for r in rules if r["type"] == "recording"):
        finite = [r for r in loaded.prom.query(rule["name"]) if math.isfinite(r["value"])]
        assert finite, f"recording rule {rule['name']} has no finite series"
    deadline = time.monotonic() + 30
    while True:
        active = {(a["labels"]["alertname"], a["labels"].get("component") or a["labels"].get("sink")): a["state"]
                  for a in loaded.prom.alerts()}  # fmt: skip
        want = {("SglangMmtracePluginErrors", INJECTED), ("SglangMmtraceDroppingData", "otlp")}
        if want <= set(active) or time.monotonic() > deadline:
            break
        time.sleep(1.0)
    assert want <= set(active), active
    assert active[("SglangMmtracePluginErrors", INJECTED)] == "firing"  # no `for:`: fires at once
    assert ("SglangMmtraceLowCoverage", None) not in active, active
