"""Exemplars with a real Prometheus: from a TTFT or stage bucket to the request's trace id.

One real server with SGLang's metrics on (the harness always passes ``--enable-metrics``) and
``SGLANG_MMTRACE_EXEMPLARS=1``: the plugin's metrics leave SGLang's multiprocess ``/metrics`` (where
prometheus_client cannot keep exemplars) for the collector's own port, which a real Prometheus
started with ``--enable-feature=exemplar-storage`` scrapes (in OpenMetrics, which it then asks for).
The OTLP endpoint is a closed port: the spans are dropped, but each record still gets the trace
id its spans carry. With SGLang's metrics off the same registry is served on the same port.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any

import pytest
from conftest import read_records, records, server_context, start_server
from peers.prometheus import PrometheusServer, free_port, http_get, require_tools
from test_server_exporters import QUESTION, TEXT, chat, get_text, image, metric_samples

from sglang_mmtrace.harness import CpuServer, image_message
from sglang_mmtrace.report.analysis import stage_totals
from sglang_mmtrace.sinks.prometheus import PREFIX, STAGE_BUCKETS, prefix_label

pytestmark = pytest.mark.server

RECORD_TIMEOUT_S = 120.0


@dataclass
class Scraped:
    server: CpuServer
    prom: PrometheusServer
    port: int  # the plugin's own metrics port
    rids: list[str]
    records: list[dict[str, Any]]  # every non-warm-up record, in the order the collector observed them
    start: float
    end: float  # unix s: a scrape after every record was counted happened before ``end``

    def exemplars(self, metric: str) -> list[tuple[dict[str, str], dict[str, Any]]]:
        """(series labels, exemplar) for every exemplar Prometheus stored for ``<metric>_bucket``."""
        found = self.prom.query_exemplars(f"{PREFIX}{metric}_bucket", self.start, self.end)
        return [(series["seriesLabels"], ex) for series in found for ex in series["exemplars"]]


def plugin_text(port: int) -> str:
    status, body = http_get(f"http://127.0.0.1:{port}/metrics")
    assert status == 200, f"GET :{port}/metrics -> HTTP {status}"
    return body.decode()


@pytest.fixture(scope="module")
def scraped(tmp_path_factory):
    require_tools()
    port = free_port()
    env = {
        "SGLANG_MMTRACE_EXEMPLARS": "1",
        "SGLANG_MMTRACE_METRICS_PORT": str(port),
        "SGLANG_MMTRACE_OTLP_ENDPOINT": f"http://127.0.0.1:{free_port()}",  # nothing listens there
        "SGLANG_MMTRACE_OTLP_PROTOCOL": "http/protobuf",
    }
    with start_server(tmp_path_factory, "exemplars", env=env) as server:
        prom = PrometheusServer(f"127.0.0.1:{port}", tmp_path_factory.mktemp("prometheus-exemplars"), exemplars=True)
        prom.start()
        try:
            start = time.time() - 1
            a, b = image(8401), image(8402)
            plan = [
                ("new_image", [image_message(QUESTION, [a])], 1),
                ("same_image", [image_message(QUESTION, [a])], 1),
                ("other_image", [image_message(QUESTION, [b], image_first=False)], 1),
                ("text", [{"role": "user", "content": TEXT}], 0),
                ("text_again", [{"role": "user", "content": TEXT}], 0),
            ]
            rids = [chat(server, label, messages, images=n).rid for label, messages, n in plan]
            records(server, rids, timeout=RECORD_TIMEOUT_S)
            recs = [r for r in read_records(server.jsonl_path) if not r.get("warmup")]
            deadline = time.monotonic() + 60
            while sum(v for _, v in metric_samples(plugin_text(port), PREFIX + "requests_total")) < len(recs):
                assert time.monotonic() < deadline, "the plugin's port never counted every record" + server_context(
                    server
                )
                time.sleep(0.5)
            prom.wait_scrape_after(time.time())
            yield Scraped(server, prom, port, rids, recs, start, time.time() + 1)
        finally:
            prom.stop()


def test_every_record_has_the_trace_id_its_spans_carry(scraped: Scraped):
    assert sorted(r["rid"] for r in scraped.records) == sorted(scraped.rids)
    ids = [r.get("trace_id") for r in scraped.records]
    assert all(isinstance(t, str) and len(t) == 32 for t in ids), ids
    assert len(set(ids)) == len(ids), ids


def _bucket(value: float) -> str:
    """The ``le`` of the one bucket an observation sets its exemplar on (the first bound >= value)."""
    return next(f"{le}" for le in STAGE_BUCKETS if value <= le)


def test_ttft_exemplars_are_the_latest_record_of_their_bucket(scraped: Scraped):
    """Each TTFT series' newest exemplar is the trace id and TTFT of the latest record observed in that
    bucket (records in the collector's order), and carries nothing else."""
    found = scraped.exemplars("ttft_seconds")
    assert found, "no TTFT exemplar stored" + server_context(scraped.server)
    latest: dict[tuple[str, ...], dict[str, Any]] = {}
    for rec in scraped.records:
        modality = "image" if rec["images"] else "text"
        latest[(rec.get("model") or "", modality, prefix_label(rec), _bucket(rec["ttft_s"]))] = rec
    newest: dict[tuple[str, ...], dict[str, Any]] = {}
    for series, ex in found:
        assert set(ex["labels"]) == {"trace_id"}, ex
        key = (series.get("model_name", ""), series["modality"], series["prefix"], f"{float(series['le'])}")
        if key not in newest or ex["timestamp"] > newest[key]["timestamp"]:
            newest[key] = ex
    assert set(newest) <= set(latest), (set(newest) - set(latest), latest.keys())
    for key, ex in newest.items():
        rec = latest[key]
        assert ex["labels"]["trace_id"] == rec["trace_id"], (key, ex, rec["rid"])
        assert float(ex["value"]) == pytest.approx(rec["ttft_s"], abs=1e-9), (key, ex, rec["ttft_s"])
    assert {ex["labels"]["trace_id"] for _, ex in found} <= {r["trace_id"] for r in scraped.records}


def test_stage_exemplars_name_a_record_with_that_stage_time(scraped: Scraped):
    by_trace = {r["trace_id"]: r for r in scraped.records}
    found = scraped.exemplars("stage_seconds")
    assert found, "no stage exemplar stored" + server_context(scraped.server)
    for series, ex in found:
        rec = by_trace.get(ex["labels"]["trace_id"])
        assert rec is not None and set(ex["labels"]) == {"trace_id"}, (series, ex)
        stage = series["stage"]
        assert float(ex["value"]) == pytest.approx(stage_totals(rec)[stage], abs=1e-9), (series, ex, rec["rid"])
        assert f"{float(series['le'])}" == _bucket(float(ex["value"])), (series, ex)
    assert {series["stage"] for series, _ in found} >= {"tokenize", "model.forward"}


def test_metrics_served_once_on_the_plugin_port(scraped: Scraped):
    """With the opt-in, SGLang's ``/metrics`` keeps its own series and none of the plugin's: no
    series is counted twice; the plugin's port counts every record."""
    sglang_text = get_text(scraped.server, "/metrics")
    assert "sglang:num_running_reqs" in sglang_text
    assert PREFIX not in sglang_text
    counted = sum(v for _, v in metric_samples(plugin_text(scraped.port), PREFIX + "requests_total"))
    assert counted == len(scraped.records)
