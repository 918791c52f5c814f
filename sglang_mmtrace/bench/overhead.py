"""Plugin on vs off, interleaved in one run: two servers side by side (``SGLANG_MMTRACE=1`` / ``=0``,
same arguments), each request kind sent to both in a random A/B order per round.

Shared by ``sglang-mmtrace bench --experiment overhead`` and ``benchmarks/ttft_ab.py``. Per kind it
reports the median TTFT off/on, their ratio with a bootstrap interval over paired rounds, and the
median paired difference (on - off) with its interval.
"""

from __future__ import annotations

import contextlib
import os
import random
import signal
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from ..harness import data_url, image_message, make_image
from ..harness.server import CpuServer, _session_pids
from .client import timed_chat
from .records import RecordsTail
from .stats import bootstrap_median_ci, paired_ratio_ci

KINDS = ("new_image", "same_image", "text")
QUESTION = "Describe this image in one word."
MAX_TOKENS = 8
ARMS = ("off", "on")


def messages_for(kind: str, round_no: int, image_url: str) -> list[dict[str, Any]]:
    if kind == "text":
        return [{"role": "user", "content": f"Round {round_no}: name one colour and one shape."}]
    return [image_message(QUESTION, [image_url])]


def start_pair(make: Callable[[str], CpuServer]) -> dict[str, CpuServer]:
    """Start ``make("off")`` and ``make("on")`` in parallel; stop both if either fails."""
    servers = {arm: make(arm) for arm in ARMS}
    errors: dict[str, BaseException] = {}

    def start(name: str) -> None:
        try:
            servers[name].start()
        except BaseException as exc:
            errors[name] = exc

    threads = [threading.Thread(target=start, args=(n,)) for n in servers]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    if errors:
        for srv in servers.values():
            srv.stop()
        raise RuntimeError(f"server start failed: {errors}")
    return servers


class Pauser:
    """SIGSTOP the server not being measured, SIGCONT it before its own request.

    An idle CPU SGLang scheduler polls (about half a core here), so on 2 cores the idle server
    competes with the one being measured; pausing it takes that shared noise out of both arms.
    """

    def __init__(self, servers: dict[str, CpuServer], enabled: bool, settle_s: float) -> None:
        self.pids = {k: _session_pids(s.process.pid) if s.process else [] for k, s in servers.items()}
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
    tck = os.sysconf("SC_CLK_TCK")
    page = os.sysconf("SC_PAGE_SIZE")
    out = {}
    for arm, srv in servers.items():
        cpu = rss = 0.0
        for pid in _session_pids(srv.process.pid) if srv.process else []:
            try:
                fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
                cpu += (int(fields[11]) + int(fields[12])) / tck
                rss += int(fields[21]) * page / 2**20
            except (OSError, ValueError, IndexError):
                continue
        out[arm] = {"cpu_s": round(cpu, 2), "rss_mb": round(rss, 1)}
    return out


@dataclass
class OverheadRun:
    rows: list[dict[str, Any]] = field(default_factory=list)  # timed requests, one per arm/kind/round
    failures: list[dict[str, Any]] = field(default_factory=list)
    health: list[dict[str, Any]] = field(default_factory=list)


def run_rounds(
    servers: dict[str, CpuServer],
    rounds: int,
    warmup_rounds: int,
    seed: int,
    pauser: Pauser,
    request_timeout: float = 120.0,
    max_failures: int = 5,
    size: tuple[int, int] = (512, 512),
    label: str = "",
    max_tokens: int = MAX_TOKENS,
    progress: Callable[[], None] | None = None,
    round_log: bool = False,
    log: Callable[[str], None] = lambda s: print(s, file=sys.stderr, flush=True),
) -> OverheadRun:
    """Warm-up rounds (untimed, seeds not reused), then ``rounds`` timed rounds of every kind on
    both arms, A/B order random per kind and round, one request in flight."""
    rng = random.Random(seed)
    run = OverheadRun()
    for i in range(warmup_rounds + rounds):
        timed = i >= warmup_rounds
        round_no = i - warmup_rounds
        url = data_url(make_image(*size, seed * 1000 + i, label=f"{label} {i}" if label else None))
        for kind in KINDS:
            order = list(ARMS)
            rng.shuffle(order)
            for arm in order:
                pauser.only(arm)
                try:
                    res = timed_chat(
                        servers[arm].base_url,
                        messages_for(kind, round_no, url),
                        max_tokens=max_tokens,
                        timeout=request_timeout,
                    )
                except (OSError, RuntimeError, ValueError) as exc:  # a timeout is an OSError
                    run.failures.append({"round": round_no, "kind": kind, "arm": arm, "error": repr(exc)[:400]})
                    log(f"[overhead] request failed: {run.failures[-1]}")
                    if len(run.failures) >= max_failures:
                        raise RuntimeError(f"{len(run.failures)} failed requests, giving up") from exc
                    continue
                finally:
                    if timed and progress is not None:
                        progress()
                if timed:
                    run.rows.append({"round": round_no, "kind": kind, "arm": arm, "order": order.index(arm), **res})
        if timed:
            run.health.append({"round": round_no, "loadavg_1m": os.getloadavg()[0], **server_health(servers)})
            if round_log:
                brief = "  ".join(
                    f"{r['kind']}/{r['arm']} {r['ttft_s'] * 1000:.1f}" for r in run.rows if r["round"] == round_no
                )
                log(f"[overhead] round {round_no + 1}/{rounds}: TTFT ms {brief}")
    return run


def paired_summary(rows: list[dict[str, Any]], kind: str) -> dict[str, Any]:
    """Off vs on for one kind over the rounds where both arms answered."""
    by_round: dict[int, dict[str, dict[str, Any]]] = {}
    for r in rows:
        if r["kind"] == kind:
            by_round.setdefault(r["round"], {})[r["arm"]] = r
    pairs = [(v["off"], v["on"]) for v in by_round.values() if "off" in v and "on" in v]
    if not pairs:
        return {"n_pairs": 0}
    off = np.array([a["ttft_s"] for a, _ in pairs]) * 1000
    on = np.array([b["ttft_s"] for _, b in pairs]) * 1000
    e2e_off = np.array([a["e2e_s"] for a, _ in pairs]) * 1000
    e2e_on = np.array([b["e2e_s"] for _, b in pairs]) * 1000
    delta = on - off
    lo, hi = bootstrap_median_ci(delta)
    ratio, rlo, rhi = paired_ratio_ci(off, on)
    med_off, med_on = float(np.median(off)), float(np.median(on))
    return {
        "n_pairs": len(pairs),
        "ttft_off_median_ms": round(med_off, 3),
        "ttft_on_median_ms": round(med_on, 3),
        "ttft_ratio_on_off": round(ratio, 4),
        "ttft_ratio_ci95": [round(rlo, 4), round(rhi, 4)],
        "ttft_delta_median_ms": round(med_on - med_off, 3),
        "ttft_paired_delta_median_ms": round(float(np.median(delta)), 3),
        "ttft_paired_delta_ci95_ms": [round(lo, 3), round(hi, 3)],
        "ttft_off_p90_ms": round(float(np.quantile(off, 0.9)), 3),
        "ttft_on_p90_ms": round(float(np.quantile(on, 0.9)), 3),
        "e2e_off_median_ms": round(float(np.median(e2e_off)), 3),
        "e2e_on_median_ms": round(float(np.median(e2e_on)), 3),
        "e2e_ratio_on_off": round(float(np.median(e2e_on)) / float(np.median(e2e_off)), 4),
        "ttft_median_ms_by_position_in_pair": {
            pos: round(float(np.median([x["ttft_s"] * 1000 for pr in pairs for x in pr if x["order"] == i])), 3)
            for i, pos in enumerate(("first", "second"))
        },
        "cached_tokens_median": {
            arm: float(
                np.median(
                    [((x["usage"] or {}).get("prompt_tokens_details") or {}).get("cached_tokens") or 0 for x in xs]
                )
            )
            for arm, xs in (("off", [a for a, _ in pairs]), ("on", [b for _, b in pairs]))
        },
    }


def plugin_records(jsonl: Path | None, rows: list[dict[str, Any]]) -> dict[str, Any]:
    """What the plugin recorded for the 'on' requests (proof it was active; its own TTFT view)."""
    if jsonl is None or not jsonl.exists():
        return {"records": 0}
    tail = RecordsTail(jsonl, from_start=True)
    tail.poll()
    out: dict[str, Any] = {"records": len(tail.by_rid)}
    for kind in KINDS:
        client, plugin = [], []
        for row in rows:
            if row["arm"] != "on" or row["kind"] != kind or not row.get("id"):
                continue
            rec = tail.find(str(row["id"]))
            if rec and rec.get("ttft_s") is not None:
                client.append(row["ttft_s"] * 1000)
                plugin.append(rec["ttft_s"] * 1000)
        out[kind] = {
            "matched": len(plugin),
            "plugin_ttft_median_ms": round(float(np.median(plugin)), 3) if plugin else None,
            "client_ttft_median_ms": round(float(np.median(client)), 3) if client else None,
        }
    return out
