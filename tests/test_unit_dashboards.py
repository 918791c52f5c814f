"""The Grafana dashboard is generated from the code and queries only metrics the plugin defines."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

from sglang_mmtrace.sinks.prometheus import METRICS, PREFIX

ROOT = Path(__file__).resolve().parents[1]
DASHBOARD = ROOT / "dashboards" / "sglang-mmtrace.json"


def _exprs() -> list[str]:
    board = json.loads(DASHBOARD.read_text())
    return [t["expr"] for p in board["panels"] for t in p["targets"]]


def test_dashboard_is_up_to_date():
    proc = subprocess.run(
        [sys.executable, str(ROOT / "tools" / "generate_grafana_dashboards.py"), "--check"],
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
    used = {m for expr in _exprs() for m in re.findall(rf"{PREFIX}[a-z_]+", expr)}
    assert used, "no metric found in the dashboard"
    assert used <= exposed, used - exposed
    # every contract metric is shown somewhere
    assert {re.sub(r"_(bucket|sum|count)$", "", m) for m in used} >= {PREFIX + n for n in METRICS}
