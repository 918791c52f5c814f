"""Per-stage tables from records (the demo's breakdown and ``sglang-mmtrace report``)."""

from __future__ import annotations

import gzip
import json
import statistics
from collections import defaultdict
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import IO, Any

from ..join.record import stage_totals
from ..stages import DISPLAY_ORDER, ROOT, STAGES


class RecordsError(Exception):
    """A records file that cannot be read at all (missing, a directory, no permission); one-line message."""


@dataclass
class RecordsFile:
    """The records of a JSONL file, and the lines that were not records: ``(line number, why)``."""

    records: list[dict[str, Any]] = field(default_factory=list)
    skipped: list[tuple[int, str]] = field(default_factory=list)


def _is_number(value: Any) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool)


_JSON_TYPES = {list: "array", str: "string", int: "number", float: "number", bool: "boolean", type(None): "null"}


def _is_stage(s: Any) -> bool:
    return (
        isinstance(s, dict)
        and isinstance(s.get("name"), str)
        and _is_number(s.get("start_s"))
        and _is_number(s.get("dur_s"))
        and isinstance(s.get("attrs", {}), dict)
    )


def _not_a_record(obj: Any) -> str | None:
    """Why a parsed line cannot be read as a record (or a bench line), or None. Beyond the ``rid``
    checks only the types the report relies on (stages, the numbers it computes with, the objects
    it looks into), so that a stray line is skipped rather than breaking the whole report."""
    if not isinstance(obj, dict):
        return f"a JSON {_JSON_TYPES[type(obj)]}, not a record object"
    if "rid" not in obj:  # every record has one, and so has every bench line (null when the request failed)
        return "no 'rid': not a record"
    stages = obj.get("stages", [])
    if not isinstance(stages, list) or not all(map(_is_stage, stages)):
        return "'stages' is not a list of {name, start_s, dur_s, attrs}"
    for key in ("ttft_s", "coverage", "arrival_unix_s"):
        if obj.get(key) is not None and not _is_number(obj[key]):
            return f"'{key}' is not a number"
    for key in ("cache", "bench"):
        if obj.get(key) is not None and not isinstance(obj[key], dict):
            return f"'{key}' is not an object"
    if obj.get("status") == "ok" and obj.get("ttft_s") and obj.get("coverage") is None:
        return "an ok record without 'coverage'"
    return None


def load_records(path: str) -> RecordsFile:
    """Every record of a JSONL file, skipping (and listing) the lines that are not one.

    A file that is being appended to (``SGLANG_MMTRACE_JSONL`` of a live server) normally ends in a
    half-written line: it is skipped like any other bad line, so one bad line never costs the rest.
    Invalid UTF-8 is replaced, so a binary file yields bad lines, not an exception. A name ending in
    ``.gz`` is read through gzip (committed bench runs keep their lines so). Raises
    :class:`RecordsError` only when the file cannot be read.
    """
    out = RecordsFile()
    opener: Callable[..., IO[str]] = gzip.open if str(path).endswith(".gz") else open
    try:
        with opener(path, "rt", encoding="utf-8", errors="replace") as fh:
            for lineno, line in enumerate(fh, 1):
                if not line.strip():
                    continue
                try:
                    obj = json.loads(line)
                except ValueError as exc:
                    last = not line.endswith("\n")
                    out.skipped.append((lineno, "incomplete last line" if last else f"not JSON ({exc.msg})"))
                    continue
                problem = _not_a_record(obj)
                if problem:
                    out.skipped.append((lineno, problem))
                else:
                    out.records.append(obj)
    except IsADirectoryError:
        raise RecordsError(f"{path}: is a directory, not a records file") from None
    except OSError as exc:
        raise RecordsError(f"{path}: {exc.strerror or exc}") from None
    except EOFError:
        raise RecordsError(f"{path}: the gzip stream ends early") from None
    return out


def read_jsonl(path: str) -> list[dict[str, Any]]:
    """The records of a JSONL file, bad lines skipped silently (:func:`load_records` lists them)."""
    return load_records(path).records


def request_kind(rec: dict[str, Any]) -> str:
    """A label derived from the record alone: what the caches did for this request."""
    if not rec.get("images"):
        return "text"
    cache = rec.get("cache") or {}
    if cache.get("image_prefix_hit"):
        return "image: prefix-cache hit"
    if cache.get("embedding") == "hit":
        return "image: embedding-cache hit"
    return "image: encoded"


def report_group(rec: dict[str, Any]) -> str:
    """``experiment / variant`` for bench output (its ``bench`` key), else the request kind."""
    bench = rec.get("bench")
    if isinstance(bench, dict) and bench.get("experiment") is not None:
        return f"{bench['experiment']} / {bench.get('variant')}"
    return request_kind(rec)


def is_ok(rec: dict[str, Any]) -> bool:
    """A request that produced a first token and a record (bench: the client saw no error either)."""
    bench = rec.get("bench")
    if isinstance(bench, dict) and bench.get("ok") is False:
        return False
    return rec.get("status") == "ok" and bool(rec.get("ttft_s"))


def _no_record(recs: list[dict[str, Any]]) -> int:
    """Bench lines for which the plugin wrote no record (no ``status``)."""
    return sum(1 for r in recs if "status" not in r)


def group_records(
    records: Iterable[dict[str, Any]], group: Callable[[dict[str, Any]], str] = request_kind
) -> dict[str, list[dict[str, Any]]]:
    """Records by group label, in order of first appearance (failed requests included)."""
    out: dict[str, list[dict[str, Any]]] = defaultdict(list)
    for rec in records:
        out[group(rec)].append(rec)
    return dict(out)


def parent_stages(names: Iterable[str]) -> set[str]:
    """The catalogue ancestors of ``names`` (parents, their parents...): the stages whose time holds another's.

    The stages of ``names`` not in this set are leaves there; leaf times do not overlap by nesting,
    so they can be ranked or shared out against each other (a parent would repeat its children)."""
    out: set[str] = set()
    for name in names:
        parent = STAGES[name].parent if name in STAGES else None
        while parent is not None:
            out.add(parent)
            parent = STAGES[parent].parent
    return out


def exclusive_times(rec: dict[str, Any]) -> dict[str, float]:
    """Seconds of ``[0, ttft_s]`` during which each stage was the most specific one running.

    Stages nest (``tokenize`` holds ``mm.process``...) and, across processes, overlap (the API's
    ``dispatch`` returns after the scheduler started receiving), so raw durations cannot be stacked.
    Each instant goes to one stage: the deepest in the catalogue, then the one that started last
    (where the request has got to). Per request the values add up to ``coverage * ttft_s``.
    """
    ttft = rec.get("ttft_s") or 0.0
    spans = []
    for s in rec.get("stages", ()):
        if s["name"] == ROOT or (s.get("attrs") or {}).get("skipped"):
            continue
        start, end = max(0.0, s["start_s"]), min(ttft, s["start_s"] + s["dur_s"])
        if end > start:
            depth = STAGES[s["name"]].depth if s["name"] in STAGES else 1
            spans.append((start, end, (depth, s["start_s"]), s["name"]))
    out: dict[str, float] = dict.fromkeys(stage_totals(rec), 0.0)
    out.pop(ROOT, None)
    edges = sorted({t for start, end, _, _ in spans for t in (start, end)})
    for lo, hi in zip(edges, edges[1:], strict=False):
        running = [(rank, name) for start, end, rank, name in spans if start <= lo and hi <= end]
        if running:
            out[max(running)[1]] += hi - lo
    return out


def unattributed_s(rec: dict[str, Any]) -> float:
    """The part of TTFT no stage explains: ``ttft_s * (1 - coverage)``."""
    return max(0.0, rec["ttft_s"] * (1.0 - rec.get("coverage", 0.0)))


CACHES: tuple[str, ...] = ("preprocess", "embedding", "image_prefix")
"""The caches a record reports on (``cache.preprocess``, ``cache.embedding``, ``cache.image_prefix_hit``)."""


def cache_ratios(records: Iterable[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    """Per cache: hits, lookups (hit + miss; ``off`` is no lookup) and hit ratio (None without lookups).

    ``image_prefix`` counts image requests whose images were all in the radix prefix cache.
    ``prefix_tokens`` is the token-level reuse: cached_tokens / prompt_tokens over the records.
    """
    counts = {c: {"hit": 0, "miss": 0, "off": 0} for c in CACHES}
    cached = prompt = 0
    for rec in records:
        cache = rec.get("cache") or {}
        for c in ("preprocess", "embedding"):
            result = cache.get(c)
            if result in counts[c]:
                counts[c][result] += 1
        if rec.get("images"):
            counts["image_prefix"]["hit" if cache.get("image_prefix_hit") else "miss"] += 1
        cached += rec.get("cached_tokens") or 0
        prompt += rec.get("prompt_tokens") or 0
    out: dict[str, dict[str, Any]] = {}
    for c, n in counts.items():
        lookups = n["hit"] + n["miss"]
        out[c] = {**n, "lookups": lookups, "ratio": n["hit"] / lookups if lookups else None}
    out["prefix_tokens"] = {"cached": cached, "prompt": prompt, "ratio": cached / prompt if prompt else None}
    return out


def unobserved_counts(records: Iterable[dict[str, Any]]) -> dict[str, int]:
    """stage -> how many records list it as ``unobserved`` (expected, not seen: its time is inside the
    enclosing stage), in catalogue order."""
    counts: dict[str, int] = defaultdict(int)
    for rec in records:
        for stage in rec.get("unobserved") or ():
            counts[stage] += 1
    return dict(sorted(counts.items(), key=lambda kv: DISPLAY_ORDER.get(kv[0], 999)))


def quantile(values: Iterable[float], q: float) -> float:
    """The ``q`` quantile (0..1) with linear interpolation between order statistics; NaN for no values.

    The one definition every table uses (``report``, the bench summaries and their bootstrap
    intervals): numpy's default method, so ``quantile(xs, 0.5)`` is ``statistics.median(xs)``, but
    pure Python, because ``report`` runs where numpy need not be installed.
    """
    ordered = sorted(float(v) for v in values)
    if not ordered:
        return float("nan")
    pos = min(1.0, max(0.0, q)) * (len(ordered) - 1)
    lo = int(pos)
    hi = min(lo + 1, len(ordered) - 1)
    return ordered[lo] + (ordered[hi] - ordered[lo]) * (pos - lo)


def format_ms(seconds: float | None, digits: int = 1) -> str:
    """Seconds as milliseconds for the text tables; ``-`` for None or NaN (nothing measured)."""
    return "-" if seconds is None or seconds != seconds else f"{seconds * 1e3:.{digits}f}"


OCCUPANCY_PARTS: dict[str, str] = {
    "embedding": "embedding cache",
    "preprocess": "preprocess cache",
    "cuda_ipc_pool": "cuda_ipc pool",
    "shm": "shm in flight",
}


def occupancy_summary(records: Iterable[dict[str, Any]]) -> dict[str, dict[str, int]]:
    """Per part of the records' ``occupancy`` (the collector's latest sample when each was built, in
    record order): the last value and the maximum of each figure, and the evictions and fallbacks
    counted between the first and the last record."""
    seen: dict[str, list[dict[str, int]]] = defaultdict(list)
    for rec in records:
        for part, fields in (rec.get("occupancy") or {}).items():
            if part in OCCUPANCY_PARTS and isinstance(fields, dict):
                seen[part].append(fields)
    out: dict[str, dict[str, int]] = {}
    for part, samples in seen.items():
        last = samples[-1]
        row: dict[str, int] = {}
        for key, value in last.items():
            if key in ("evictions", "fallbacks"):
                row[key] = value - samples[0].get(key, 0)
            else:
                row[key] = value
                row["max_" + key] = max(s.get(key, 0) for s in samples)
        out[part] = row
    return out


def format_occupancy(occupancy: dict[str, dict[str, int]]) -> list[str]:
    """One line per part: bytes used (of capacity or reserved), entries or segments, evictions or fallbacks."""
    mib = 1024 * 1024
    lines = []
    for part, label in OCCUPANCY_PARTS.items():
        row = occupancy.get(part)
        if row is None:
            continue
        bits = [f"{row.get('used_bytes', 0) / mib:.1f} MiB used (max {row.get('max_used_bytes', 0) / mib:.1f})"]
        for key, name in (("capacity_bytes", "capacity"), ("reserved_bytes", "reserved")):
            if key in row:
                bits[0] += f" of {row[key] / mib:.1f} MiB {name}"
        for key, name in (("entries", "entries"), ("segments", "segments")):
            if key in row:
                bits.append(f"{row[key]} {name} (max {row['max_' + key]})")
        for key, name in (("evictions", "evictions"), ("fallbacks", "fallbacks to CPU")):
            if key in row:
                bits.append(f"{row[key]} {name}")
        lines.append(f"   {label + ':':<18}" + ", ".join(bits))
    return lines


def summarize(
    records: Iterable[dict[str, Any]], group: Callable[[dict[str, Any]], str] = request_kind
) -> dict[str, dict[str, Any]]:
    """Per group: n, ttft p50/p95, coverage min/median, and per stage p50/p95/share of TTFT.

    Also the unattributed TTFT p50, cache hit ratios, the caches' and the transport's occupancy, requests not timed (``failed``: errors, aborts and
    bench lines without a plugin record, the latter also counted in ``no_record``) and,
    for bench output, the client-observed TTFT p50/p95.
    """
    out: dict[str, dict[str, Any]] = {}
    for name, all_recs in group_records(records, group).items():
        recs = [r for r in all_recs if is_ok(r)]
        if not recs:
            out[name] = {"n": 0, "failed": len(all_recs), "no_record": _no_record(all_recs), "stages": {}}
            continue
        per_stage: dict[str, list[float]] = defaultdict(list)
        shares: dict[str, list[float]] = defaultdict(list)
        for rec in recs:
            for stage, dur in stage_totals(rec).items():
                per_stage[stage].append(dur)
                shares[stage].append(dur / rec["ttft_s"])
        ttfts = [r["ttft_s"] for r in recs]
        covs = [r["coverage"] for r in recs]
        unattributed = [unattributed_s(r) for r in recs]
        client = [r["bench"]["client_ttft_s"] for r in recs if (r.get("bench") or {}).get("client_ttft_s") is not None]
        out[name] = {
            "n": len(recs),
            "failed": len(all_recs) - len(recs),
            "no_record": _no_record(all_recs),
            "ttft_p50": quantile(ttfts, 0.5),
            "ttft_p95": quantile(ttfts, 0.95),
            "client_ttft_p50": quantile(client, 0.5) if client else None,
            "client_ttft_p95": quantile(client, 0.95) if client else None,
            "coverage_min": min(covs),
            "coverage_p50": statistics.median(covs),
            "unattributed_p50": quantile(unattributed, 0.5),
            "cache": cache_ratios(recs),
            "unobserved": unobserved_counts(recs),
            "occupancy": occupancy_summary(all_recs),
            "stages": {
                s: {
                    "p50": quantile(v, 0.5),
                    "p95": quantile(v, 0.95),
                    "share": statistics.median(shares[s]),
                    "n": len(v),
                }
                for s, v in sorted(per_stage.items(), key=lambda kv: DISPLAY_ORDER.get(kv[0], 999))
            },
        }
    return out


def format_table(summary: dict[str, dict[str, Any]]) -> str:
    """One block per group: stages indented under their parents, in ms."""
    lines = []
    for name, g in summary.items():
        failed = f", {g['failed']} failed" if g.get("failed") else ""
        if g.get("no_record"):
            failed += f" ({g['no_record']} without a record)"
        if not g["n"]:
            lines += [f"== {name}  (n=0{failed})", ""]
            continue
        lines.append(
            f"== {name}  (n={g['n']}{failed})  TTFT p50 {g['ttft_p50'] * 1e3:.1f} ms, p95 {g['ttft_p95'] * 1e3:.1f} ms;"
            f" coverage min {g['coverage_min']:.3f}, median {g['coverage_p50']:.3f}"
        )
        if g.get("client_ttft_p50") is not None:
            lines.append(
                f"   client TTFT p50 {g['client_ttft_p50'] * 1e3:.1f} ms, p95 {g['client_ttft_p95'] * 1e3:.1f} ms"
            )
        if g.get("cache"):
            lines.append(
                "   " + format_cache_line(g["cache"]) + f"; unattributed p50 {g['unattributed_p50'] * 1e3:.2f} ms"
            )
        if g.get("unobserved"):
            counts = ", ".join(f"{stage} ({n} of {g['n']})" for stage, n in g["unobserved"].items())
            lines.append(f"   UNOBSERVED (expected, not seen; their time is inside the enclosing stage): {counts}")
        lines += format_occupancy(g.get("occupancy") or {})
        lines.append(f"   {'stage':<34}{'p50 ms':>10}{'p95 ms':>10}{'share':>8}{'n':>5}")
        for stage, s in g["stages"].items():
            if stage == ROOT:
                continue
            depth = STAGES[stage].depth if stage in STAGES else 1
            label = "  " * max(0, depth - 1) + stage
            lines.append(
                f"   {label:<34}{s['p50'] * 1e3:>10.2f}{s['p95'] * 1e3:>10.2f}{s['share'] * 100:>7.1f}%{s['n']:>5}"
            )
        lines.append("")
    return "\n".join(lines)


def format_ratio(entry: dict[str, Any]) -> str:
    """``hits/lookups (ratio)`` or ``-`` when nothing was looked up."""
    if entry.get("ratio") is None:
        return "-"
    if "lookups" in entry:
        return f"{entry['hit']}/{entry['lookups']} ({entry['ratio'] * 100:.0f}%)"
    return f"{entry['ratio'] * 100:.0f}%"


def format_cache_line(cache: dict[str, dict[str, Any]]) -> str:
    return "cache hits: " + ", ".join(f"{c} {format_ratio(cache[c])}" for c in (*CACHES, "prefix_tokens"))
