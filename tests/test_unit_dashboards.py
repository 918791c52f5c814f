"""The Grafana dashboard is generated from the code and queries only metrics the plugin defines.

Its queries are run against a real Prometheus scraping the real server in
``test_server_dashboards.py``; here: the committed JSON is the generator's output, every metric
name a query uses exists, the stacked breakdowns follow the catalogue, and the trace links point
at the trace backend's datasource.
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
import urllib.parse
from pathlib import Path

from sglang_mmtrace.sinks import otlp
from sglang_mmtrace.sinks.prometheus import METRICS, PREFIX
from sglang_mmtrace.stages import ROOT, STAGES

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "tools"))
import generate_grafana_dashboards as gen  # noqa: E402

DASHBOARD = REPO / "dashboards" / "sglang-mmtrace.json"


def _board() -> dict:
    return json.loads(DASHBOARD.read_text())


def _panels(board: dict) -> dict[str, dict]:
    return {p["title"]: p for p in board["panels"] if p["type"] != "row"}


def test_dashboard_is_up_to_date():
    proc = subprocess.run(
        [sys.executable, str(REPO / "tools" / "generate_grafana_dashboards.py"), "--check"],
        capture_output=True,
        text=True,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr


def test_every_queried_metric_is_defined():
    exposed = set()
    for name, (kind, _, _) in METRICS.items():
        if kind == "histogram":
            exposed |= {f"{PREFIX}{name}_{s}" for s in ("bucket", "sum", "count")}
        else:
            exposed.add(PREFIX + name)
    exprs = [expr for _, _, expr in gen.prometheus_targets(_board())]
    exprs += list(gen.variable_queries(_board()).values())
    used = {m for expr in exprs for m in re.findall(rf"{PREFIX}[a-z_]+", expr)}
    assert used, "no metric found in the dashboard"
    assert used <= exposed, used - exposed
    # every contract metric is shown somewhere
    assert {re.sub(r"_(bucket|sum|count)$", "", m) for m in used} >= {PREFIX + n for n in METRICS}
    # SGLang's own metrics only through the listed names (the server test proves they exist)
    sglang_used = set(re.findall(r"sglang\[:_\]([a-z_]+)", " ".join(exprs)))
    assert sglang_used == set(gen.SGLANG_METRICS), sglang_used
    assert not re.findall(r"sglang:[a-z_]+", " ".join(exprs)), "use gen.sglang_metric(): scrapes may spell it sglang_"


def test_queries_filter_by_model_and_instance():
    """Every query honours the instance variable, and every query of a model-labelled metric the model one."""
    with_model = {PREFIX + n for n, (_, labels, _) in METRICS.items() if "model" in labels}
    checked = 0
    for title, ref, expr in gen.prometheus_targets(_board()):
        for name, labels in re.findall(r"([\w:]*)\{([^{}]*)\}", expr):
            checked += 1
            assert 'instance=~"$instance"' in labels, f"{title} {ref}: {expr}"
            base = re.sub(r"_(bucket|sum|count)$", "", name)
            if base in with_model:
                assert 'model=~"$model"' in labels, f"{title} {ref}: {expr}"
    assert checked >= len(gen.prometheus_targets(_board()))
    names = {v["name"] for v in _board()["templating"]["list"]}
    assert {"datasource", "traces", "model", "instance"} <= names


def test_breakdowns_stack_top_level_stages_in_catalogue_order():
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
        assert p["fieldConfig"]["defaults"]["custom"]["stacking"]["mode"] == "normal"
        # the TTFT line is drawn over the stack, not stacked into it
        (override,) = p["fieldConfig"]["overrides"]
        assert override["matcher"]["options"] == p["targets"][-1]["refId"]
        assert {"id": "custom.stacking", "value": {"mode": "none", "group": "A"}} in override["properties"]


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
    assert (target["queryType"], target["service"], target["operation"]) == ("search", gen.TRACE_SERVICE, ROOT)
    # TTFT panels: a data link to Explore searching root spans at least as slow as the clicked value
    for title in ("TTFT p50 / p95 / p99 by modality", "TTFT p50 / p95 / p99 by prefix"):
        (link,) = panels[title]["fieldConfig"]["defaults"]["links"]
        path, _, query = link["url"].partition("?")
        assert path == "/explore"
        panes = urllib.parse.parse_qs(query)["panes"][0]
        pane = json.loads(panes)["slow"]
        (q,) = pane["queries"]
        assert pane["datasource"] == q["datasource"]["uid"] == "${traces}"
        assert (q["service"], q["operation"], q["minDuration"]) == (gen.TRACE_SERVICE, ROOT, "${__value.raw}s")
        assert pane["range"] == {"from": "${__from}", "to": "${__to}"}
    kinds = {v["name"]: v["query"] for v in board["templating"]["list"] if v["type"] == "datasource"}
    assert kinds == {"datasource": "prometheus", "traces": "jaeger"}


def test_substitute_leaves_no_grafana_variable():
    for _, _, expr in gen.prometheus_targets(_board()):
        assert "$" not in gen.substitute(expr, "1m"), expr


def test_ttft_panels_ask_for_exemplars():
    """The TTFT histogram panels request exemplars: Grafana draws the trace id the sink attaches
    (``test_unit_prometheus_sink.py``) as points that open the trace."""
    asking = {t: p for t, p in _panels(_board()).items() if any(x.get("exemplar") for x in p.get("targets", ()))}
    assert set(asking) == {"TTFT p50 / p95 / p99 by modality", "TTFT p50 / p95 / p99 by prefix"}
    for title, p in asking.items():
        for target in p["targets"]:
            assert target["exemplar"] is True and f"{PREFIX}ttft_seconds_bucket" in target["expr"], title
