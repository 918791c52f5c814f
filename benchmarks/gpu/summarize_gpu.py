"""Tables for the README from one GPU check's results folder (computed here, not on the device).

    python -m benchmarks.gpu.summarize_gpu benchmarks/results/gpu-h200-0.5.17

Reads ``ab_raw.json`` + ``records_ab_on.jsonl`` (plugin on vs off, cuda_ipc, interleaved; written by the
two-server ``ab_017.py`` of 2026-11-29, since replaced by ``overhead_017.py``) and
``records_cpu.jsonl`` (``--mm-feature-transport cpu``); prints markdown: per-stage p50 for a new vs a
repeated image under each transport, and the TTFT medians on vs off with a bootstrap interval of the
paired ratio.
"""

from __future__ import annotations

import json
import statistics
import sys
from pathlib import Path
from typing import Any

from sglang_mmtrace.bench.stats import paired_ratio_ci
from sglang_mmtrace.cli.demo import KINDS
from sglang_mmtrace.report.analysis import read_jsonl, stage_totals
from sglang_mmtrace.stages import DISPLAY_ORDER

COLUMNS = ("new image", "same image again")


def _p50_by_stage(records: list[dict[str, Any]]) -> dict[str, float]:
    per: dict[str, list[float]] = {}
    for rec in records:
        for name, dur in stage_totals(rec).items():
            per.setdefault(name, []).append(dur)
    return {name: statistics.median(v) for name, v in per.items() if len(v) * 2 > len(records)}


def stage_table(groups: dict[str, list[dict[str, Any]]]) -> str:
    p50 = {label: _p50_by_stage(recs) for label, recs in groups.items()}
    head = "| stage (p50 ms) | " + " | ".join(groups) + " |"
    lines = [head, "|---|" + "---:|" * len(groups)]
    for stage in DISPLAY_ORDER:
        if any(stage in p for p in p50.values()):
            cells = [f"{p[stage] * 1e3:.2f}" if stage in p else "-" for p in p50.values()]
            bold = stage == "request"
            lines.append(f"| {'**TTFT (request)**' if bold else stage} | " + " | ".join(cells) + " |")
    cov = [statistics.median(r["coverage"] for r in recs) for recs in groups.values()]
    lines.append("| coverage (median) | " + " | ".join(f"{c:.3f}" for c in cov) + " |")
    lines.append("| n | " + " | ".join(str(len(r)) for r in groups.values()) + " |")
    return "\n".join(lines)


def ab_table(raw: dict[str, Any]) -> str:
    """TTFT medians of the ``off`` arm and each other arm, with the paired ratio's bootstrap interval."""
    pairs: dict[tuple[int, str], dict[str, float]] = {}
    for r in raw["rows"]:
        if "ttft_s" in r:
            pairs.setdefault((r["round"], r["kind"]), {})[r["arm"]] = r["ttft_s"]
    others = sorted({arm for v in pairs.values() for arm in v} - {"off"})
    lines = [
        "| request | arm | n pairs | TTFT off p50 ms | TTFT arm p50 ms | arm/off (95% CI) |",
        "|---|---|---:|---:|---:|---|",
    ]
    for arm in others:
        pooled_off: list[float] = []
        pooled_arm: list[float] = []
        for kind in (*KINDS, "all"):
            both = [v for (_, k), v in sorted(pairs.items()) if (kind == "all" or k == kind) and {"off", arm} <= set(v)]
            off, other = [v["off"] for v in both], [v[arm] for v in both]
            if kind != "all":
                pooled_off += off
                pooled_arm += other
            ratio, lo, hi = paired_ratio_ci(off, other)
            lines.append(
                f"| {kind} | {arm} | {len(both)} | {statistics.median(off) * 1e3:.2f} | "
                f"{statistics.median(other) * 1e3:.2f} | {ratio:.3f} [{lo:.3f}, {hi:.3f}] |"
            )
    errors = sum(1 for r in raw["rows"] if "error" in r)
    lines.append(f"\n{len(raw['rows'])} requests, {errors} errors; arms: {raw.get('arms') or 'on/off'}.")
    return "\n".join(lines)


def main(folder: str) -> int:
    d = Path(folder)
    raw = json.loads((d / "ab_raw.json").read_text())
    kind_of = {r["rid"]: r["kind"] for r in raw["rows"] if r.get("arm") == "on" and r.get("rid")}
    ipc = [r for r in read_jsonl(str(d / "records_ab_on.jsonl")) if r["rid"] in kind_of and r["status"] == "ok"]
    summary = json.loads((d / "summary_cpu.json").read_text())
    cpu_kind = {q["rid"]: q["kind"] for q in summary["requests"]}
    cpu = [r for r in read_jsonl(str(d / "records_cpu.jsonl")) if r["rid"] in cpu_kind and r["status"] == "ok"]
    groups = {}
    for label, recs, kinds in (("cuda_ipc", ipc, kind_of), ("cpu", cpu, cpu_kind)):
        for col in COLUMNS:
            groups[f"{col}, {label}"] = [r for r in recs if kinds[r["rid"]] == col]
    print("### Per-stage p50, new vs repeated image, `cuda_ipc` vs `cpu` transport\n")
    print(stage_table(groups))
    for name, title in (
        ("ab_raw.json", "plugin off vs on"),
        ("ab_bare_raw.json", "plugin off vs on with GPU timing, metrics and JSONL off (bare)"),
        ("ab_aa_raw.json", "A/A: two plugin-off servers (the noise floor of this set-up)"),
    ):
        if (d / name).exists():
            print(f"\n### TTFT, {title} (cuda_ipc, interleaved, client-side)\n")
            print(ab_table(json.loads((d / name).read_text())))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1]))
