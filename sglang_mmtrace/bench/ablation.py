"""``ablation``: the incremental per-request TTFT cost of each plugin part, on one server instance.

Levels follow the parts' stack order (``switchctl.PARTS``): L0 = the switch off, L1 = {http},
L2 = {http, tokenizer}, ..., L12 = every part. Per round, every kind (new image, same image, text;
the ``overhead`` workload) at every level, in a random order per round (seeded), one request in
flight, the switch set before each request (untimed). Per part i and kind: the median over rounds
of the paired difference TTFT(L_i) - TTFT(L_{i-1}) in microseconds with a bootstrap 95% interval;
and the whole stack, L12 - L0. A level writes records only once ``jsonl`` is among its parts, so
only those requests expect one.
"""

from __future__ import annotations

import random
from collections.abc import Iterable, Sequence
from functools import partial
from typing import Any

import numpy as np

from .experiments import Planned
from .overhead import KINDS, Workload
from .stats import bootstrap_median_ci
from .switchctl import PARTS, levels

EXPERIMENT = "ablation"


def expects_record(parts: Sequence[str] | None) -> bool:
    return parts is not None and "jsonl" in parts


def ablation_plan(
    rounds: int, warmup_rounds: int, workload: Workload, seed: int, parts: Sequence[str] = PARTS
) -> list[Planned]:
    """Warm-up rounds (excluded) then ``rounds`` rounds of every (kind, level), shuffled per round."""
    lv = levels(parts)
    rng = random.Random(seed)
    plan = []
    for r in range(-warmup_rounds, rounds):
        cells = [(kind, i) for kind in KINDS for i in range(len(lv))]
        rng.shuffle(cells)
        for kind, i in cells:
            level = lv[i]
            info = {
                "kind": kind,
                "level": i,
                "arm": "on" if level is not None else "off",
                "parts": list(level) if level is not None else None,
                "expect_record": expects_record(level),
            }
            plan.append(
                Planned(
                    EXPERIMENT, f"{kind}: L{i}", i, kind, partial(workload.messages, kind, r, f"L{i}"), r, r < 0, info
                )
            )
    return plan


def _by_round(lines: Iterable[dict[str, Any]], kind: str) -> dict[int, dict[int, float]]:
    out: dict[int, dict[int, float]] = {}
    for ln in lines:
        b = ln["bench"]
        if b.get("kind") == kind and b["ok"] and b.get("client_ttft_s") is not None:
            out.setdefault(b["round"], {})[b["level"]] = b["client_ttft_s"]
    return out


def _diff(by: dict[int, dict[int, float]], hi: int, lo: int) -> dict[str, Any]:
    d = np.array([v[hi] - v[lo] for v in by.values() if hi in v and lo in v]) * 1e6
    if d.size == 0:
        return {"n": 0, "median_us": None, "ci95_us": [None, None]}
    a, b = bootstrap_median_ci(d)
    return {"n": int(d.size), "median_us": round(float(np.median(d)), 1), "ci95_us": [round(a, 1), round(b, 1)]}


def ablation_summary(lines: list[dict[str, Any]], parts: Sequence[str] = PARTS) -> dict[str, Any]:
    """Per part (and the whole stack) and kind: the paired difference to the level below, in microseconds."""
    by = {kind: _by_round(lines, kind) for kind in KINDS}
    rows = [
        {"part": part, "level": i, **{kind: _diff(by[kind], i, i - 1) for kind in KINDS}}
        for i, part in enumerate(parts, start=1)
    ]
    whole = {"part": "whole stack", "level": len(parts), **{kind: _diff(by[kind], len(parts), 0) for kind in KINDS}}
    medians = {
        kind: {f"L{i}": round(float(np.median([v[i] for v in by[kind].values() if i in v])) * 1e3, 3)
               for i in range(len(parts) + 1) if any(i in v for v in by[kind].values())}
        for kind in KINDS
    }  # fmt: skip
    rounds = sorted({r for kind in KINDS for r in by[kind]})
    return {"parts": list(parts), "rounds": len(rounds), "rows": rows, "whole": whole, "ttft_median_ms": medians}


def _cell(c: dict[str, Any]) -> str:
    if not c["n"]:
        return "-"
    lo, hi = c["ci95_us"]
    return f"{c['median_us']:+.0f} [{lo:+.0f}, {hi:+.0f}]"


def ablation_markdown(s: dict[str, Any]) -> str:
    """``part | new image us [CI] | same image us [CI] | text us [CI]``, one row per part plus the whole stack."""
    lines = [
        f"Incremental TTFT per part: median over {s['rounds']} rounds of TTFT(L_i) - TTFT(L_i-1), microseconds [bootstrap 95% CI]",
        "",
        "| part | new image us [CI] | same image us [CI] | text us [CI] |",
        "|---|---:|---:|---:|",
    ]
    for row in [*s["rows"], s["whole"]]:
        name = (
            f"L{row['level']} +{row['part']}"
            if row["part"] != "whole stack"
            else f"**whole stack** (L{row['level']} - L0)"
        )
        lines.append(f"| {name} | " + " | ".join(_cell(row[k]) for k in KINDS) + " |")
    return "\n".join(lines) + "\n"
