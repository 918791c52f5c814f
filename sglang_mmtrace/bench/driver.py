"""Run the chosen experiments on their targets, one server at a time; collect output lines, results, notes.

Per-target experiments run against one server: the ``--url``, or each ``--launch`` configuration in
turn (plugin installed). Among them the switch experiments (``overhead``, ``ablation``,
``throughput``) flip that server's runtime switch and put it back as they found it. ``caches`` and
``transport`` launch one configuration after another; ``overhead-crossover`` launches server pairs,
one server after the other.
"""

from __future__ import annotations

import math
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ..report.scaling import format_resolution, resolution_summary
from ..report.tail import format_tail, tail_summary
from . import ablation as abl
from . import experiments as ex
from . import overhead as oh
from . import throughput as tp
from .client import host_port
from .procs import pid_listening_on
from .records import RecordsTail
from .runner import Sent, run_concurrent, run_sequential, to_lines, wait_idle
from .switchctl import Flipper, set_trace_level
from .targets import LaunchConfig, Target, default_config, launched, make_server, server_on_gpu


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
    server_pid: int | None = None  # throughput with --url: the API process (default: found by port)


@dataclass
class Outcome:
    lines: list[dict[str, Any]] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    results: dict[str, Any] = field(default_factory=dict)  # experiment -> its summary (overhead, ablation, ...)


ANALYSES: dict[str, tuple[Callable[[list[dict[str, Any]]], Any], Callable[[Any], list[str]]]] = {
    "resolution": (resolution_summary, format_resolution),
    "concurrency": (tail_summary, format_tail),
}
"""Per-target experiments whose lines get an analysis: (summary of the lines, its text lines)."""


def log(msg: str) -> None:
    print(f"[bench] {msg}", file=sys.stderr, flush=True)


def run_per_target(target: Target, names: list[str], st: Settings, out: Outcome) -> None:
    """new-vs-repeat, order, resolution, concurrency and the switch experiments against one server (url
    or launched); resolution and concurrency leave their analyses in ``out.results`` and the notes."""
    opts = st.opts
    for name in names:
        if name in ex.SWITCHED:
            run_switched(target, name, st, out)
            continue
        tail = RecordsTail(target.records)
        sent: list[Sent] = []
        if name == "new-vs-repeat":
            sent = run_sequential(target, ex.new_vs_repeat(opts), opts, name)
        elif name == "order":
            sent = run_sequential(target, ex.order(opts), opts, name)
        elif name == "resolution":
            log(
                f"resolution: encoding the images of {len(opts.resolution_shapes())} shapes x {opts.n_for(name)} rounds"
            )
            sent = run_sequential(target, ex.resolution(opts), opts, name)
        elif name == "concurrency":
            warm, levels = ex.concurrency_levels(opts)
            sent = run_sequential(target, warm, opts, "concurrency warm-up")
            for c, plan in levels:
                wait_idle()
                sent += run_concurrent(target, plan, c, opts, f"concurrency {c}")
        lines = to_lines(sent, tail, target.label, timeout=st.records_timeout)
        out.lines += lines
        log(f"{name} on '{target.label}': {sum(1 for p, _ in sent if not p.warmup)} requests")
        if name in ANALYSES:
            analyse, describe = ANALYSES[name]
            result = analyse(lines)
            out.results[_result_key(out, name, target)] = result
            out.notes += describe(result)


def _result_key(out: Outcome, name: str, target: Target) -> str:
    return name if name not in out.results else f"{name} [{target.label}]"


def run_switched(target: Target, name: str, st: Settings, out: Outcome) -> None:
    """overhead / ablation / throughput on one instance: flip its runtime switch (SwitchError if it
    has none), restore the switch as found, keep the summary in ``out.results``."""
    opts = st.opts
    flipper = Flipper(target.base_url)
    tail = RecordsTail(target.records)
    workload = oh.workload_for(opts, name)
    gpu = target.gpu
    if name == "overhead" and opts.n is None and gpu is None:
        gpu = server_on_gpu(target.base_url)
        log(f"overhead: '{target.label}' reports {'no device' if gpu is None else 'a GPU' if gpu else 'the CPU'}")
    n = opts.n_for(name, gpu=gpu is not False)  # unknown: the GPU's rounds, the ones that resolve a cost
    sent: list[Sent] = []
    result: dict[str, Any] = {}
    try:
        if name == "overhead":
            plan = oh.paired_plan(
                name,
                n,
                opts.warmup,
                workload,
                control=opts.control,
                peer=opts.peer,
                between=opts.between,
                lead_in=opts.lead_in,
            )
            arms = "on/off" + ("/off (A/A control)" if opts.control else "") + ("/SGLang tracing" if opts.peer else "")
            arms += "/between windows" if opts.between else ""
            log(
                f"overhead on '{target.label}': {n} rounds x {len(oh.KINDS)} kinds x {arms}, switch set before each request"
                + (", each after an untimed lead-in of its arm" if opts.lead_in else "")
            )
        elif name == "ablation":
            plan = abl.ablation_plan(n, min(opts.warmup, 1), workload, opts.seed, opts.ablation_parts)
            log(
                f"ablation on '{target.label}': {n} rounds x {len(oh.KINDS)} kinds x {len(opts.ablation_parts) + 1} levels"
            )
        else:
            plan = []
            pid = target.pid or st.server_pid or pid_listening_on(host_port(target.base_url)[1])
            result = tp.run_throughput(target.base_url, flipper, opts, pid)
        if plan:
            peer = name == "overhead" and opts.peer
            route = oh.switch_route(flipper, gap_s=opts.gap_s, keep_records=opts.keep_records, peer=peer)
            sent = run_sequential(target, plan, opts, name, route=route, max_failures=max(5, len(plan) // 20))
    finally:
        flipper.restore()
        if name == "overhead" and opts.peer:  # SGLang's tracing back at its default level
            set_trace_level(target.base_url, oh.PEER_TRACE_LEVEL)
    if name == "throughput":
        out.notes += tp.notes(result)
    else:
        lines = to_lines(sent, tail, target.label, timeout=st.records_timeout)
        out.lines += lines
        if name == "overhead":
            result = oh.summary(lines)
            out.notes += oh.notes(result, f"overhead on '{target.label}' (same instance, runtime switch)")
        else:
            result = abl.ablation_summary(lines, opts.ablation_parts)
            result["markdown"] = abl.ablation_markdown(result)
            out.notes += [f"== ablation on '{target.label}' (same instance, runtime switch)", result["markdown"]]
            result["records"] = {
                "expected": sum(1 for ln in lines if ln["bench"]["ok"] and ln["bench"]["expect_record"]),
                "expected_found": sum(1 for ln in lines if ln["bench"]["ok"] and ln["bench"]["expect_record"] and ln["bench"]["record"]),
                "unexpected_found": sum(1 for ln in lines if ln["bench"]["ok"] and not ln["bench"]["expect_record"] and ln["bench"]["record"]),
            }  # fmt: skip
        result["rounds_planned"] = n
        result["requests_sent"] = sum(1 for p, _ in sent if not p.warmup)
    result["target"] = target.label
    result["records_known"] = target.records is not None
    result["switch"] = flipper.stats()
    result["gap_s"] = opts.gap_s
    result["keep_records"] = opts.keep_records
    out.results[_result_key(out, name, target)] = result


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


def run_crossover(st: Settings, out: Outcome, after_launch: Callable[[Outcome], None] | None = None) -> None:
    """overhead-crossover: server pairs (SGLANG_MMTRACE=1 / =0), started one after the other, the
    orientation (which arm's server starts first) alternating over ``2 * launches`` launches; then
    the A/A control (both =0) the same way. Stops launching when the deadline would be passed.
    ``out.results["overhead-crossover"]`` is brought up to date after every launch, and
    ``after_launch(out)`` called (a driver with a hard time limit saves it there)."""
    name = "overhead-crossover"
    cfg = st.launch[0] if st.launch else default_config(st.gpu)
    folder = _folder(st)
    opts = st.opts
    n = opts.n_for(name)
    workload = oh.workload_for(opts, name)
    lines: list[dict[str, Any]] = []
    launches: list[dict[str, Any]] = []
    longest = 0.0
    runs = [run for run, wanted in (("ab", opts.ab), ("aa", opts.aa)) if wanted]
    schedule = [(r, r == "aa", j) for r in runs for j in range(2 * opts.launches)]
    for run_name, control, j in schedule:
        orientation = oh.ORIENTATIONS[j % 2]
        if opts.deadline is not None and time.time() + 1.1 * longest > opts.deadline:
            out.notes.append(f"note: overhead-crossover stopped before {run_name} launch {j}: deadline")
            break

        def make(arm: str, run_name: str = run_name, control: bool = control, j: int = j) -> Any:
            on = arm == "on" and not control
            return make_server(cfg, folder, st.gpu, on, st.health_timeout, name=f"crossover-{run_name}{j}-{arm}")

        extra = {"run": run_name, "launch": len(launches), "orientation": orientation}
        if control:
            extra["expect_record"] = False
        plan = oh.paired_plan(name, n, opts.warmup, workload, extra, slot_tag=f" {run_name}{j}")
        t0 = time.monotonic()
        try:
            lr = oh.run_launch(
                make, "on" if orientation == "on-first" else "off", plan, opts, st.pause_other,
                f"crossover {run_name} launch {j} ({orientation})", records_timeout=st.records_timeout,
            )  # fmt: skip
        except (RuntimeError, TimeoutError, OSError) as exc:  # a pair that did not start: note it, go on
            out.notes.append(f"note: overhead-crossover {run_name} launch {j} failed: {str(exc)[:300]}")
            launches.append({"run": run_name, "orientation": orientation, "error": str(exc)[:2000]})
            continue
        longest = max(longest, time.monotonic() - t0)
        lines += lr.lines
        launches.append({"run": run_name, "orientation": orientation, "startup_s": lr.startup_s,
                         "health_last_round": lr.health[-1] if lr.health else None})  # fmt: skip
        out.results[name] = {
            **oh.crossover_summary(lines),
            "launches": launches,
            "rounds_per_launch": n,
            "config": cfg.label,
        }
        if after_launch is not None:
            after_launch(out)
    out.lines += lines
    out.results.setdefault(name, {"launches": launches, "rounds_per_launch": n, "config": cfg.label})
    out.notes += oh.crossover_notes(out.results[name])


def run(st: Settings) -> Outcome:
    out = Outcome()
    per_target = [e for e in st.experiments if e in ex.PER_TARGET]
    if per_target:
        if st.url:
            if st.records is None:
                out.notes.append(
                    "note: no --records given: client-side TTFT only (pass the server's SGLANG_MMTRACE_JSONL)"
                )
            run_per_target(Target(st.url, st.url, st.records, st.server_pid), per_target, st, out)
        else:
            for cfg in st.launch or [default_config(st.gpu)]:
                with launched(cfg, _folder(st), st.gpu, st.health_timeout) as target:
                    run_per_target(target, per_target, st, out)
    launched_here = [
        e for e in st.experiments if e in ("caches", "overhead-crossover") or (e == "transport" and st.gpu)
    ]
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
    if "overhead-crossover" in st.experiments:
        run_crossover(st, out)
    ok = [ln for ln in out.lines if ln["bench"]["ok"]]
    expected = [ln for ln in ok if ln["bench"].get("expect_record", True)]
    missing = sum(1 for ln in expected if not ln["bench"]["record"])
    if missing and (st.records is not None or not st.url):
        out.notes.append(f"note: {missing} of {len(expected)} successful requests have no plugin record")
    unexpected = sum(1 for ln in ok if not ln["bench"].get("expect_record", True) and ln["bench"]["record"])
    if unexpected:
        out.notes.append(f"note: {unexpected} requests sent with the plugin (or its jsonl part) off have a record")
    return out


def estimate_rounds(seconds: float, per_request_s: float, requests_per_round: int, wanted: int) -> int:
    """How many rounds fit into ``seconds`` (at least 1, at most ``wanted``)."""
    if per_request_s <= 0:
        return wanted
    return max(1, min(wanted, math.floor(seconds / (per_request_s * requests_per_round))))
