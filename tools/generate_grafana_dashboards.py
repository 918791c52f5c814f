"""Generate the Grafana dashboard from the code: the stage catalogue and the metric table.

``python tools/generate_grafana_dashboards.py`` rewrites ``dashboards/sglang-mmtrace.json``;
``--check`` exits non-zero when the file is stale. Tests check that every metric a panel queries
is one the plugin defines, and run the queries against a real Prometheus.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from sglang_mmtrace.sinks.prometheus import PREFIX  # noqa: E402
from sglang_mmtrace.stages import _CATALOGUE  # noqa: E402

OUT = ROOT / "dashboards" / "sglang-mmtrace.json"
RANGE = "$__rate_interval"
SEL = 'model=~"$model"'


def top_level_stages() -> list[str]:
    """Stages directly under the root: they do not nest in each other, so a stack of them adds up."""
    return [s.name for s in _CATALOGUE if s.parent == "request"]


def panel(
    pid: int,
    title: str,
    targets: list[tuple[str, str]],
    x: int,
    y: int,
    w: int = 12,
    h: int = 8,
    unit: str = "s",
    stack: bool = False,
    kind: str = "timeseries",
) -> dict[str, Any]:
    field: dict[str, Any] = {"unit": unit}
    if stack:
        field["custom"] = {"stacking": {"mode": "normal", "group": "A"}, "fillOpacity": 60}
    return {
        "id": pid,
        "type": kind,
        "title": title,
        "datasource": {"type": "prometheus", "uid": "${datasource}"},
        "gridPos": {"x": x, "y": y, "w": w, "h": h},
        "fieldConfig": {"defaults": field, "overrides": []},
        "targets": [
            {"refId": chr(65 + i), "expr": expr, "legendFormat": legend} for i, (expr, legend) in enumerate(targets)
        ],
    }


def quantile(q: float, metric: str, by: str) -> str:
    return f"histogram_quantile({q}, sum by (le, {by}) (rate({PREFIX}{metric}_bucket{{{SEL}}}[{RANGE}])))"


def dashboard() -> dict[str, Any]:
    stages = "|".join(s.replace(".", "\\\\.") for s in top_level_stages())
    panels = [
        panel(
            1,
            "TTFT p50 / p95 by modality",
            [
                (quantile(0.5, "ttft_seconds", "modality"), "p50 {{modality}}"),
                (quantile(0.95, "ttft_seconds", "modality"), "p95 {{modality}}"),
            ],
            0,
            0,
        ),
        panel(
            2,
            "TTFT p50 by image prefix-cache outcome",
            [
                (quantile(0.5, "ttft_seconds", "prefix"), "{{prefix}}"),
            ],
            12,
            0,
        ),
        panel(
            3,
            "Where TTFT goes: seconds per request by top-level stage (stacked) + unexplained",
            [
                (
                    f'sum by (stage) (rate({PREFIX}stage_seconds_sum{{{SEL}, stage=~"{stages}"}}[{RANGE}])) / '
                    f"ignoring(stage) group_left sum(rate({PREFIX}ttft_seconds_count{{{SEL}}}[{RANGE}]))",
                    "{{stage}}",
                ),
                (
                    f"sum(rate({PREFIX}ttft_unattributed_seconds_sum{{{SEL}}}[{RANGE}])) / "
                    f"sum(rate({PREFIX}ttft_seconds_count{{{SEL}}}[{RANGE}]))",
                    "unattributed",
                ),
            ],
            0,
            8,
            w=24,
            h=10,
            stack=True,
        ),
        panel(
            4,
            "Multimodal stages p50",
            [
                (
                    quantile(0.5, "stage_seconds", "stage").replace(
                        SEL, SEL + ', stage=~"mm\\\\..*|model\\\\..*|transport\\\\..*"'
                    ),
                    "{{stage}}",
                ),
            ],
            0,
            18,
        ),
        panel(
            5,
            "Cache hit ratio",
            [
                (
                    f'sum by (cache) (rate({PREFIX}cache_lookups_total{{result="hit"}}[{RANGE}])) / '
                    f"sum by (cache) (rate({PREFIX}cache_lookups_total[{RANGE}]))",
                    "{{cache}}",
                ),
            ],
            12,
            18,
            unit="percentunit",
        ),
        panel(
            6,
            "Prompt tokens from the prefix cache",
            [
                (
                    f'sum(rate({PREFIX}prefix_tokens_total{{kind="cached"}}[{RANGE}])) / '
                    f"sum(rate({PREFIX}prefix_tokens_total[{RANGE}]))",
                    "cached share",
                ),
            ],
            0,
            26,
            unit="percentunit",
        ),
        panel(
            7,
            "Feature transport bytes/s",
            [
                (f"sum by (mode) (rate({PREFIX}transport_bytes_total[{RANGE}]))", "{{mode}}"),
            ],
            12,
            26,
            unit="Bps",
        ),
        panel(
            8,
            "Requests/s by status",
            [
                (f"sum by (status) (rate({PREFIX}requests_total{{{SEL}}}[{RANGE}]))", "{{status}}"),
            ],
            0,
            34,
            unit="reqps",
        ),
        panel(
            9,
            "Visual tokens per image p50 / p95",
            [
                (quantile(0.5, "visual_tokens", "model"), "p50"),
                (quantile(0.95, "visual_tokens", "model"), "p95"),
            ],
            12,
            34,
            unit="none",
        ),
        panel(
            10,
            "Plugin health: contained errors and dropped data /s",
            [
                (f"sum by (component) (rate({PREFIX}errors_total[{RANGE}]))", "error {{component}}"),
                (f"sum by (sink) (rate({PREFIX}dropped_total[{RANGE}]))", "dropped {{sink}}"),
            ],
            0,
            42,
            w=24,
            unit="none",
        ),
    ]
    return {
        "uid": "sglang-mmtrace",
        "title": "SGLang multimodal TTFT breakdown (sglang-mmtrace)",
        "schemaVersion": 39,
        "version": 1,
        "editable": True,
        "refresh": "10s",
        "time": {"from": "now-1h", "to": "now"},
        "templating": {
            "list": [
                {"name": "datasource", "type": "datasource", "query": "prometheus"},
                {
                    "name": "model",
                    "type": "query",
                    "datasource": {"type": "prometheus", "uid": "${datasource}"},
                    "query": f"label_values({PREFIX}requests_total, model)",
                    "includeAll": True,
                    "multi": True,
                    "current": {"text": "All", "value": "$__all"},
                },
            ]
        },
        "panels": panels,
    }


def render() -> str:
    return json.dumps(dashboard(), indent=2) + "\n"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--check", action="store_true")
    args = parser.parse_args()
    text = render()
    if args.check:
        ok = OUT.exists() and OUT.read_text() == text
        print("dashboard up to date" if ok else f"{OUT} is stale: run python {Path(__file__).name}")
        return 0 if ok else 1
    OUT.write_text(text)
    print(f"wrote {OUT}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
