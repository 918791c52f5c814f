"""Load and soak: many concurrent streaming clients and a long mixed run, plugin on vs off side by side.

Two real CPU servers (``SGLANG_MMTRACE=1`` with JSONL and OTLP to an in-process receiver, and
``SGLANG_MMTRACE=0``) get the same plan at the same time from ``--clients`` client threads each: new
images, repeated images, text-only, client disconnects after the first chunk, connections closed
before the first chunk, and aborts through SGLang's ``/abort_request``. Small requests (128-256 px,
``max_tokens`` 4) keep 10,000 feasible on two cores.

Measured: requests sent / served / failed per kind, concurrent clients held (streams open at once),
the RSS of every SGLang process (API, scheduler, detokenizer) sampled every few seconds, and on the
plugin server: ``/mmtrace/state`` back at rest, exactly one record per finished request and one
trace (root span) per record, no contained errors or drops.

    python -m benchmarks.soak --requests 10000 --clients 64
"""

from __future__ import annotations

import argparse
import http.client
import json
import os
import queue
import random
import socket
import statistics
import sys
import tempfile
import threading
import time
from collections import Counter
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from sglang_mmtrace.harness import CpuServer, chat_request, data_url, make_image
from sglang_mmtrace.harness.server import session_pids

MIX = {"new_image": 30, "repeat_image": 25, "text": 25, "disconnect": 8, "close_early": 6, "abort": 6}
"""Share of each kind in the plan (percent)."""
LONG = {"disconnect", "abort"}  # long generations, cut short by the client or the abort endpoint
FINISHED = {"new_image", "repeat_image", "text"}
REPEATED_POOL = 8
ROLES = {"sglang::schedul": "scheduler", "sglang::detoken": "detokenizer"}


@dataclass
class Outcome:
    kind: str
    rid: str
    status: int | None = None
    done: bool = False  # the stream ended with [DONE]
    error: str | None = None


def plan(n: int, seed: int) -> list[tuple[str, str, dict[str, Any]]]:
    """(kind, rid, body) for n requests; the same seed gives the same images and order."""
    rng = random.Random(seed)
    kinds = rng.choices(list(MIX), weights=list(MIX.values()), k=n)
    pool = [data_url(make_image(160, 160, seed=seed * 1000 + k)) for k in range(REPEATED_POOL)]
    out = []
    for i, kind in enumerate(kinds):
        rid = f"soak-{seed}-{i:05d}-{kind}"
        question = {"type": "text", "text": f"Soak {i}: what is shown?"}
        if kind == "new_image" or (kind in LONG | {"close_early"} and i % 2):
            size = rng.choice((128, 192, 256))
            content: Any = [
                {"type": "image_url", "image_url": {"url": data_url(make_image(size, size, seed + i))}},
                question,
            ]
        elif kind == "repeat_image":
            content = [{"type": "image_url", "image_url": {"url": pool[i % REPEATED_POOL]}}, question]
        else:
            content = f"Soak {i}: say something short about the sea."
        body = chat_request(
            [{"role": "user", "content": content}],
            64 if kind in LONG else 4,
            rid=rid,
            **({"ignore_eos": True} if kind in LONG else {}),
        )
        out.append((kind, rid, body))
    return out


class Gauge:
    """Streams open right now, and the most seen at once."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.now = 0
        self.max = 0
        self.done = 0  # requests finished so far (RSS samples are matched between arms by this count)
        self.samples: list[int] = []

    def __enter__(self) -> Gauge:
        with self.lock:
            self.now += 1
            self.max = max(self.max, self.now)
        return self

    def __exit__(self, *exc: Any) -> None:
        with self.lock:
            self.now -= 1
            self.done += 1


def _request_bytes(port: int, body: dict[str, Any]) -> bytes:
    payload = json.dumps(body).encode()
    head = (
        f"POST /v1/chat/completions HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\nContent-Type: application/json\r\n"
        f"Content-Length: {len(payload)}\r\nConnection: close\r\n\r\n"
    ).encode()
    return head + payload


def _abort(port: int, rid: str) -> None:
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=60)
    try:
        conn.request(
            "POST", "/abort_request", body=json.dumps({"rid": rid}), headers={"Content-Type": "application/json"}
        )
        conn.getresponse().read()
    finally:
        conn.close()


def send(port: int, kind: str, rid: str, body: dict[str, Any], gauge: Gauge, timeout: float = 600) -> Outcome:
    """One request on a raw socket, so the client can hang up at the exact point the kind asks for."""
    out = Outcome(kind, rid)
    buf = b""
    try:
        with gauge, socket.create_connection(("127.0.0.1", port), timeout=timeout) as sock:
            sock.sendall(_request_bytes(port, body))
            if kind == "close_early":
                return out  # closed before any byte of the response
            aborted = False
            while True:
                data = sock.recv(65536)
                if not data:
                    break
                buf += data
                if b"data:" in buf:
                    if kind == "disconnect":
                        break
                    if kind == "abort" and not aborted:
                        aborted = True
                        _abort(port, rid)
        if buf.startswith(b"HTTP/1.1 "):
            out.status = int(buf[9:12])
        out.done = b"data: [DONE]" in buf  # chunked transfer encoding: the terminating chunk follows
    except OSError as exc:
        out.error = type(exc).__name__
    return out


def drive(
    port: int,
    items: list[tuple[str, str, dict[str, Any]]],
    clients: int,
    gauge: Gauge | None = None,
    stop_at: float | None = None,
) -> tuple[list[Outcome], Gauge]:
    """Run the plan from ``clients`` threads; returns outcomes in plan order and the concurrency gauge.

    ``stop_at`` (a ``time.monotonic()`` value): no new request starts after it (the report says how many ran).
    """
    gauge = gauge or Gauge()
    work: queue.Queue[int] = queue.Queue()
    for i in range(len(items)):
        work.put(i)
    results: list[Outcome | None] = [None] * len(items)

    def worker() -> None:
        while True:
            if stop_at is not None and time.monotonic() > stop_at:
                return
            try:
                i = work.get_nowait()
            except queue.Empty:
                return
            results[i] = send(port, *items[i], gauge)

    threads = [threading.Thread(target=worker, daemon=True) for _ in range(clients)]
    for t in threads:
        t.start()
    stop = threading.Event()

    def sample() -> None:
        while not stop.wait(0.5):
            gauge.samples.append(gauge.now)

    sampler = threading.Thread(target=sample, daemon=True)
    sampler.start()
    for t in threads:
        t.join()
    stop.set()
    return [r for r in results if r is not None], gauge


def process_rss(server: CpuServer) -> dict[str, int]:
    """Role -> VmRSS in KiB of every live process of the server (api = the launcher)."""
    out: dict[str, int] = {}
    assert server.process is not None
    for pid in session_pids(server.process.pid):
        try:
            status = Path(f"/proc/{pid}/status").read_text()
            comm = Path(f"/proc/{pid}/comm").read_text().strip()
        except OSError:
            continue
        rss = next((int(line.split()[1]) for line in status.splitlines() if line.startswith("VmRSS:")), 0)
        # /proc/<pid>/comm is cut at 15 characters: "sglang::schedul", "sglang::detoken"
        role = "api" if pid == server.process.pid else ROLES.get(comm, comm)
        if "resource_tracker" in Path(f"/proc/{pid}/cmdline").read_bytes().decode(errors="replace"):
            role = "resource_tracker"
        out[role] = out.get(role, 0) + rss
    return out


class RssSampler:
    """Every few seconds: per arm, the RSS of each process and how many requests that arm has finished."""

    def __init__(self, servers: dict[str, CpuServer], gauges: dict[str, Gauge], every_s: float = 5.0) -> None:
        self.servers = servers
        self.gauges = gauges
        self.every_s = every_s
        self.samples: list[dict[str, Any]] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        t0 = time.monotonic()
        while True:
            sample: dict[str, Any] = {"t_s": round(time.monotonic() - t0, 1)}
            for arm, srv in self.servers.items():
                sample[arm] = process_rss(srv)
                sample[arm + "_done"] = self.gauges[arm].done
            self.samples.append(sample)
            if self._stop.wait(self.every_s):
                return

    def __enter__(self) -> RssSampler:
        self._thread.start()
        return self

    def __exit__(self, *exc: Any) -> None:
        self._stop.set()
        self._thread.join()


def tally(outcomes: list[Outcome]) -> dict[str, Any]:
    by_kind: dict[str, Counter[str]] = {}
    for o in outcomes:
        c = by_kind.setdefault(o.kind, Counter())
        c["sent"] += 1
        if o.kind in FINISHED:
            c["served" if o.status == 200 and o.done else "failed"] += 1
        elif o.kind == "close_early":
            c["closed"] += 1
        else:
            c["cut" if o.status == 200 or o.error is None else "failed"] += 1
    return {k: dict(v) for k, v in sorted(by_kind.items())}


def record_check(outcomes: list[Outcome], recs: list[dict[str, Any]], roots: Counter[str] | None) -> dict[str, Any]:
    """One record per finished request (ok), at most one per cut request, one root span per record."""
    per_rid = Counter(r["rid"] for r in recs)
    status = {r["rid"]: r["status"] for r in recs}
    finished = [o for o in outcomes if o.kind in FINISHED and o.status == 200 and o.done]
    out = {
        "records": len(recs),
        "records_per_finished_request": dict(Counter(per_rid.get(o.rid, 0) for o in finished)),
        "finished_requests_not_ok": sum(status.get(o.rid) != "ok" for o in finished),
        "rids_with_several_records": sum(1 for n in per_rid.values() if n > 1),
        "cut_request_record_status": dict(
            Counter(status.get(o.rid, "(none)") for o in outcomes if o.kind not in FINISHED)
        ),
    }
    if roots is not None:
        out["root_spans_per_record"] = dict(Counter(roots.get(r["rid"], 0) for r in recs))
    return out


def memory_table(samples: list[dict[str, Any]], off_total: int) -> dict[str, dict[str, float]]:
    """Per process: RSS on and off (MiB) matched by requests finished, over the range both arms ran.

    For each plugin-off sample, the plugin-on sample with the nearest finished-request count; ratios
    of the medians and peaks over those pairs, and at the last matched point (off at ``off_total``).
    ``on_final_mib`` is the plugin server at the end of its (longer) run.
    """
    out: dict[str, dict[str, float]] = {}
    on_s = [s for s in samples if s.get("on")]
    pairs = []
    seen_off: set[int] = set()
    for s in samples:
        # while the off arm was still running: one sample per finished-request count (not its idle tail)
        if s.get("off") and 0 < s["off_done"] <= off_total and s["off_done"] not in seen_off:
            seen_off.add(s["off_done"])
            near = min(on_s, key=lambda o: abs(o["on_done"] - s["off_done"]))
            pairs.append((near["on"], s["off"]))
    roles = sorted({r for on, _ in pairs for r in on} & {r for _, off in pairs for r in off})
    for role in roles:
        on = [p[0][role] for p in pairs if role in p[0] and role in p[1]]
        off = [p[1][role] for p in pairs if role in p[0] and role in p[1]]
        if not on:
            continue
        out[role] = {
            "matched_samples": len(on),
            "on_median_mib": round(statistics.median(on) / 1024, 1),
            "off_median_mib": round(statistics.median(off) / 1024, 1),
            "median_ratio": round(statistics.median(on) / statistics.median(off), 4),
            "peak_ratio": round(max(on) / max(off), 4),
            "last_matched_ratio": round(on[-1] / off[-1], 4),
            "on_final_mib": round(on_s[-1]["on"].get(role, 0) / 1024, 1),
        }
    return out


def settle(server: CpuServer, limit_s: float = 60.0) -> dict[str, Any]:
    """/mmtrace/state once nothing is live, finishing or pending (or at the limit)."""
    deadline = time.monotonic() + limit_s
    while True:
        conn = http.client.HTTPConnection("127.0.0.1", server.port, timeout=30)
        try:
            conn.request("GET", "/mmtrace/state")
            st = json.loads(conn.getresponse().read())
        finally:
            conn.close()
        api = st["api"]
        if not (api["live_requests"] or api["finishing"] or api["remote_pending"]) or time.monotonic() > deadline:
            return st
        time.sleep(0.5)


def markdown(result: dict[str, Any]) -> str:
    on = result["on"]
    lines = [
        "# Soak: plugin on vs off, side by side (real SGLang, CPU, tiny Qwen3-VL)",
        "",
        f"`{result['command']}`, {result['machine']['date_utc']} UTC, {result['machine']['cpus']} CPUs, "
        f"SGLang {result['machine']['sglang']}, commit {result['machine']['commit']}. Wall time {result['wall_s']:.0f} s.",
        "",
        "| arm | requests sent | served (finished kinds) | failed | cut by client/abort | max streams open | "
        "median streams open |",
        "|---|---|---|---|---|---|---|",
    ]
    for arm in ("on", "off"):
        t = result[arm]["by_kind"]
        sent = sum(v["sent"] for v in t.values())
        served = sum(v.get("served", 0) for v in t.values())
        failed = sum(v.get("failed", 0) for v in t.values())
        cut = sum(v.get("cut", 0) + v.get("closed", 0) for v in t.values())
        g = result[arm]["concurrency"]
        lines.append(f"| {arm} | {sent} | {served} | {failed} | {cut} | {g['max']} | {g['median']} |")
    if result.get("aa"):
        lines += [
            "",
            '**A/A run:** both arms are plugin-off servers (the "on" arm too): the noise floor of the ratios.',
            "",
        ]
    else:
        rc = on["records"]
        lines += [
            "",
            f"Plugin server: {rc['records']} records; records per finished request "
            f"{rc['records_per_finished_request']}; finished requests whose record is not ok: "
            f"{rc['finished_requests_not_ok']}; rids with several records: {rc['rids_with_several_records']}; "
            f"cut requests' record status {rc['cut_request_record_status']}; "
            f"root spans per record {rc.get('root_spans_per_record')}.",
            "",
            f"`/mmtrace/state` at the end: live {on['state']['live_requests']}, finishing {on['state']['finishing']}, "
            f"remote pending {on['state']['remote_pending']}, errors {on['state']['errors']}, "
            f"dropped {on['state']['dropped']}.",
            "",
        ]
    lines += [
        f"Memory: RSS of each SGLang process, plugin on vs off, matched at equal finished-request counts "
        f"(off ran the first {sum(v['sent'] for v in result['off']['by_kind'].values())} requests of the same plan; "
        f"on ran {sum(v['sent'] for v in result['on']['by_kind'].values())}).",
        "",
        "| process | on median (MiB) | off median | ratio median | ratio peak | ratio at last matched point "
        "| on at its end (MiB) | matched samples |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for role, m in result["memory"].items():
        lines.append(
            f"| {role} | {m['on_median_mib']} | {m['off_median_mib']} | {m['median_ratio']} | {m['peak_ratio']} "
            f"| {m['last_matched_ratio']} | {m['on_final_mib']} | {m['matched_samples']} |"
        )
    lines += ["", "Scheduler RSS (MiB) over the run, on / off at the same finished-request count:", ""]
    lines += course_table(result["rss_samples"], result["off_requests"], "scheduler")
    return "\n".join(lines) + "\n"


def course_table(samples: list[dict[str, Any]], off_total: int, role: str, points: int = 10) -> list[str]:
    """One row per tenth of the run: the two arms' RSS of ``role`` at the nearest finished-request counts."""
    on_s = [s for s in samples if s.get("on") and role in s["on"]]
    off_s = [s for s in samples if s.get("off") and role in s["off"]]
    if not on_s or not off_s:
        return []
    rows = ["| requests finished | on | off | on - off | ratio |", "|---|---|---|---|---|"]
    for k in range(1, points + 1):
        n = round(off_total * k / points)
        a = min(on_s, key=lambda x: abs(x["on_done"] - n))["on"][role] / 1024
        b = min(off_s, key=lambda x: abs(x["off_done"] - n))["off"][role] / 1024
        rows.append(f"| {n} | {a:.0f} | {b:.0f} | {a - b:+.0f} | {a / b:.3f} |")
    return rows


def rerender(path: Path) -> None:
    """Recompute the memory table from a ``soak.json``'s raw RSS samples and rewrite it and ``soak.md``."""
    result = json.loads(path.read_text())
    for sample in result["rss_samples"]:
        for arm in ("on", "off"):
            sample[arm] = {ROLES.get("sglang::" + k, k): v for k, v in sample[arm].items()}
    result["memory"] = memory_table(result["rss_samples"], result["off_requests"])
    path.write_text(json.dumps(result, indent=1) + "\n")
    path.with_suffix(".md").write_text(markdown(result))


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--requests", type=int, default=10000, help="requests to the plugin server")
    ap.add_argument(
        "--off-requests",
        type=int,
        default=None,
        help="requests to the plugin-off server (the first N of the same plan; default: as many); memory "
        "is compared at equal finished-request counts",
    )
    ap.add_argument("--clients", type=int, default=64, help="concurrent streaming clients per server")
    ap.add_argument("--seed", type=int, default=77)
    ap.add_argument("--out-dir", default=str(Path(__file__).resolve().parent / "results" / "reliability"))
    ap.add_argument("--health-timeout", type=float, default=900.0)
    ap.add_argument("--max-minutes", type=float, default=None, help="start no request after this long")
    ap.add_argument(
        "--aa",
        action="store_true",
        help="A/A: both arms with the plugin off, to measure the noise floor of the memory ratio",
    )
    ap.add_argument("--rerender", metavar="SOAK_JSON", help="only recompute the tables of an earlier run")
    args = ap.parse_args(argv)
    if args.rerender:
        rerender(Path(args.rerender))
        return 0
    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))
    from peers.otlp_receiver import OtlpReceiver

    from ._common import machine

    meta = machine()
    tmp = Path(tempfile.mkdtemp(prefix="mmtrace-soak-"))
    receiver = OtlpReceiver()
    receiver.start_http()
    common = {"server_args": ("--mm-preprocess-cache-size-mb", "64"), "health_timeout": args.health_timeout}
    servers = {
        "on": CpuServer(plugin_enabled=False, log_path=tmp / "server-on.log", **common)
        if args.aa
        else CpuServer(
            jsonl_path=tmp / "records.jsonl",
            log_path=tmp / "server-on.log",
            env={"SGLANG_MMTRACE_OTLP_ENDPOINT": f"http://127.0.0.1:{receiver.http_port}"},
            **common,
        ),
        "off": CpuServer(plugin_enabled=False, log_path=tmp / "server-off.log", **common),
    }
    items = plan(args.requests, args.seed)
    off_n = min(args.off_requests or args.requests, args.requests)
    result: dict[str, Any] = {
        "command": "python -m benchmarks.soak " + " ".join(argv or sys.argv[1:]),
        "machine": meta,
        "on_requests": len(items),
        "off_requests": off_n,
        "aa": args.aa,
    }  # planned; the by_kind tables say how many were sent
    try:
        for srv in servers.values():
            srv.start()
        t0 = time.monotonic()
        stop_at = t0 + args.max_minutes * 60 if args.max_minutes else None
        outcomes: dict[str, tuple[list[Outcome], Gauge]] = {}
        gauges = {arm: Gauge() for arm in servers}
        arm_items = {"on": items, "off": items[:off_n]}

        def run_arm(arm: str) -> None:
            outcomes[arm] = drive(servers[arm].port, arm_items[arm], args.clients, gauges[arm], stop_at)

        with RssSampler(servers, gauges) as rss:
            runners = [threading.Thread(target=run_arm, args=(arm,)) for arm in servers]
            for t in runners:
                t.start()
            for t in runners:
                t.join()
            st = None if args.aa else settle(servers["on"])
            time.sleep(10)  # a last RSS sample at rest
        result["wall_s"] = time.monotonic() - t0
        for arm, (outs, gauge) in outcomes.items():
            result[arm] = {
                "by_kind": tally(outs),
                "concurrency": {"max": gauge.max, "median": statistics.median(gauge.samples or [0])},
            }
        result["rss_samples"] = rss.samples
        result["memory"] = memory_table(rss.samples, off_n)
        if st is None:  # A/A: no plugin, no records to check
            _write(args.out_dir, result)
            return 0
        recs = [json.loads(line) for line in (tmp / "records.jsonl").read_text().splitlines() if line.strip()]
        deadline = time.monotonic() + 120
        while len({s.trace_id for s in receiver.snapshot() if s.name == "request"}) < len(recs):
            if time.monotonic() > deadline:
                break
            time.sleep(1)
        roots = Counter(s.attrs.get("sglang.rid") for s in receiver.snapshot() if s.name == "request")
        result["on"]["records"] = record_check(outcomes["on"][0], recs, roots)
        result["on"]["state"] = st["api"]
        result["on"]["peer_errors"] = {k: p.get("errors") for k, p in st["peers"].items()}
    finally:
        for srv in servers.values():
            srv.stop()
        receiver.stop()
    _write(args.out_dir, result)
    return 0


def _write(out_dir: str, result: dict[str, Any]) -> None:
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    (out / "soak.json").write_text(json.dumps(result, indent=1) + "\n")
    (out / "soak.md").write_text(markdown(result))
    print(markdown(result))


if __name__ == "__main__":
    os.environ.setdefault("PYTHONUNBUFFERED", "1")
    sys.exit(main())
