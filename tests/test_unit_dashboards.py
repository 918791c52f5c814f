"""The Grafana dashboard is generated from the code and queries only metrics the plugin defines.

Its queries are run against a real Prometheus scraping the real server in
``test_server_dashboards.py``; here: the committed JSON is the generator's output, every metric
name a query uses exists and every metric family the plugin exports is on a panel (the families
read from a real ``PrometheusSink`` on a private registry: what it declares is what it serves), the
stacked breakdowns follow the catalogue and only means are stacked, every panel has a unit and plain
descriptions, and the trace links point at the trace backend's datasource.
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
import urllib.parse
from pathlib import Path

from prometheus_client import CollectorRegistry

from sglang_mmtrace.sinks import genai, otlp
from sglang_mmtrace.sinks.prometheus import METRICS, PREFIX, PrometheusSink
from sglang_mmtrace.stages import ROOT, STAGES

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "tools"))
import generate_grafana_dashboards as gen  # noqa: E402

DASHBOARD = REPO / "dashboards" / "sglang-mmtrace.json"


def _board() -> dict:
    return json.loads(DASHBOARD.read_text())


def _panels(board: dict) -> dict[str, dict]:
    return {p["title"]: p for p in board["panels"] if p["type"] != "row"}


SUFFIXES = {"histogram": ("_bucket", "_sum", "_count"), "counter": ("_total",), "gauge": ("",)}
"""The series names prometheus_client serves per family type (``_created`` series are not queried)."""


def _exported() -> dict[str, str]:
    """Every series name the plugin serves -> its family: what a real sink registers."""
    registry = CollectorRegistry()
    PrometheusSink(registry=registry)
    return {m.name + suffix: m.name for m in registry.collect() for suffix in SUFFIXES[m.type]}


def _queried_names() -> set[str]:
    exprs = [expr for _, _, expr in gen.prometheus_targets(_board())]
    exprs += list(gen.variable_queries(_board()).values())
    # metric names: the plugin's prefix, or the GenAI server metrics' (``gen_ai_request_model`` is a label)
    return {m for expr in exprs for m in re.findall(r"\b(?:sglang_mmtrace_|gen_ai_server_)[a-z_]+", expr)}


def test_dashboard_is_up_to_date():
    proc = subprocess.run(
        [sys.executable, str(REPO / "tools" / "generate_grafana_dashboards.py"), "--check"],
        capture_output=True,
        text=True,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr


def test_every_queried_metric_is_defined():
    exported, used = _exported(), _queried_names()
    assert used, "no metric found in the dashboard"
    assert used <= set(exported), used - set(exported)
    exprs = [expr for _, _, expr in gen.prometheus_targets(_board())] + list(gen.variable_queries(_board()).values())
    # SGLang's own metrics only through the listed names (the server test proves they exist)
    sglang_used = set(re.findall(r"sglang\[:_\]([a-z_]+)", " ".join(exprs)))
    assert sglang_used == set(gen.SGLANG_METRICS), sglang_used
    assert not re.findall(r"sglang:[a-z_]+", " ".join(exprs)), "use gen.sglang_metric(): scrapes may spell it sglang_"


def test_every_exported_family_is_on_a_panel():
    """Every family the sink serves (the contract's table and the GenAI metrics) is read by a panel,
    or declared in ``gen.NOT_ON_A_PANEL`` with its reason."""
    exported = _exported()
    families = set(exported.values())
    assert {PREFIX + n.removesuffix("_total") for n in METRICS} | {
        genai.prometheus_name(n) for n in genai.METRICS
    } == families
    shown = {exported[m] for m in _queried_names()}
    exempt = set(gen.NOT_ON_A_PANEL)
    assert exempt <= families, exempt - families
    assert all(reason.strip() for reason in gen.NOT_ON_A_PANEL.values()), gen.NOT_ON_A_PANEL
    assert not exempt & shown, f"on a panel, yet exempted: {exempt & shown}"
    assert families - exempt <= shown, f"exported and on no panel: {sorted(families - exempt - shown)}"


def test_queries_filter_by_model_and_instance():
    """Every query honours the instance variable, and every query of a model-labelled metric the model one
    (``model_name``, as SGLang's metrics; the GenAI metrics' ``gen_ai_request_model``)."""
    model_label = {PREFIX + n: "model_name" for n, (_, labels, _) in METRICS.items() if "model_name" in labels}
    model_label |= {genai.prometheus_name(n): genai.prometheus_label("gen_ai.request.model") for n in genai.METRICS}
    assert not any("model" in labels for _, labels, _ in METRICS.values()), "the model label is model_name"
    checked = 0
    for title, ref, expr in gen.prometheus_targets(_board()):
        for name, labels in re.findall(r"([\w:]*)\{([^{}]*)\}", expr):
            checked += 1
            assert 'instance=~"$instance"' in labels, f"{title} {ref}: {expr}"
            base = re.sub(r"_(bucket|sum|count|total)$", "", name)
            if base in model_label:
                assert f'{model_label[base]}=~"$model"' in labels, f"{title} {ref}: {expr}"
    assert checked >= len(gen.prometheus_targets(_board()))
    names = {v["name"] for v in _board()["templating"]["list"]}
    assert {"datasource", "traces", "model", "instance"} <= names
    assert gen.variable_queries(_board())["model"] == f"label_values({PREFIX}requests_total, model_name)"


def test_breakdowns_follow_the_catalogue_and_stack_only_means():
    """Means of parts add up to the mean TTFT and are stacked; percentiles of parts do not add up to
    the percentile of the whole, so the percentile breakdowns are lines."""
    top = [s.name for s in STAGES.values() if s.parent == ROOT]
    assert top and all(STAGES[s].parent == ROOT for s in top)
    breakdowns = [p for t, p in _panels(_board()).items() if t.startswith("TTFT breakdown")]
    assert len(breakdowns) == 3, [p["title"] for p in breakdowns]  # mean, p50, p95
    for p in breakdowns:
        legends = [t["legendFormat"] for t in p["targets"]]
        assert legends[: len(top)] == top, p["title"]
        assert legends[len(top)] == "unattributed"
        assert legends[-1].startswith("TTFT"), p["title"]
        for target, stage in zip(p["targets"], top, strict=False):
            assert f'stage="{stage}"' in target["expr"]
        stacking = p["fieldConfig"]["defaults"].get("custom", {}).get("stacking", {}).get("mode", "none")
        assert stacking == ("normal" if legends[-1] == "TTFT (mean)" else "none"), p["title"]
        # the TTFT line is drawn over the parts, not stacked into them
        (override,) = p["fieldConfig"]["overrides"]
        assert override["matcher"]["options"] == p["targets"][-1]["refId"]
        assert {"id": "custom.stacking", "value": {"mode": "none", "group": "A"}} in override["properties"]
    assert [p["title"] for p in breakdowns if "stacking" in p["fieldConfig"]["defaults"].get("custom", {})] == [
        "TTFT breakdown: mean seconds per request by stage"
    ]


def test_no_percentile_is_stacked():
    for title, p in _panels(_board()).items():
        if p["fieldConfig"]["defaults"].get("custom", {}).get("stacking", {}).get("mode", "none") != "none":
            assert not any("histogram_quantile" in t["expr"] for t in p["targets"]), title


GRAFANA_UNITS = {"s", "reqps", "ops", "Bps", "bytes", "percentunit", "short"}
"""The units this dashboard uses (Grafana's ids); ``none`` is not one: a count is ``short``."""


def test_every_panel_has_a_unit():
    """Every Prometheus panel names its unit (a per-target override where a rate sits beside counts).
    The trace table shows the columns of the trace backend's search, whose units the datasource sets."""
    for title, p in _panels(_board()).items():
        if p["datasource"]["type"] != "prometheus":
            assert p["datasource"] == gen.TRACES_DS and p["type"] == "table", title
            continue
        assert p["fieldConfig"]["defaults"].get("unit") in GRAFANA_UNITS, title
        for override in p["fieldConfig"]["overrides"]:
            for prop in override["properties"]:
                if prop["id"] == "unit":
                    assert prop["value"] in GRAFANA_UNITS, title
        if p["type"] == "heatmap":
            assert p["options"]["yAxis"]["unit"] == "s" and p["options"]["cellValues"]["unit"] == "short", title
    units = {
        t: p["fieldConfig"]["defaults"]["unit"]
        for t, p in _panels(_board()).items()
        if "unit" in p["fieldConfig"]["defaults"]
    }
    assert units["Requests/s by status"] == "reqps"
    assert units["Feature transport: bytes in flight"] == "bytes" and units["Cache hit ratios"] == "percentunit"
    assert units["Contained plugin errors/s by component"] == "ops"
    entries = _panels(_board())["Cache entries and evictions/s"]
    assert [(o["matcher"]["options"], o["properties"]) for o in entries["fieldConfig"]["overrides"]] == [
        ("B", [{"id": "unit", "value": "ops"}])
    ]
    assert "evictions/s" in entries["targets"][1]["legendFormat"]


def test_descriptions_are_plain_text_or_markdown():
    """No Python docstring markup (double backticks, reST roles) in what Grafana shows."""
    texts = [(p["title"], p.get("description", "")) for p in _board()["panels"]] + [("board", _board()["description"])]
    for title, text in texts:
        assert "``" not in text and not re.search(r":(func|class|data|meth):", text), (title, text)
    assert all(p.get("description") for p in _panels(_board()).values())


def test_latency_panels_from_the_genai_metrics():
    panels = _panels(_board())
    e2e = panels["End-to-end latency and TTFT p50 / p95 / p99 (successful requests)"]
    duration, ttft = genai.prometheus_name(genai.DURATION), genai.prometheus_name(genai.TTFT)
    assert [duration in t["expr"] and 'error_type=""' in t["expr"] for t in e2e["targets"]] == [True] * 3 + [False] * 3
    assert all(ttft in t["expr"] for t in e2e["targets"][3:])
    tpot = panels["Time per output token p50 / p95 / p99"]
    assert [re.search(r"histogram_quantile\(([\d.]+),", t["expr"]).group(1) for t in tpot["targets"]] == [
        "0.5",
        "0.95",
        "0.99",
    ]
    assert all(genai.prometheus_name(genai.TPOT) + "_bucket" in t["expr"] for t in tpot["targets"])
    heat = panels["TTFT heatmap"]
    (target,) = heat["targets"]
    assert heat["type"] == "heatmap" and heat["options"]["calculate"] is False
    assert target["format"] == "heatmap" and target["legendFormat"] == "{{le}}"
    assert target["expr"].startswith(f"sum by (le) (increase({PREFIX}ttft_seconds_bucket{{")


def test_panels_cover_the_issue():
    titles = " | ".join(_panels(_board()))
    for needle in (
        "TTFT p50 / p95 / p99 by modality",
        "TTFT p50 / p95 / p99 by prefix",
        "Unattributed share",
        "Cache hit ratios",
        "transport bytes/s by mode",
        "Visual tokens per image request",
        "Queue time (scheduler.queue)",
        "plugin errors",
        "Dropped",
        "Slow requests",
        "TTFT heatmap",
        "End-to-end latency",
        "Time per output token",
    ):
        assert needle.lower() in titles.lower(), needle
    hit = _panels(_board())["Cache hit ratios"]
    assert [re.search(r'cache="(\w+)"', t["expr"]).group(1) for t in hit["targets"]] == [
        "preprocess",
        "embedding",
        "prefix_image",
    ]


def test_slow_requests_link_to_the_trace_backend():
    board = _board()
    panels = _panels(board)
    assert otlp.SERVICE_NAME == gen.TRACE_SERVICE  # the plugin's service.name where OTEL_SERVICE_NAME is unset
    table = panels[next(t for t in panels if t.startswith("Slow requests"))]
    (target,) = table["targets"]
    assert table["datasource"] == {"type": "jaeger", "uid": "${traces}"}
    assert (target["queryType"], target["service"], target["operation"]) == ("search", "$service", ROOT)
    # TTFT panels: a data link to Explore searching root spans at least as slow as the clicked value
    for title in ("TTFT p50 / p95 / p99 by modality", "TTFT p50 / p95 / p99 by prefix"):
        (link,) = panels[title]["fieldConfig"]["defaults"]["links"]
        path, _, query = link["url"].partition("?")
        assert path == "/explore"
        panes = urllib.parse.parse_qs(query)["panes"][0]
        pane = json.loads(panes)["slow"]
        (q,) = pane["queries"]
        assert pane["datasource"] == q["datasource"]["uid"] == "${traces}"
        assert (q["service"], q["operation"], q["minDuration"]) == ("${service}", ROOT, "${__value.raw}s")
        assert pane["range"] == {"from": "${__from}", "to": "${__to}"}
    kinds = {v["name"]: v["query"] for v in board["templating"]["list"] if v["type"] == "datasource"}
    assert kinds == {"datasource": "prometheus", "traces": "jaeger"}
    # the trace service is a variable: a deployment with its own OTEL_SERVICE_NAME sets it
    (service,) = [v for v in board["templating"]["list"] if v["name"] == "service"]
    assert (service["type"], service["query"]) == ("textbox", gen.TRACE_SERVICE)


def test_substitute_leaves_no_grafana_variable():
    for _, _, expr in gen.prometheus_targets(_board()):
        assert "$" not in gen.substitute(expr, "1m"), expr


def test_ttft_panels_ask_for_exemplars():
    """The TTFT histogram panels request exemplars: Grafana draws the trace id the sink attaches
    (``test_unit_prometheus_sink.py``) as points that open the trace."""
    asking = {t: p for t, p in _panels(_board()).items() if any(x.get("exemplar") for x in p.get("targets", ()))}
    assert set(asking) == {"TTFT p50 / p95 / p99 by modality", "TTFT p50 / p95 / p99 by prefix", "TTFT heatmap"}
    for title, p in asking.items():
        for target in p["targets"]:
            assert target["exemplar"] is True and f"{PREFIX}ttft_seconds_bucket" in target["expr"], title
