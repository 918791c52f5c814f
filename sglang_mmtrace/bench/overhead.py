"""Plugin on vs off, one request in flight, the arms interleaved request by request.

Two ways to get the arms, one plan and one analysis:

- ``overhead`` (same instance): one server with the plugin installed; the plugin's runtime switch
  (``POST /mmtrace/enabled``) is flipped before each request, outside the timed region, and every
  request starts the same idle gap after the previous one ended (``switch_route``); ``keep_records``
  also waits, after a request with records on, until its record is built. Instance-to-instance
  differences (two servers of one configuration can differ in TTFT by far more than the plugin's
  cost) cancel.
- ``overhead-crossover`` (installed vs not installed at all): two servers, ``SGLANG_MMTRACE=1`` and
  ``=0``, started one after the other and alive together; the server not being measured is paused
  (SIGSTOP) on a CPU. Launches alternate the orientation (which arm's server starts first); each
  orientation's ratio and their geometric mean are reported, and an A/A run (both servers
  ``SGLANG_MMTRACE=0``) the same way for the noise floor. ``benchmarks/ttft_ab.py`` runs one launch.

Plan (``paired_plan``): per round, for each kind (``new_image``: a new 640x480 JPEG per request;
``same_image``: one fixed JPEG repeated; ``text``: a new text prompt per request), one request per
arm, the leading arm alternating strictly by round (even rounds: on first). Untimed warm-up rounds
come first. With ``lead_in`` (same instance) an untimed request of the same arm and kind goes before
each timed one, so each timed request runs in its arm's steady state. With ``control`` each round also sends a third request per kind, ``ctl``, with the
plugin off like ``off``: the A/A control on the same instance (the three arms' order rotates by
round). With ``peer`` each round also sends a request per kind with the plugin off and SGLang's own
tracing on (``sglang``: a server started with ``--enable-trace``, its level set per request with
``GET /set_trace_level``, ``PEER_TRACE_LEVEL`` for this arm and 0 for the others), so the plugin's
cost is set against the cost of the tracing SGLang ships, in the same rounds on the same instance.
With ``between`` each round also sends a request per kind between tracing windows (``between``: the
switch handed to windows, ``POST /mmtrace/enabled {"windows": ...}``, whose window is closed then and
stays closed past the request, ``switchctl.closed_windows``): what a server set up for tracing windows
pays outside a window, which should be what it pays with the switch off.

Analysis of the same-instance run (``summary``): per kind, over the rounds in which every arm
answered, the paired delta: the median over rounds of TTFT(on) - TTFT(off) in microseconds with a
bootstrap 95% interval over rounds, and the A/A of the same rounds, TTFT(ctl) - TTFT(off), the same
way; each also as a share of the off median. A per-request cost is an absolute time, so it is
stated in µs; the A/A is the method's own noise: a cost is resolved only where the A/A's interval
holds 0. Each kind is judged against ``TARGET_DELTA_US`` (``target_verdict``). The two-server
crossover keeps the ratio of medians (``ratio_summary``): there the estimator is the geometric mean
of the orientations' ratios, which cancels a server-position effect that scales with TTFT.
With the peer arm each kind also gets SGLang's tracing cost, TTFT(sglang) - TTFT(off), and the
ratio of the plugin's delta to it with a bootstrap interval resampling rounds (both deltas from the
same rounds), judged against ``TARGET_PEER_RATIO`` (``peer_verdict``): absolute costs move with the
host, their ratio on one instance does not.
With the between-windows arm each kind also gets its cost, TTFT(between) - TTFT(off), and the verdict
``between_within_aa`` (``between_verdict``): its point estimate inside the A/A's 95% interval, and that
interval holding 0.
"""

from __future__ import annotations

import contextlib
import os
import signal
import sys
import time
import zlib
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from functools import partial
from typing import Any

import numpy as np

from ..harness import data_url, image_message, make_image
from ..harness.server import CpuServer, session_pids
from ..report.analysis import quantile
from .experiments import OVERHEAD_ROUNDS_GPU, OVERHEAD_SIZE, Options, Planned
from .procs import cpu_seconds, rss_mb
from .records import RecordsTail
from .runner import run_sequential, to_lines
from .stats import bootstrap_median_ci, geomean_ratio_ci, paired_ratio_ci
from .switchctl import PARTS, Flipper, closed_windows, set_trace_level

KINDS = ("new_image", "same_image", "text")
QUESTION = "Describe this image in one word."
MAX_TOKENS = 8
ARMS = ("off", "on")
CONTROL = "ctl"  # the same-instance A/A control's second 'off' arm
PEER = "sglang"  # the plugin off, SGLang's own tracing on (a server started with --enable-trace)
BETWEEN = "between"  # the switch handed to tracing windows, the request served between two of them
ALL_ARMS = (*ARMS, CONTROL, PEER, BETWEEN)
PEER_TRACE_LEVEL = 3  # SGLang's default trace level (SGLANG_TRACE_LEVEL unset)
ORIENTATIONS = ("on-first", "off-first")  # which arm's server was started first
# The paired delta's targets per kind, in µs (issue 43; set for a GPU with the tiny Qwen3-VL): a point
# estimate, judged only with the A/A of the same rounds holding 0 and at least TARGET_ROUNDS rounds.
TARGET_DELTA_US = {"new_image": 200.0, "same_image": 150.0, "text": 80.0}
TARGET_ROUNDS = OVERHEAD_ROUNDS_GPU
# The plugin's paired delta over SGLang's own tracing's (level PEER_TRACE_LEVEL) in the same rounds,
# per kind (issue 43: the plugin at most half of SGLang's tracing); a point estimate, judged with the
# same A/A and rounds conditions and only where SGLang's tracing cost is resolved (its interval above 0).
TARGET_PEER_RATIO = 0.5


class Workload:
    """The content of the requests. Every ``new_image`` / ``text`` request gets its own image /
    prompt (keyed by round and slot, labelled with the run's nonce), so it is new to the server
    even when both arms hit the same instance; ``same_image`` is one fixed JPEG."""

    def __init__(self, seed: int, nonce: str, size: tuple[int, int] = OVERHEAD_SIZE) -> None:
        self.seed, self.nonce, self.size = seed, nonce, size
        self.same_url = self._image("same")

    def _image(self, key: str) -> str:
        s = (self.seed * 7919 + zlib.crc32(key.encode())) & 0x7FFFFFFF
        return data_url(make_image(*self.size, s, fmt="JPEG", label=f"{self.nonce} {key}"), fmt="JPEG")

    def messages(self, kind: str, round_no: int, slot: str) -> list[dict[str, Any]]:
        if kind == "same_image":
            return [image_message(QUESTION, [self.same_url])]
        if kind == "new_image":
            return [image_message(QUESTION, [self._image(f"{round_no} {slot}")])]
        if kind == "text":
            return [{"role": "user", "content": f"{self.nonce} {round_no} {slot}: name one colour and one shape."}]
        raise ValueError(f"unknown kind {kind!r}")


def workload_for(opts: Options, experiment: str) -> Workload:
    return Workload(opts.seed, opts.nonce, opts.size_for(experiment))


def arm_order(round_no: int, control: bool = False, peer: bool = False, between: bool = False) -> tuple[str, ...]:
    """The leading arm alternates strictly by round: even rounds on first, odd rounds off first. With
    a third arm (the control, the peer or the between-windows arm) the three arms rotate, so each
    pair's arms lead equally often over six rounds. With n >= 4 arms they rotate, in reverse order
    every other block of n rounds: over 2n rounds each arm holds each position twice and each pair's
    arms lead equally often."""
    extra = tuple(a for a, wanted in ((CONTROL, control), (PEER, peer), (BETWEEN, between)) if wanted)
    if len(extra) >= 2:
        arms: tuple[str, ...] = ("on", "off", *extra)
        n = len(arms)
        if (round_no // n) % 2:
            arms = arms[::-1]
        k = round_no % n
        return arms[k:] + arms[:k]
    if extra:
        arms = ("on", "off", *extra) if round_no % 2 == 0 else ("off", "on", *extra)
        k = (round_no // 2) % 3
        return arms[k:] + arms[:k]
    return ("on", "off") if round_no % 2 == 0 else ("off", "on")


def arm_label(arm: str) -> str:
    if arm == CONTROL:
        return "plugin off (A/A control)"
    if arm == PEER:
        return f"plugin off, SGLang tracing at level {PEER_TRACE_LEVEL}"
    if arm == BETWEEN:
        return "plugin between tracing windows"
    return f"plugin {arm}"


def paired_plan(
    experiment: str,
    rounds: int,
    warmup_rounds: int,
    workload: Workload,
    extra: dict[str, Any] | None = None,
    slot_tag: str = "",
    control: bool = False,
    peer: bool = False,
    between: bool = False,
    lead_in: bool = False,
) -> list[Planned]:
    """Warm-up rounds (round < 0, excluded), then ``rounds`` rounds: each kind, both arms (and the
    ``control``, ``peer`` and ``between`` arms), in ``arm_order``. ``extra`` goes into every request (launch, orientation, ...);
    an 'off' request expects no record, an 'on' request one (``extra`` may override ``expect_record``).

    ``lead_in``: before each timed request an untimed one of the same arm and kind (``new_image``: an
    image of its own), so that every timed request follows one of its own arm, as on a server whose
    switch is not flipped per request. Why: the request right after another arm's pays for what that
    request left behind (its after-work; the flip between them adds little: the interpreter's caches
    of the classes whose functions it swapped), and with the arms alternating request by request each
    arm follows a fixed set of other arms, so that carry-over lands unevenly on the arms (an A/A off
    its zero). The lead-ins double the requests; the arms of a kind stay next to each other, which
    keeps their pairing (grouping a round's requests by arm instead made the paired differences as
    noisy as the TTFTs themselves)."""
    plan = []
    for r in range(-warmup_rounds, rounds):
        order = arm_order(r, control, peer, between)
        for kind in KINDS:
            for pos, arm in enumerate(order):
                info = {"kind": kind, "arm": arm, "order": pos, "expect_record": arm == "on", **(extra or {})}
                if lead_in:
                    plan.append(_planned(experiment, workload, kind, arm, r, f"{arm} lead-in{slot_tag}", info, True))
                plan.append(_planned(experiment, workload, kind, arm, r, f"{arm}{slot_tag}", info, r < 0))
    return plan


def _planned(
    experiment: str, workload: Workload, kind: str, arm: str, r: int, slot: str, info: dict[str, Any], warmup: bool
) -> Planned:
    """One request of ``paired_plan``: ``warmup`` ones are sent but never timed (runner drops them). Its
    messages are made when it is sent (``Planned.messages``), not with the plan."""
    return Planned(
        experiment,
        f"{kind}: {arm_label(arm)}",
        ALL_ARMS.index(arm),
        kind,
        partial(workload.messages, kind, r, slot),
        r,
        warmup,
        info,
    )


# -- same instance: the runtime switch ------------------------------------------------------------


def builds_record(p: Planned) -> bool:
    """The request runs with the plugin's ``records`` part on (the collector builds its record)."""
    parts = p.extra.get("parts")
    return p.extra.get("arm") == "on" and (parts is None or "records" in parts)


def switch_route(
    flipper: Flipper,
    gap_s: float = 0.0,
    keep_records: bool = False,
    parts: tuple[str, ...] = PARTS,
    peer: bool = False,
) -> Callable[[Planned], str]:
    """Before each request, outside the timed region: with ``keep_records``, if the previous request
    ran with records on, wait until the plugin has built its record (so its record-building does not
    overlap the next request, of either arm; a record is kept anyway: the plugin builds it under the
    setting of the generation the request ran in). Then set the switch for this request's arm
    (``extra["parts"]`` for an ablation level; for the between-windows arm, tracing windows closed now and
    past the request, ``closed_windows``, kept in ``extra["windows"]``); with ``peer`` also SGLang's trace level
    (``PEER_TRACE_LEVEL`` for the peer arm, 0 for the others; sent only when it changes). Then wait
    until ``gap_s`` has passed since the previous response ended, so every timed request, whatever its
    arm, starts after the same idle gap (an untimed one goes at once). Keeps the switch's generation (and the trace level) in ``extra``."""
    prev: dict[str, Any] = {}

    def route(p: Planned) -> str:
        t_prev_end = time.monotonic()  # run_sequential routes right after the previous response ended
        if prev.get("records_before") is not None:
            flipper.wait_records(prev["records_before"] + 1)
        on = p.extra["arm"] == "on"
        if p.extra["arm"] == BETWEEN:
            answer = flipper.set_windows(closed_windows())
            p.extra["windows"] = answer["windows"]["schedule"]
        else:
            answer = flipper.set(tuple(p.extra.get("parts") or parts) if on else None)
        p.extra["generation"] = answer.get("generation")
        if peer:
            level = PEER_TRACE_LEVEL if p.extra["arm"] == PEER else 0
            if prev.get("trace_level") != level:
                set_trace_level(flipper.base_url, level)
                prev["trace_level"] = level
            p.extra["trace_level"] = level
        prev["records_before"] = flipper.records() if keep_records and builds_record(p) else None
        # an untimed request (warm-up, lead-in) needs no idle time before it: the timed one after it gets its own
        time.sleep(max(0.0, t_prev_end + (0.0 if p.warmup else gap_s) - time.monotonic()))
        return flipper.base_url

    return route


# -- two servers ----------------------------------------------------------------------------------


def start_pair(make: Callable[[str], CpuServer], first: str = "off") -> dict[str, CpuServer]:
    """Start ``make(first)``, wait until it is healthy, then the other arm's server (never both at
    once: simultaneous starts contend for CPU, and on one GPU fail SGLang's KV-cache memory check).
    Stops the started one if the other fails. Returns arm -> server in ``ARMS`` order."""
    if first not in ARMS:
        raise ValueError(f"first must be one of {ARMS}, got {first!r}")
    servers: dict[str, CpuServer] = {}
    try:
        for arm in (first, *(a for a in ARMS if a != first)):
            servers[arm] = make(arm)
            servers[arm].start()
    except BaseException:
        for srv in servers.values():
            srv.stop()
        raise
    return {arm: servers[arm] for arm in ARMS}


class Pauser:
    """SIGSTOP the server not being measured, SIGCONT it before its own request.

    An idle CPU SGLang scheduler polls (about half a core here), so on 2 cores the idle server
    competes with the one being measured; pausing it takes that shared noise out of both arms.
    """

    def __init__(self, servers: dict[str, CpuServer], enabled: bool, settle_s: float) -> None:
        self.pids = {k: session_pids(s.process.pid) if s.process else [] for k, s in servers.items()}
        self.enabled = enabled
        self.settle_s = settle_s
        self.stopped: set[str] = set()

    def _signal(self, arm: str, sig: signal.Signals) -> None:
        for pid in self.pids[arm]:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, sig)

    def only(self, arm: str) -> None:
        if not self.enabled:
            return
        for other in self.pids:
            if other != arm and other not in self.stopped:
                self._signal(other, signal.SIGSTOP)
                self.stopped.add(other)
        if arm in self.stopped:
            self._signal(arm, signal.SIGCONT)
            self.stopped.discard(arm)
            time.sleep(self.settle_s)

    def resume_all(self) -> None:
        for arm in list(self.stopped):
            self._signal(arm, signal.SIGCONT)
        self.stopped.clear()


def server_health(servers: dict[str, CpuServer]) -> dict[str, dict[str, float]]:
    """CPU seconds and RSS of each server's processes (to spot a server degrading during the run)."""
    out = {}
    for arm, srv in servers.items():
        pids = session_pids(srv.process.pid) if srv.process else []
        cpu = sum(cpu_seconds(p) or 0.0 for p in pids)
        rss = sum(rss_mb(p) or 0.0 for p in pids)
        out[arm] = {"cpu_s": round(cpu, 2), "rss_mb": round(rss, 1)}
    return out


class ServerRouter:
    """Route a request to its arm's server (resuming it, pausing the other); one health sample
    (load average, each server's CPU seconds and RSS) when a measured round ends."""

    def __init__(self, servers: dict[str, CpuServer], pauser: Pauser) -> None:
        self.servers, self.pauser = servers, pauser
        self.round: int | None = None
        self.health: list[dict[str, Any]] = []

    def sample(self) -> None:
        if self.round is not None and self.round >= 0:
            self.health.append({"round": self.round, "loadavg_1m": os.getloadavg()[0], **server_health(self.servers)})

    def __call__(self, p: Planned) -> str:
        if p.round != self.round:
            self.sample()
            self.round = p.round
        self.pauser.only(p.extra["arm"])
        return self.servers[p.extra["arm"]].base_url


@dataclass
class LaunchRun:
    """One launch of the server pair: its output lines, health samples and start-up times."""

    lines: list[dict[str, Any]] = field(default_factory=list)
    health: list[dict[str, Any]] = field(default_factory=list)
    startup_s: dict[str, float] = field(default_factory=dict)


def run_launch(
    make: Callable[[str], CpuServer],
    first: str,
    plan: list[Planned],
    opts: Options,
    pause: bool,
    desc: str,
    records_timeout: float = 30.0,
    settle_s: float = 0.1,
    log: Callable[[str], None] = lambda s: print(s, file=sys.stderr, flush=True),
) -> LaunchRun:
    """Start the pair (``first``'s server first), send ``plan`` through a ServerRouter, collect the
    'on' server's records while it still runs, stop both."""
    log(f"[overhead] {desc}: starting the '{first}' server, then the other ...")
    servers = start_pair(make, first)
    run = LaunchRun(startup_s={k: round(s.startup_seconds or 0.0, 1) for k, s in servers.items()})
    log(f"[overhead] {desc}: healthy after {run.startup_s} s")
    tail = RecordsTail(servers["on"].jsonl_path)
    pauser = Pauser(servers, enabled=pause, settle_s=settle_s)
    router = ServerRouter(servers, pauser)
    try:
        sent = run_sequential(None, plan, opts, desc, route=router, max_failures=max(5, len(plan) // 20))
        router.round = max((p.round for p, _ in sent), default=None)
        router.sample()
        pauser.resume_all()
        # records are written after a grace period: collect them before the server stops
        run.lines = to_lines(sent, tail, desc, timeout=records_timeout)
    finally:
        pauser.resume_all()
        for srv in servers.values():
            srv.stop()
    run.health = router.health
    return run


# -- analysis -------------------------------------------------------------------------------------


def rounds(lines: Iterable[dict[str, Any]], kind: str, arms: tuple[str, ...] = ARMS) -> list[dict[str, dict[str, Any]]]:
    """Arm -> ``bench`` dict of one kind, per (launch, round) in order, for the rounds in which every
    one of ``arms`` answered (a failed request is no sample, and a round short of an arm no round)."""
    by: dict[tuple[Any, int], dict[str, dict[str, Any]]] = {}
    for ln in lines:
        b = ln["bench"]
        if b.get("kind") == kind and b["ok"] and b.get("client_ttft_s") is not None:
            by.setdefault((b.get("launch", 0), b["round"]), {})[b["arm"]] = b
    return [v for _, v in sorted(by.items()) if all(a in v for a in arms)]


def pairs(
    lines: Iterable[dict[str, Any]], kind: str, arms: tuple[str, str] = ARMS
) -> list[tuple[dict[str, Any], dict[str, Any]]]:
    """(off, on) ``bench`` dicts of one kind, per (launch, round) where both arms answered
    (``arms``: another pair of arms, e.g. ``("off", CONTROL)`` for the A/A control)."""
    first, second = arms
    return [(v[first], v[second]) for v in rounds(lines, kind, arms)]


def ttft_ms(prs: list[tuple[dict[str, Any], dict[str, Any]]]) -> tuple[np.ndarray, np.ndarray]:
    """Client TTFT in ms of the first and of the second arm of ``pairs``' output, round by round: what
    every paired statistic here and in the result folders' scripts starts from."""
    return (
        np.array([a["client_ttft_s"] for a, _ in prs]) * 1000,
        np.array([b["client_ttft_s"] for _, b in prs]) * 1000,
    )


def ratio_summary(lines: Iterable[dict[str, Any]], kind: str, arms: tuple[str, str] = ARMS) -> dict[str, Any]:
    """Two servers, off vs on, for one kind over the rounds where both arms answered: the paired
    ratio of medians with its bootstrap interval (the crossover's statistic) and the paired delta in
    ms (``arms``: see ``pairs``; the keys keep the names ``off``/``on`` for the first and second arm)."""
    prs = pairs(lines, kind, arms)
    if not prs:
        return {"n_pairs": 0}
    off, on = ttft_ms(prs)
    e2e_off = np.array([a["client_e2e_s"] for a, _ in prs]) * 1000
    e2e_on = np.array([b["client_e2e_s"] for _, b in prs]) * 1000
    delta = on - off
    lo, hi = bootstrap_median_ci(delta)
    ratio, rlo, rhi = paired_ratio_ci(off, on)
    med_off, med_on = float(np.median(off)), float(np.median(on))
    return {
        "n_pairs": len(prs),
        "ttft_off_median_ms": round(med_off, 3),
        "ttft_on_median_ms": round(med_on, 3),
        "ttft_ratio_on_off": round(ratio, 4),
        "ttft_ratio_ci95": [round(rlo, 4), round(rhi, 4)],
        "ttft_delta_median_ms": round(med_on - med_off, 3),
        "ttft_paired_delta_median_ms": round(float(np.median(delta)), 3),
        "ttft_paired_delta_ci95_ms": [round(lo, 3), round(hi, 3)],
        "ttft_off_p90_ms": round(quantile(off, 0.9), 3),
        "ttft_on_p90_ms": round(quantile(on, 0.9), 3),
        "e2e_off_median_ms": round(float(np.median(e2e_off)), 3),
        "e2e_on_median_ms": round(float(np.median(e2e_on)), 3),
        "e2e_ratio_on_off": round(float(np.median(e2e_on)) / float(np.median(e2e_off)), 4),
    }


def _effect(name: str, d_us: np.ndarray, off_median_us: float) -> tuple[dict[str, Any], bool]:
    """``<name>_us``: the median over rounds of the per-round differences ``d_us`` with its bootstrap
    95% interval, also as a share of the off median; and whether that interval holds 0."""
    m = float(np.median(d_us))
    lo, hi = bootstrap_median_ci(d_us)
    return {
        f"{name}_us": round(m, 1),
        f"{name}_ci_us": [round(lo, 1), round(hi, 1)],
        f"{name}_share_of_off": round(m / off_median_us, 6),
        f"{name}_share_ci": [round(lo / off_median_us, 6), round(hi / off_median_us, 6)],
    }, lo <= 0 <= hi


def _unjudged(s: dict[str, Any]) -> str | None:
    """Why the run cannot judge a target on ``s`` (a ``paired_delta`` result), or None: no A/A, an
    A/A whose interval excludes 0 (the method's noise is not under control), or fewer than
    ``TARGET_ROUNDS`` rounds."""
    if "aa_us" not in s:
        return "no A/A"
    if not s["aa_ci_contains_zero"]:
        return "the A/A's interval excludes 0"
    if s["n_rounds"] < TARGET_ROUNDS:
        return f"{s['n_rounds']} rounds < {TARGET_ROUNDS}"
    return None


def target_verdict(kind: str, s: dict[str, Any]) -> dict[str, Any]:
    """``s`` (a ``paired_delta`` result) against ``TARGET_DELTA_US[kind]``: ``met`` is None, with the
    reason in ``not_judged``, where the run cannot judge it (``_unjudged``)."""
    limit = TARGET_DELTA_US[kind]
    why = _unjudged(s)
    return {
        "delta_max_us": limit,
        "min_rounds": TARGET_ROUNDS,
        "met": None if why else bool(s["delta_us"] <= limit),
        "not_judged": why,
    }


def peer_verdict(s: dict[str, Any]) -> dict[str, Any]:
    """``s`` (a ``paired_delta`` result with the peer arm) against ``TARGET_PEER_RATIO``: ``met`` is
    None, with the reason in ``not_judged``, where the run cannot judge it (``_unjudged``, or SGLang's
    tracing cost not resolved: a ratio to a cost whose interval reaches 0 means nothing)."""
    why = _unjudged(s)
    if why is None and s["peer_ci_us"][0] <= 0:
        why = "SGLang's tracing cost is not resolved (its interval reaches 0)"
    return {
        "ratio_max": TARGET_PEER_RATIO,
        "min_rounds": TARGET_ROUNDS,
        "met": None if why else bool(s["plugin_over_peer"] <= TARGET_PEER_RATIO),
        "not_judged": why,
    }


def between_verdict(s: dict[str, Any]) -> bool | None:
    """Whether the between-windows arm costs what the A/A shows for ``s`` (a ``paired_delta`` result):
    its delta's point estimate lies inside the A/A's 95% interval and that interval holds 0 (an A/A
    that excludes 0 leaves the method's noise out of control: no). None without an A/A."""
    if "aa_us" not in s:
        return None
    lo, hi = s["aa_ci_us"]
    return bool(s["aa_ci_contains_zero"] and lo <= s["between_us"] <= hi)


def paired_delta(
    lines: Iterable[dict[str, Any]], kind: str, control: bool, peer: bool = False, between: bool = False
) -> dict[str, Any]:
    """One kind of a same-instance run, over the rounds in which every arm answered (with
    ``control`` the A/A's arm too, and with ``peer`` SGLang's tracing's, so every figure comes from
    the same rounds): the off and on medians, the paired delta on - off (``delta_*``), with
    ``control`` the A/A ctl - off (``aa_*``) and whether its interval holds 0, with ``peer`` SGLang's
    tracing cost sglang - off (``peer_*``) and the ratio of the two deltas' medians
    (``plugin_over_peer``, bootstrap interval over rounds) with its verdict (``peer_target``), and the
    target's verdict; with ``between`` the between-windows arm's cost between - off (``between_*``) and
    ``between_within_aa`` (``between_verdict``). Times in µs."""
    arms = (*ARMS, *((CONTROL,) if control else ()), *((PEER,) if peer else ()), *((BETWEEN,) if between else ()))
    rows = rounds(lines, kind, arms)
    if not rows:
        return {"n_rounds": 0}
    us = {arm: np.array([r[arm]["client_ttft_s"] for r in rows]) * 1e6 for arm in arms}
    off = float(np.median(us["off"]))
    delta, _ = _effect("delta", us["on"] - us["off"], off)
    out = {
        "n_rounds": len(rows),
        "off_median_us": round(off, 1),
        "on_median_us": round(float(np.median(us["on"])), 1),
        **delta,
    }
    if control:
        aa, holds_zero = _effect("aa", us[CONTROL] - us["off"], off)
        out.update(aa, aa_ci_contains_zero=holds_zero)
    out["target"] = target_verdict(kind, out)
    if peer:
        peer_d = us[PEER] - us["off"]
        effect, _ = _effect("peer", peer_d, off)
        ratio, lo, hi = paired_ratio_ci(peer_d, us["on"] - us["off"])
        out.update(effect, plugin_over_peer=round(ratio, 3), plugin_over_peer_ci=[round(lo, 3), round(hi, 3)])
        out["peer_target"] = peer_verdict(out)
    if between:
        effect, _ = _effect("between", us[BETWEEN] - us["off"], off)
        out.update(effect)
        out["between_within_aa"] = between_verdict(out)
    return out


def record_check(lines: Iterable[dict[str, Any]]) -> dict[str, int]:
    """How many answered requests of each arm have a plugin record (on: all expected; off, and every
    other arm, the plugin off there or between its windows: none)."""
    out = {"on_ok": 0, "on_with_record": 0, "off_ok": 0, "off_with_record": 0}
    for ln in lines:
        b = ln["bench"]
        if b["ok"] and b.get("arm") in ALL_ARMS:
            arm = "on" if b["arm"] == "on" else "off"
            out[f"{arm}_ok"] += 1
            out[f"{arm}_with_record"] += bool(b["record"])
    return out


def plugin_vs_client(lines: Iterable[dict[str, Any]]) -> dict[str, Any]:
    """The plugin's own TTFT next to the client's, medians over the 'on' requests with a record."""
    lines = list(lines)
    out: dict[str, Any] = {}
    for kind in KINDS:
        got = [
            (ln["bench"]["client_ttft_s"] * 1000, ln["ttft_s"] * 1000)
            for ln in lines
            if ln["bench"].get("kind") == kind and ln["bench"]["record"] and ln.get("ttft_s") is not None
        ]
        out[kind] = {
            "matched": len(got),
            "client_ttft_median_ms": round(float(np.median([c for c, _ in got])), 3) if got else None,
            "plugin_ttft_median_ms": round(float(np.median([p for _, p in got])), 3) if got else None,
        }
    return out


def summary(lines: list[dict[str, Any]]) -> dict[str, Any]:
    """The same-instance result: per kind ``paired_delta`` (with the A/A where the lines hold a
    control arm: ``aa``; with SGLang's tracing where they hold the peer arm: ``peer``; with the
    between-windows arm: ``between``), the record check (the peer and between-windows arms count as
    off: the plugin is off there), and the plugin's TTFT next to the client's."""
    control = any(ln["bench"].get("arm") == CONTROL for ln in lines)
    peer = any(ln["bench"].get("arm") == PEER for ln in lines)
    between = any(ln["bench"].get("arm") == BETWEEN for ln in lines)
    return {
        "kinds": {kind: paired_delta(lines, kind, control, peer, between) for kind in KINDS},
        "aa": control,
        "peer": peer,
        "between": between,
        "records": record_check(lines),
        "plugin_vs_client": plugin_vs_client(lines),
    }


def crossover_summary(lines: list[dict[str, Any]]) -> dict[str, Any]:
    """Per run (``ab``: on vs off; ``aa``: the A/A control): per orientation and per kind the paired
    summary pooled over that orientation's launches, each launch's ratio, and the geometric mean of
    the orientations' ratios with a bootstrap interval resampling rounds within each orientation."""
    out: dict[str, Any] = {}
    for run_name in ("ab", "aa"):
        sub = [ln for ln in lines if ln["bench"].get("run") == run_name]
        if not sub:
            continue
        res: dict[str, Any] = {"orientations": {}, "launches": {}, "geomean": {}}
        for o in ORIENTATIONS:
            lo = [ln for ln in sub if ln["bench"].get("orientation") == o]
            if lo:
                res["orientations"][o] = {kind: ratio_summary(lo, kind) for kind in KINDS}
        for launch in sorted({ln["bench"]["launch"] for ln in sub}):
            ll = [ln for ln in sub if ln["bench"]["launch"] == launch]
            res["launches"][str(launch)] = {
                "orientation": ll[0]["bench"]["orientation"],
                **{kind: ratio_summary(ll, kind).get("ttft_ratio_on_off") for kind in KINDS},
            }
        for kind in KINDS:
            strata = []
            for o in ORIENTATIONS:
                prs = pairs([ln for ln in sub if ln["bench"].get("orientation") == o], kind)
                if prs:
                    strata.append(ttft_ms(prs))
            g, glo, ghi = geomean_ratio_ci(strata)
            res["geomean"][kind] = {
                "orientations": len(strata),
                "ttft_ratio_on_off": round(g, 4),
                "ttft_ratio_ci95": [round(glo, 4), round(ghi, 4)],
            }
        res["records"] = record_check(sub)
        out[run_name] = res
    return out


def _ratio(s: dict[str, Any]) -> str:
    lo, hi = s["ttft_ratio_ci95"]
    return f"{s['ttft_ratio_on_off']:.3f} [{lo:.3f}, {hi:.3f}]"


def _us(s: dict[str, Any], name: str) -> str:
    lo, hi = s[f"{name}_ci_us"]
    return f"{s[f'{name}_us']:+.0f} [{lo:+.0f}, {hi:+.0f}] ({100 * s[f'{name}_share_of_off']:+.2f}%)"


def _verdict(kind: str, s: dict[str, Any]) -> str:
    t = s["target"]
    if t["met"] is None:
        return f"not judged ({t['not_judged']})"
    return f"{s['delta_us']:+.0f} us {'<=' if t['met'] else '>'} {t['delta_max_us']:.0f} us: {'met' if t['met'] else 'not met'}"


def _peer_verdict(s: dict[str, Any]) -> str:
    t = s["peer_target"]
    if t["met"] is None:
        return f"not judged ({t['not_judged']})"
    op = "<=" if t["met"] else ">"
    return f"{s['plugin_over_peer']:.2f} {op} {t['ratio_max']:.2f}: {'met' if t['met'] else 'not met'}"


def _within(s: dict[str, Any]) -> str:
    if s["between_within_aa"] is None:
        return "not judged (no A/A)"
    if not s["aa_ci_contains_zero"]:
        return "no (the A/A's interval excludes 0)"
    return "yes" if s["between_within_aa"] else "no"


def _over_peer(s: dict[str, Any]) -> str:
    lo, hi = s["plugin_over_peer_ci"]
    return f"{s['plugin_over_peer']:.2f} [{lo:.2f}, {hi:.2f}]"


def notes(result: dict[str, Any], title: str) -> list[str]:
    """Terminal lines for a ``summary`` result: a row per kind, then a verdict line per kind (and
    with the peer arm, SGLang's tracing cost, the plugin's share of it and that target's verdicts; with
    the between-windows arm, its cost and whether it lies within the A/A's interval)."""
    aa, peer, between = result.get("aa"), result.get("peer"), result.get("between")
    out = [
        f"== {title}: TTFT paired delta, median over rounds in us [bootstrap 95% CI] (share of the off median)",
        (
            f"   {'kind':<11} {'rounds':>6} {'off median':>11}  {'delta on - off':<30} "
            + (f"{'A/A off again - off':<30} {'A/A holds 0':>11}" if aa else "")
            + (f"  {'between windows - off':<30}" if between else "")
            + (f"  {f'SGLang tracing L{PEER_TRACE_LEVEL} - off':<30} {'plugin / SGLang'}" if peer else "")
        ).rstrip(),
    ]
    for kind in KINDS:
        s = result["kinds"].get(kind) or {}
        if not s.get("n_rounds"):
            out.append(f"   {kind:<11} no complete rounds")
            continue
        row = f"   {kind:<11} {s['n_rounds']:>6} {s['off_median_us'] / 1000:>8.2f} ms  {_us(s, 'delta'):<30} "
        if aa:
            row += f"{_us(s, 'aa'):<30} {'yes' if s['aa_ci_contains_zero'] else 'NO':>11}"
        if between:
            row += f"  {_us(s, 'between'):<30}"
        if peer:
            row += f"  {_us(s, 'peer'):<30} {_over_peer(s)}"
        out.append(row.rstrip())
    if not aa:
        out.append("   no A/A in these rounds: the delta's own noise is unknown")
    out.append(
        f"   target: delta <= {'/'.join(f'{TARGET_DELTA_US[k]:.0f}' for k in KINDS)} us ({'/'.join(KINDS)}), "
        f">= {TARGET_ROUNDS} rounds, the A/A's interval holding 0"
    )
    for kind in KINDS:
        s = result["kinds"].get(kind) or {}
        if s.get("n_rounds"):
            out.append(f"   verdict {kind:<11} {_verdict(kind, s)}")
    if peer:
        out.append(
            f"   target: plugin delta / SGLang tracing's (level {PEER_TRACE_LEVEL}) <= {TARGET_PEER_RATIO:.2f}, "
            "same rounds, SGLang's cost resolved"
        )
        for kind in KINDS:
            s = result["kinds"].get(kind) or {}
            if s.get("n_rounds"):
                out.append(f"   verdict {kind:<11} plugin / SGLang {_peer_verdict(s)}")
    if between:
        out.append(
            "   between windows within the A/A's interval: its point estimate inside the A/A's 95% CI, "
            "the A/A's interval holding 0"
        )
        for kind in KINDS:
            s = result["kinds"].get(kind) or {}
            if s.get("n_rounds"):
                out.append(f"   verdict {kind:<11} between windows within the A/A's interval: {_within(s)}")
    rc = result.get("records")
    if rc:
        out.append(
            f"   records: {rc['on_with_record']}/{rc['on_ok']} 'on' requests, {rc['off_with_record']}/{rc['off_ok']} 'off' requests"
        )
    return out


def crossover_notes(result: dict[str, Any]) -> list[str]:
    out = []
    for run_name, title in (("ab", "installed (SGLANG_MMTRACE=1) / not loaded (=0)"), ("aa", "A/A control, both =0")):
        res = result.get(run_name)
        if not res:
            continue
        out.append(f"== overhead-crossover, {title}: TTFT ratio per orientation and their geometric mean")
        for kind in KINDS:
            parts = []
            for o in ORIENTATIONS:
                s = res["orientations"].get(o, {}).get(kind) or {}
                parts.append(f"{o} {_ratio(s)} (n={s['n_pairs']})" if s.get("n_pairs") else f"{o} -")
            g = res["geomean"][kind]
            gm = f"{g['ttft_ratio_on_off']:.3f} [{g['ttft_ratio_ci95'][0]:.3f}, {g['ttft_ratio_ci95'][1]:.3f}]"
            out.append(f"   {kind:<11} {'; '.join(parts)}; geometric mean {gm}")
        per_launch = ", ".join(
            f"#{k} {v['orientation']}: " + "/".join(f"{v[kind]:.3f}" if v[kind] else "-" for kind in KINDS)
            for k, v in res["launches"].items()
        )
        out.append(f"   per launch ({'/'.join(KINDS)}): {per_launch}")
    return out
