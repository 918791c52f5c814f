"""Run the chosen experiments on their targets, one server at a time, and collect output lines."""

from __future__ import annotations

import sys
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from . import experiments as ex
from .overhead import ARMS, KINDS, Pauser, paired_summary, run_rounds, start_pair
from .records import RecordsTail
from .runner import Sent, progress_bar, run_concurrent, run_sequential, to_lines, wait_idle
from .targets import LaunchConfig, Target, default_config, launched, make_server


@dataclass
class Settings:
    experiments: list[str]
    opts: ex.Options
    url: str | None = None
    records: Path | None = None
    launch: list[LaunchConfig] = field(default_factory=list)
    gpu: bool = False
    records_timeout: float = 30.0
    health_timeout: float = 600.0
    pause_other: bool = True
    work_dir: Path | None = None


@dataclass
class Outcome:
    lines: list[dict[str, Any]] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    overhead: dict[str, Any] = field(default_factory=dict)


def log(msg: str) -> None:
    print(f"[bench] {msg}", file=sys.stderr, flush=True)


def run_per_target(target: Target, names: list[str], st: Settings, out: Outcome) -> None:
    """new-vs-repeat, order, concurrency against one server (url or launched)."""
    opts = st.opts
    for name in names:
        tail = RecordsTail(target.records)
        sent: list[Sent] = []
        if name == "new-vs-repeat":
            sent = run_sequential(target, ex.new_vs_repeat(opts), opts, name)
        elif name == "order":
            sent = run_sequential(target, ex.order(opts), opts, name)
        elif name == "concurrency":
            warm, levels = ex.concurrency_levels(opts)
            sent = run_sequential(target, warm, opts, "concurrency warm-up")
            for c, plan in levels:
                wait_idle()
                sent += run_concurrent(target, plan, c, opts, f"concurrency {c}")
        out.lines += to_lines(sent, tail, target.label, timeout=st.records_timeout)
        log(f"{name} on '{target.label}': {sum(1 for p, _ in sent if not p.warmup)} requests")


def _folder(st: Settings) -> Path:
    if st.work_dir is None:
        st.work_dir = Path(tempfile.mkdtemp(prefix="mmtrace-bench-"))
    st.work_dir.mkdir(parents=True, exist_ok=True)
    return st.work_dir


def run_configs(exp: str, configs: list[LaunchConfig], st: Settings, out: Outcome) -> None:
    """caches / transport: the same request set under each server configuration, one at a time."""
    for i, cfg in enumerate(configs):
        with launched(cfg, _folder(st), st.gpu, st.health_timeout) as target:
            tail = RecordsTail(target.records)
            sent = run_sequential(target, ex.cache_requests(st.opts, exp, cfg.label, i), st.opts, f"{exp}: {cfg.label}")
            out.lines += to_lines(sent, tail, target.label, timeout=st.records_timeout)


def caches_configs(st: Settings) -> list[LaunchConfig]:
    """``--launch`` configurations if given; else the four toggles on top of the default config."""
    if st.launch:
        return st.launch
    base = default_config(st.gpu)  # the CPU demo's: --mm-preprocess-cache-size-mb 64
    return [
        base.with_args(label="all caches on"),
        LaunchConfig("no preprocess cache", ("--mm-preprocess-cache-size-mb", "0")),
        LaunchConfig("no embedding cache", base.args, {"SGLANG_VLM_CACHE_SIZE_MB": "0"}),
        base.with_args("--disable-radix-cache", label="no radix cache"),
    ]


def run_overhead(st: Settings, out: Outcome) -> None:
    """Two servers side by side, plugin off and on, the requests interleaved (``overhead.py``)."""
    cfg = st.launch[0] if st.launch else default_config(st.gpu)
    folder = _folder(st)
    log(f"overhead: starting a plugin-off and a plugin-on server with '{cfg.label}' ...")
    servers = start_pair(
        lambda arm: make_server(cfg, folder, st.gpu, arm == "on", st.health_timeout, name=f"overhead-{arm}")
    )
    tail = RecordsTail(servers["on"].jsonl_path)
    pauser = Pauser(servers, enabled=st.pause_other, settle_s=0.1)
    opts = st.opts
    try:
        with progress_bar(opts.n * len(KINDS) * len(ARMS), "overhead") as tick:
            run = run_rounds(
                servers, opts.n, opts.warmup, opts.seed, pauser, request_timeout=opts.timeout,
                max_failures=max(5, opts.n), size=opts.size, label=opts.nonce, max_tokens=opts.max_tokens,
                progress=tick,
            )  # fmt: skip
        pauser.resume_all()
        # records are written after a grace period: collect them before the server stops
        found = tail.wait([r["id"] for r in run.rows if r["arm"] == "on" and r.get("id")], st.records_timeout)
    finally:
        pauser.resume_all()
        for srv in servers.values():
            srv.stop()
    for r in run.rows:
        rec = found.get(r["id"]) if r["arm"] == "on" and r.get("id") else None
        line: dict[str, Any] = dict(rec) if rec else {"rid": r.get("id")}
        line["bench"] = _overhead_bench(r, rec is not None, cfg.label)
        out.lines.append(line)
    for f in run.failures:
        out.lines.append({"rid": None, "bench": _overhead_bench(f, False, cfg.label)})
    out.overhead = {kind: paired_summary(run.rows, kind) for kind in KINDS}
    out.overhead["health_last_round"] = run.health[-1] if run.health else None


def _overhead_bench(r: dict[str, Any], record: bool, target: str) -> dict[str, Any]:
    from .client import usage_tokens

    ok = "error" not in r
    return {
        "experiment": "overhead",
        "variant": f"{r['kind']}: plugin {r['arm']}",
        "variant_index": ARMS.index(r["arm"]),
        "group": r["kind"],
        "round": r["round"],
        "target": target,
        "arm": r["arm"],
        "client_ttft_s": r.get("ttft_s"),
        "client_e2e_s": r.get("e2e_s"),
        "ok": ok,
        "error": None if ok else r["error"],
        "record": record,
        "usage": usage_tokens(r.get("usage")) if r.get("usage") else None,
    }


def overhead_notes(summary: dict[str, Any]) -> list[str]:
    out = ["== overhead: TTFT plugin on / off (median ratio, bootstrap 95% CI over paired rounds)"]
    for kind in KINDS:
        s = summary.get(kind) or {}
        if not s.get("n_pairs"):
            out.append(f"   {kind}: no complete pairs")
            continue
        lo, hi = s["ttft_ratio_ci95"]
        dlo, dhi = s["ttft_paired_delta_ci95_ms"]
        out.append(
            f"   {kind:<11} n={s['n_pairs']:<4} off {s['ttft_off_median_ms']:.1f} ms, on {s['ttft_on_median_ms']:.1f} ms, "
            f"ratio {s['ttft_ratio_on_off']:.3f} [{lo:.3f}, {hi:.3f}], paired delta "
            f"{s['ttft_paired_delta_median_ms']:+.2f} ms [{dlo:+.2f}, {dhi:+.2f}]"
        )
    return out


def run(st: Settings) -> Outcome:
    out = Outcome()
    per_target = [e for e in st.experiments if e in ex.PER_TARGET]
    if per_target:
        if st.url:
            if st.records is None:
                out.notes.append(
                    "note: no --records given: client-side TTFT only (pass the server's SGLANG_MMTRACE_JSONL)"
                )
            run_per_target(Target(st.url, st.url, st.records), per_target, st, out)
        else:
            for cfg in st.launch or [default_config(st.gpu)]:
                with launched(cfg, _folder(st), st.gpu, st.health_timeout) as target:
                    run_per_target(target, per_target, st, out)
    launched_here = [e for e in st.experiments if e in ("caches", "overhead") or (e == "transport" and st.gpu)]
    if st.url and launched_here:
        out.notes.append(f"note: {', '.join(launched_here)} launched their own servers (not {st.url})")
    if "caches" in st.experiments:
        run_configs("caches", caches_configs(st), st, out)
    if "transport" in st.experiments:
        if not st.gpu:
            out.notes.append("transport: skipped, it needs a GPU (--mm-feature-transport cuda_ipc is CUDA-only)")
        else:
            base = st.launch[0] if st.launch else default_config(True)
            configs = [base.with_args("--mm-feature-transport", m, label=m) for m in ("cpu", "cuda_ipc")]
            run_configs("transport", configs, st, out)
    if "overhead" in st.experiments:
        run_overhead(st, out)
        out.notes += overhead_notes(out.overhead)
    expected = [ln for ln in out.lines if ln["bench"]["ok"] and ln["bench"].get("arm") != "off"]
    missing = sum(1 for ln in expected if not ln["bench"]["record"])
    if missing and (st.records is not None or not st.url):
        out.notes.append(f"note: {missing} of {len(expected)} successful requests have no plugin record")
    return out
