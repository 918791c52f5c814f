"""The bench's terminal table, from its output lines (the same lines ``report`` reads).

Per experiment and variant: n, errors, records found, client TTFT p50/p95 with bootstrap 95%
intervals next to the server's ``ttft_s`` and the stage sum (``attributed_s``), the top stages,
cache facts (tokens from ``usage``; cache results from the records), and per comparison group the
stage whose p50 changed most against the group's baseline variant.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable
from typing import Any

from ..report.analysis import format_ms as _ms
from ..report.analysis import quantile, summarize
from ..stages import MODEL_VISION_ENCODER, ROOT, SCHEDULER_QUEUE, STAGES
from .stats import bootstrap_quantile_ci

_PARENTS = {s.parent for s in STAGES.values() if s.parent}
QUEUE = SCHEDULER_QUEUE


def is_leaf(stage: str) -> bool:
    return stage != ROOT and stage not in _PARENTS


def encoder_ran(rec: dict[str, Any]) -> bool:
    """The vision encoder actually ran (a prefix-cache hit records the stage with ``skipped``)."""
    return any(
        s["name"] == MODEL_VISION_ENCODER and not (s.get("attrs") or {}).get("skipped") for s in rec.get("stages", ())
    )


def variant_summary(lines: list[dict[str, Any]]) -> dict[str, Any]:
    b0 = lines[0]["bench"]
    ok = [ln for ln in lines if ln["bench"]["ok"]]
    recs = [ln for ln in ok if ln["bench"].get("record") and ln.get("status") == "ok"]
    ttft = [ln["bench"]["client_ttft_s"] for ln in ok]
    stages = summarize(recs, group=lambda r: "all").get("all", {}).get("stages", {}) if recs else {}
    usage = [ln["bench"]["usage"] or {} for ln in ok]
    prompt = [u["prompt_tokens"] for u in usage if u.get("prompt_tokens") is not None]
    cached = [u["cached_tokens"] for u in usage if u.get("cached_tokens") is not None]
    out: dict[str, Any] = {
        "experiment": b0["experiment"],
        "variant": b0["variant"],
        "variant_index": b0.get("variant_index", 0),
        "group": b0.get("group", b0["experiment"]),
        "n": len(lines),
        "errors": len(lines) - len(ok),
        "error_kinds": dict(
            Counter((ln["bench"]["error"] or "").split(":")[0] for ln in lines if not ln["bench"]["ok"])
        ),
        "records": len(recs),
        "client_ttft_p50": quantile(ttft, 0.5),
        "client_ttft_p50_ci": bootstrap_quantile_ci(ttft, 0.5),
        "client_ttft_p95": quantile(ttft, 0.95),
        "client_ttft_p95_ci": bootstrap_quantile_ci(ttft, 0.95),
        "server_ttft_p50": quantile([r["ttft_s"] for r in recs], 0.5),
        "stage_sum_p50": quantile([r["attributed_s"] for r in recs], 0.5),
        "coverage_p50": quantile([r["coverage"] for r in recs], 0.5),
        "stages": stages,
        "prompt_tokens_p50": quantile(prompt, 0.5),
        "cached_tokens_p50": quantile(cached, 0.5),
        "cache": {
            "preprocess": dict(Counter((r.get("cache") or {}).get("preprocess") for r in recs)),
            "embedding": dict(Counter((r.get("cache") or {}).get("embedding") for r in recs)),
            "image_prefix_hit": sum(bool((r.get("cache") or {}).get("image_prefix_hit")) for r in recs),
            "encoder_ran": sum(encoder_ran(r) for r in recs),
        },
    }
    return out


def summaries(lines: Iterable[dict[str, Any]]) -> list[dict[str, Any]]:
    """One summary per (experiment, variant), in experiment order, then the variant's index."""
    groups: dict[tuple[str, str], list[dict[str, Any]]] = {}
    for ln in lines:
        b = ln["bench"]
        groups.setdefault((b["experiment"], b["variant"]), []).append(ln)
    exp_order = {e: i for i, e in enumerate(dict.fromkeys(k[0] for k in groups))}
    out = [variant_summary(v) for v in groups.values()]
    return sorted(out, key=lambda s: (exp_order[s["experiment"]], s["variant_index"], s["variant"]))


def biggest_changes(sums: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Per (experiment, group): each variant vs the group's baseline (lowest index), the leaf stage
    whose p50 moved most (a stage absent from one side counts as 0 there: it did not happen)."""
    out = []
    by_group: dict[tuple[str, str], list[dict[str, Any]]] = {}
    for s in sums:
        by_group.setdefault((s["experiment"], s["group"]), []).append(s)
    for members in by_group.values():
        base = min(members, key=lambda s: s["variant_index"])
        for other in members:
            if other is base or not other["stages"] or not base["stages"]:
                continue
            names = [n for n in {*base["stages"], *other["stages"]} if is_leaf(n)]
            if not names:
                continue
            a = {n: base["stages"].get(n, {}).get("p50", 0.0) for n in names}
            b = {n: other["stages"].get(n, {}).get("p50", 0.0) for n in names}
            top = max(names, key=lambda n: abs(b[n] - a[n]))
            out.append(
                {
                    "experiment": base["experiment"],
                    "baseline": base["variant"],
                    "variant": other["variant"],
                    "stage": top,
                    "baseline_p50": a[top] if top in base["stages"] else None,
                    "variant_p50": b[top] if top in other["stages"] else None,
                    "delta_s": b[top] - a[top],
                }
            )
    return out


def top_stages(stages: dict[str, Any], k: int = 3) -> list[tuple[str, float]]:
    leaves = [(n, v["p50"]) for n, v in stages.items() if is_leaf(n)]
    return sorted(leaves, key=lambda kv: -kv[1])[:k]


def _counts(c: dict[Any, int]) -> str:
    return "/".join(f"{k} {v}" for k, v in sorted(c.items(), key=lambda kv: str(kv[0]))) or "-"


def format_table(sums: list[dict[str, Any]], notes: Iterable[str] = ()) -> str:
    lines: list[str] = []
    exp = None
    for s in sums:
        if s["experiment"] != exp:
            exp = s["experiment"]
            lines += ["", f"== {exp}   (server TTFT, stage sum, tokens: p50 over the requests with a record)"]
            lines.append(
                f"   {'variant':<44}{'n':>4}{'err':>4}{'rec':>5}  {'client TTFT p50 [95% CI] ms':<28}"
                f"{'p95 [95% CI] ms':<26}{'server TTFT':>12}{'stage sum':>11}{'cached/prompt':>15}"
            )
        ci, ci95 = s["client_ttft_p50_ci"], s["client_ttft_p95_ci"]
        p50 = f"{_ms(s['client_ttft_p50'])} [{_ms(ci[0])}, {_ms(ci[1])}]"
        p95 = f"{_ms(s['client_ttft_p95'])} [{_ms(ci95[0])}, {_ms(ci95[1])}]"
        tok = (
            f"{s['cached_tokens_p50']:.0f}/{s['prompt_tokens_p50']:.0f}"
            if s["prompt_tokens_p50"] == s["prompt_tokens_p50"]
            else "-"
        )
        lines.append(
            f"   {s['variant'][:43]:<44}{s['n']:>4}{s['errors']:>4}{s['records']:>5}  {p50:<28}{p95:<26}"
            f"{_ms(s['server_ttft_p50']):>12}{_ms(s['stage_sum_p50']):>11}{tok:>15}"
        )
        if s["records"]:
            top = ", ".join(f"{n} {_ms(v)}" for n, v in top_stages(s["stages"]))
            c = s["cache"]
            lines.append(f"      top stages p50 ms: {top}")
            queue = s["stages"].get(QUEUE)
            if s["experiment"] == "concurrency" and queue:
                lines.append(f"      {QUEUE} p50 {_ms(queue['p50'])} ms, p95 {_ms(queue['p95'])} ms")
            lines.append(
                f"      cache: preprocess {_counts(c['preprocess'])}; embedding {_counts(c['embedding'])}; "
                f"image prefix hit {c['image_prefix_hit']}/{s['records']}; vision encoder ran {c['encoder_ran']}/{s['records']}"
            )
        elif s["n"] > s["errors"]:
            lines.append("      no plugin records for these requests (client-side numbers only)")
        if s["errors"]:
            lines.append(f"      errors: {_counts(s['error_kinds'])}")
    changes = biggest_changes(sums)
    if changes:
        lines += ["", "== stage that changed most (p50) against the group's baseline variant"]
        for c in changes:
            before = "absent" if c["baseline_p50"] is None else f"{_ms(c['baseline_p50'])} ms"
            after = "absent" if c["variant_p50"] is None else f"{_ms(c['variant_p50'])} ms"
            lines.append(
                f"   [{c['experiment']}] {c['variant']} vs {c['baseline']}: {c['stage']} "
                f"{c['delta_s'] * 1e3:+.1f} ms ({before} -> {after})"
            )
    notes = list(notes)
    if notes:
        lines += ["", *notes]
    return "\n".join(lines).lstrip("\n") + "\n"
