"""Per-family completeness and encoder-timing check of one ``gpu_check.sh ... nsys`` run, and its table.

    python3 benchmarks/gpu/summarize_families.py collect --family F --shape S --summary summary_nsys.json \
        --records records_nsys.jsonl --sqlite PROFILE.sqlite --out OUTDIR        (on the device)
    python3 benchmarks/gpu/summarize_families.py table OUTDIR/families_*.json    (markdown, anywhere)

``collect`` writes ``OUTDIR/families_<family>.json`` and ``.csv``: one row per request of the run
(the warm-up round included) with its kind, the multimodal stages it lacks (``mm.process``,
``mm.load``, ``mm.decode``, ``mm.resize_normalize`` and ``mm.expand`` always, ``model.embed`` where the
embedding cache was looked up, ``model.vision_encoder`` on a miss), the record's ``unobserved``, its cache outcomes,
``cached_tokens`` against SGLang's ``usage``, coverage, the ``model.vision_encoder`` CUDA-event time
against the GPU span of the kernels launched inside its NVTX range (``profiling.nsys.compare``;
agreement within max(10%, 50 us)), and the encoder NVTX ranges that name the request (none for an
embedding-cache hit). ``table`` prints the per-family totals and the per-request encoder rows.
"""

from __future__ import annotations

import argparse
import csv
import json
import sys
from pathlib import Path
from typing import Any

from sglang_mmtrace.profiling.nsys import ABS_TOL_S, REL_TOL, compare, read_ranges
from sglang_mmtrace.report.analysis import read_jsonl

MM_STAGES = ("mm.process", "mm.load", "mm.decode", "mm.resize_normalize", "mm.expand")
"""The API side's multimodal stages: in every image request."""
EMBED = "model.embed"
"""In every request whose image embeddings were looked up (embedding cache hit or miss); a request whose
image tokens all came from the radix prefix cache embeds nothing."""
ENCODER = "model.vision_encoder"


def _encoder_ran(rec: dict[str, Any]) -> bool:
    return any(s["name"] == ENCODER and not s["attrs"].get("skipped") for s in rec["stages"])


def collect(args: argparse.Namespace) -> dict[str, Any]:
    summary = json.loads(Path(args.summary).read_text())
    records = {r["rid"]: r for r in read_jsonl(args.records)}
    ranges = read_ranges(args.sqlite) if args.sqlite else []
    agree = {a.rid: a for a in compare(ranges, records.values()) if a.stage == ENCODER}
    enc_ranges: dict[str, int] = {}
    for r in ranges:
        if r.stage == ENCODER and r.push_pop:
            for rid in r.rids:
                enc_ranges[rid] = enc_ranges.get(rid, 0) + 1
    rows = []
    for q in summary.get("warmup", []) + summary["requests"]:
        rec = records.get(q["rid"])
        if rec is None:
            rows.append({"rid": q["rid"], "kind": q["kind"], "record": False})
            continue
        names = {s["name"] for s in rec["stages"]}
        ran = _encoder_ran(rec)
        emb = rec["cache"].get("embedding")
        need = (*MM_STAGES, *((EMBED,) if emb in ("hit", "miss") else ()), *((ENCODER,) if emb == "miss" else ()))
        a = agree.get(rec["rid"])
        rows.append(
            {
                "rid": rec["rid"],
                "kind": q["kind"],
                "record": True,
                "status": rec["status"],
                "ttft_ms": round(rec["ttft_s"] * 1e3, 3),
                "missing_mm_stages": [s for s in need if s not in names],
                "mm_stages_present": [s for s in (*MM_STAGES, EMBED, ENCODER) if s in names],
                "unobserved": rec.get("unobserved"),
                "cache_embedding": rec["cache"].get("embedding"),
                "cache_preprocess": rec["cache"].get("preprocess"),
                "image_prefix_hit": rec["cache"].get("image_prefix_hit"),
                "encoder_ran": ran,
                "encoder_nvtx_ranges": enc_ranges.get(rec["rid"], 0),
                "usage_cached_tokens": q.get("usage_cached_tokens"),
                "record_cached_tokens": rec["cached_tokens"],
                "usage_prompt_tokens": q.get("usage_prompt_tokens"),
                "record_prompt_tokens": rec["prompt_tokens"],
                "visual_tokens": [im.get("visual_tokens") for im in rec.get("images") or ()],
                "coverage": rec["coverage"],
                "encoder_clock": next((s["clock"] for s in rec["stages"] if s["name"] == ENCODER), None),
                "encoder_event_us": round(a.event_s * 1e6, 1) if a else None,
                "encoder_kernels_us": round(a.kernel_s * 1e6, 1) if a else None,
                "encoder_diff_us": round((a.event_s - a.kernel_s) * 1e6, 1) if a else None,
                "encoder_within_tol": a.ok if a else None,
            }
        )
    ok = [r for r in rows if r["record"]]
    miss = [r for r in ok if r["cache_embedding"] == "miss"]
    hit = [r for r in ok if r["cache_embedding"] == "hit"]
    # the image sent again: "same image again" (radix prefix: embedding "off") and "same image, question first"
    repeat = [r for r in ok if "same image" in r["kind"]]
    compared = [r for r in ok if r["encoder_event_us"] is not None]
    result = {
        "family": args.family,
        "shape": args.shape,
        "requests": len(rows),
        "records": len(ok),
        "statuses": sorted({r["status"] for r in ok}),
        "missing_mm_stages": sorted({s for r in ok for s in r["missing_mm_stages"]}),
        "unobserved": sorted({s for r in ok for s in r["unobserved"] or ()}),
        "unobserved_field_present": all(r["unobserved"] is not None for r in ok),
        "cache_embedding": {k: sum(r["cache_embedding"] == k for r in ok) for k in {r["cache_embedding"] for r in ok}},
        "new_image_kinds_miss": all(
            r["cache_embedding"] == "miss"
            for r in ok
            if r["kind"].endswith(("new image", "different image, same question"))
        ),
        "hits_without_encoder": sum(not r["encoder_ran"] and r["encoder_nvtx_ranges"] == 0 for r in hit),
        "hits": len(hit),
        "repeats_without_encoder": sum(not r["encoder_ran"] and r["encoder_nvtx_ranges"] == 0 for r in repeat),
        "repeats": len(repeat),
        "repeat_cache_embedding": sorted({str(r["cache_embedding"]) for r in repeat}),
        "misses_with_encoder": sum(r["encoder_ran"] for r in miss),
        "misses": len(miss),
        "cached_tokens_equal_usage": sum(r["usage_cached_tokens"] == r["record_cached_tokens"] for r in ok),
        "coverage_min": min((r["coverage"] for r in ok), default=None),
        "encoder_clock": sorted({r["encoder_clock"] for r in miss if r["encoder_clock"]}),
        "encoder_compared": len(compared),
        "encoder_within_tol": sum(bool(r["encoder_within_tol"]) for r in compared),
        "encoder_abs_diff_max_us": max((abs(r["encoder_diff_us"]) for r in compared), default=None),
        "tolerance": f"max({REL_TOL:.0%}, {ABS_TOL_S * 1e6:.0f} us)",
        "rows": rows,
    }
    out = Path(args.out)
    slug = args.family.replace(".", "")
    (out / f"families_{slug}.json").write_text(json.dumps(result, indent=1))
    with (out / f"families_{slug}.csv").open("w", newline="") as fh:
        w = csv.DictWriter(fh, fieldnames=list(rows[0]) if rows and rows[0]["record"] else ["rid", "kind", "record"])
        w.writeheader()
        for r in rows:
            w.writerow({k: json.dumps(v) if isinstance(v, list) else v for k, v in r.items() if k in w.fieldnames})
    print(json.dumps({k: v for k, v in result.items() if k != "rows"}, indent=1))
    return result


def table(paths: list[str]) -> str:
    res = [json.loads(Path(p).read_text()) for p in paths]
    head = ["family (shape)", "records", "mm stages missing", "unobserved", "embedding cache",
            "same image again: no encoder run", "cached = usage", "coverage min", "encoder clock", "encoder within tol"]  # fmt: skip
    lines = ["| " + " | ".join(head) + " |", "|---" * len(head) + "|"]
    for r in res:
        cache = ", ".join(f"{k} {v}" for k, v in sorted(r["cache_embedding"].items()))
        lines.append(
            f"| {r['family']} ({r['shape']}) | {r['records']}/{r['requests']} | {r['missing_mm_stages'] or 'none'} | "
            f"{r['unobserved'] or '[]'} | {cache} | {r['repeats_without_encoder']}/{r['repeats']} | "
            f"{r['cached_tokens_equal_usage']}/{r['records']} | {r['coverage_min']:.4f} | {','.join(r['encoder_clock'])} | "
            f"{r['encoder_within_tol']}/{r['encoder_compared']} (max abs diff {r['encoder_abs_diff_max_us']} us) |"
        )
    lines.append("")
    lines.append("| family | kind | rid | encoder CUDA events (us) | kernels in NVTX range (us) | diff (us) | within |")
    lines.append("|---|---|---|---:|---:|---:|---|")
    for r in res:
        for row in r["rows"]:
            if row.get("encoder_event_us") is not None:
                lines.append(
                    f"| {r['family']} | {row['kind']} | {row['rid'][:8]} | {row['encoder_event_us']:.1f} | "
                    f"{row['encoder_kernels_us']:.1f} | {row['encoder_diff_us']:+.1f} | {row['encoder_within_tol']} |"
                )
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = ap.add_subparsers(dest="cmd", required=True)
    c = sub.add_parser("collect")
    c.add_argument("--family", required=True)
    c.add_argument("--shape", required=True)
    c.add_argument("--summary", required=True)
    c.add_argument("--records", required=True)
    c.add_argument("--sqlite")
    c.add_argument("--out", required=True)
    t = sub.add_parser("table")
    t.add_argument("paths", nargs="+")
    args = ap.parse_args(argv)
    if args.cmd == "collect":
        collect(args)
    else:
        print(table(args.paths), end="")
    return 0


if __name__ == "__main__":
    sys.exit(main())
