"""Server TTFT with the plugin off vs on: two real CPU SGLang servers, requests interleaved A/B.

Both servers (``SGLANG_MMTRACE=0`` and ``=1`` with a JSONL sink) run the tiny Qwen3-VL with the
same arguments. Each round sends, to each server, in a random A/B order per request kind:
``new_image`` (a fresh 512x512 PNG, new seed per round: preprocess/embedding/radix cache miss),
``same_image`` (that image again: cache hits) and ``text`` (text only). One request is in flight
at a time. TTFT is measured by a stdlib socket client: from just before the request is written to
the first received bytes that contain an SSE ``data:`` line; e2e is to the end of the response.

Per kind: median TTFT off/on, their ratio and difference, the median of the per-round paired
differences (on - off) with a bootstrap 95% interval, and e2e medians.

    python -m benchmarks.ttft_ab --rounds 30
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import random
import signal
import socket
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

import numpy as np

from sglang_mmtrace.harness import CpuServer, data_url, image_message, make_image
from sglang_mmtrace.harness.server import _session_pids

from ._common import RESULTS, bootstrap_median_ci, machine

KINDS = ("new_image", "same_image", "text")
SERVER_ARGS = ("--mm-preprocess-cache-size-mb", "64")
QUESTION = "Describe this image in one word."
MAX_TOKENS = 8


# ---------------------------------------------------------------------------------------------
# a streaming client that timestamps the first SSE data line


def _dechunk(raw: bytes) -> bytes:
    out, i = bytearray(), 0
    while True:
        j = raw.find(b"\r\n", i)
        if j < 0:
            return bytes(out)
        size = int(raw[i:j].split(b";")[0] or b"0", 16)
        if size == 0:
            return bytes(out)
        out += raw[j + 2 : j + 2 + size]
        i = j + 2 + size + 2


def timed_chat(
    port: int, messages: list[dict[str, Any]], max_tokens: int = MAX_TOKENS, timeout: float = 120.0
) -> dict[str, Any]:
    """POST a streamed chat completion; return ``ttft_s``, ``e2e_s``, the SSE chunks and the usage."""
    body = json.dumps(
        {
            "model": "default",
            "messages": messages,
            "max_tokens": max_tokens,
            "temperature": 0,
            "stream": True,
            "stream_options": {"include_usage": True},
        }
    ).encode()
    head = (
        f"POST /v1/chat/completions HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\nContent-Type: application/json\r\n"
        f"Accept: text/event-stream\r\nContent-Length: {len(body)}\r\nConnection: close\r\n\r\n"
    ).encode()
    request = head + body
    sock = socket.create_connection(("127.0.0.1", port), timeout=timeout)
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    buf = bytearray()
    header_end = -1
    t_first = None
    try:
        t0 = time.perf_counter()
        sock.sendall(request)
        while True:
            data = sock.recv(65536)
            t = time.perf_counter()
            if not data:
                break
            buf += data
            if header_end < 0:
                header_end = buf.find(b"\r\n\r\n")
            if t_first is None and header_end >= 0 and buf.find(b"data:", header_end) >= 0:
                t_first = t
        t_end = time.perf_counter()
    finally:
        sock.close()
    if header_end < 0:
        raise RuntimeError(f"no HTTP response header: {bytes(buf[:200])!r}")
    header, payload = bytes(buf[:header_end]), bytes(buf[header_end + 4 :])
    status = int(header.split(b" ", 2)[1])
    if b"transfer-encoding: chunked" in header.lower():
        payload = _dechunk(payload)
    if status != 200:
        raise RuntimeError(f"HTTP {status}: {payload[:500]!r}")
    chunks: list[dict[str, Any]] = []
    for line in payload.split(b"\n"):
        if line.startswith(b"data:"):
            data = line[5:].strip()
            if data and data != b"[DONE]":
                chunks.append(json.loads(data))
    usage = next((c["usage"] for c in reversed(chunks) if c.get("usage")), None)
    if t_first is None:
        raise RuntimeError("response carried no SSE data line")
    return {
        "ttft_s": t_first - t0,
        "e2e_s": t_end - t0,
        "id": chunks[0].get("id") if chunks else None,
        "n_chunks": len(chunks),
        "usage": usage,
    }


# ---------------------------------------------------------------------------------------------
# the run


def messages_for(kind: str, round_no: int, image_url: str) -> list[dict[str, Any]]:
    if kind == "text":
        return [{"role": "user", "content": f"Round {round_no}: name one colour and one shape."}]
    return [image_message(QUESTION, [image_url])]


def start_servers(
    jsonl: Path,
    log_dir: Path,
    control: bool = False,
    health_timeout: float = 600.0,
    on_env: dict[str, str] | None = None,
) -> dict[str, CpuServer]:
    """``off`` and ``on``; with ``control`` the ``on`` server runs with the plugin off too (A/A)."""
    servers = {
        "off": CpuServer(
            plugin_enabled=False,
            server_args=SERVER_ARGS,
            log_path=log_dir / "server-off.log",
            health_timeout=health_timeout,
        ),
        "on": CpuServer(
            plugin_enabled=not control,
            jsonl_path=None if control else jsonl,
            server_args=SERVER_ARGS,
            log_path=log_dir / "server-on.log",
            health_timeout=health_timeout,
            env=on_env,
        ),
    }
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


def summarize(rows: list[dict[str, Any]], kind: str) -> dict[str, Any]:
    by_round: dict[int, dict[str, dict[str, Any]]] = {}
    for r in rows:
        if r["kind"] == kind:
            by_round.setdefault(r["round"], {})[r["arm"]] = r
    pairs = [(v["off"], v["on"]) for v in by_round.values() if "off" in v and "on" in v]
    off = np.array([a["ttft_s"] for a, _ in pairs]) * 1000
    on = np.array([b["ttft_s"] for _, b in pairs]) * 1000
    e2e_off = np.array([a["e2e_s"] for a, _ in pairs]) * 1000
    e2e_on = np.array([b["e2e_s"] for _, b in pairs]) * 1000
    delta = on - off
    lo, hi = bootstrap_median_ci(delta)
    med_off, med_on = float(np.median(off)), float(np.median(on))
    return {
        "n_pairs": len(pairs),
        "ttft_off_median_ms": round(med_off, 3),
        "ttft_on_median_ms": round(med_on, 3),
        "ttft_ratio_on_off": round(med_on / med_off, 4),
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


def plugin_records(jsonl: Path, rows: list[dict[str, Any]]) -> dict[str, Any]:
    """What the plugin recorded for the 'on' requests (proof it was active; its own TTFT view)."""
    if not jsonl.exists():
        return {"records": 0}
    recs = [json.loads(line) for line in jsonl.read_text().splitlines() if line.strip()]
    by_rid = {r.get("rid"): r for r in recs}
    out: dict[str, Any] = {"records": len(recs)}
    for kind in KINDS:
        client, plugin = [], []
        for row in rows:
            if row["arm"] != "on" or row["kind"] != kind or not row.get("id"):
                continue
            rec = by_rid.get(row["id"]) or by_rid.get(str(row["id"]).removeprefix("chatcmpl-"))
            if rec and rec.get("ttft_s") is not None:
                client.append(row["ttft_s"] * 1000)
                plugin.append(rec["ttft_s"] * 1000)
        out[kind] = {
            "matched": len(plugin),
            "plugin_ttft_median_ms": round(float(np.median(plugin)), 3) if plugin else None,
            "client_ttft_median_ms": round(float(np.median(client)), 3) if client else None,
        }
    return out


def markdown(result: dict[str, Any]) -> str:
    m, c = result["machine"], result["config"]
    lines = [
        "# TTFT A/B: plugin off vs on (interleaved)",
        "",
        f"{m['date_utc']} UTC; {m['cpus']} CPUs ({m['cpu_model']}), {m['accelerator']}; SGLang {m['sglang']}; "
        f"plugin commit {m['commit']}{' (tree dirty)' if m['plugin_tree_dirty'] else ''}; "
        f"load average at start {m['loadavg_at_start'][0]:.2f}, at end {m['loadavg_at_end'][0]:.2f}.",
        f"{c['rounds']} rounds x {len(KINDS)} kinds x 2 servers, one request in flight, A/B order random per "
        f"request kind and round; tiny Qwen3-VL, max_tokens {c['max_tokens']}, server args `{' '.join(c['server_args'])}`; "
        + (
            f"the server not being measured was paused (SIGSTOP, resumed {c['settle_ms']:.0f} ms before its request)."
            if c.get("pause_other_server")
            else "both servers ran throughout."
        )
        + (" **A/A control: both servers have the plugin off.**" if c.get("control_aa") else "")
        + (f" Plugin-on server extra env: `{c['on_server_extra_env']}`." if c.get("on_server_extra_env") else ""),
        "",
        "| kind | TTFT off median ms | TTFT on median ms | ratio on/off | delta ms | paired delta median ms [95% CI] | e2e off / on median ms |",
        "|---|---:|---:|---:|---:|---:|---:|",
    ]
    for kind, s in result["kinds"].items():
        ci = s["ttft_paired_delta_ci95_ms"]
        lines.append(
            f"| {kind} | {s['ttft_off_median_ms']:.2f} | {s['ttft_on_median_ms']:.2f} | {s['ttft_ratio_on_off']:.3f} | "
            f"{s['ttft_delta_median_ms']:+.2f} | {s['ttft_paired_delta_median_ms']:+.2f} [{ci[0]:+.2f}, {ci[1]:+.2f}] | "
            f"{s['e2e_off_median_ms']:.1f} / {s['e2e_on_median_ms']:.1f} |"
        )
    if result.get("failed_requests"):
        lines += ["", f"Failed requests (left out of the table): {len(result['failed_requests'])}."]
    pr = result.get("plugin_records", {})
    lines += [
        "",
        f"The plugin-on server wrote {pr.get('records', 0)} records (warm-up rounds included). Its own TTFT vs the "
        "client's, medians over the matched requests: "
        + "; ".join(
            f"{k} {v['plugin_ttft_median_ms']:.2f} vs {v['client_ttft_median_ms']:.2f} ms"
            for k, v in pr.items()
            if isinstance(v, dict) and v.get("matched")
        )
        + ".",
        "",
        "Caveats: 2 cores shared by the server being measured (API, scheduler and detokenizer processes; an idle "
        "CPU scheduler polls at about half a core), the client, and any other work on the machine (see the load "
        "averages: anything above 2 means the run was CPU-starved, and TTFT then mostly measures contention); "
        "a toy model, so TTFT is almost all fixed overhead. The hot-path microbenchmark (hotpath.json) gives the "
        "plugin's own cost with far less noise.",
    ]
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rounds", type=int, default=30)
    ap.add_argument("--warmup-rounds", type=int, default=2, help="untimed rounds first (seeds not reused)")
    ap.add_argument("--seed", type=int, default=1234)
    ap.add_argument("--out-dir", default=str(RESULTS))
    ap.add_argument("--keep-logs", action="store_true", help="keep the server logs and JSONL in a temp folder")
    ap.add_argument(
        "--no-pause",
        action="store_true",
        help="leave the other server running during each request (default: SIGSTOP it, see Pauser)",
    )
    ap.add_argument("--settle-ms", type=float, default=100.0, help="wait after resuming a paused server")
    ap.add_argument("--control", action="store_true", help="A/A control: both servers with the plugin off")
    ap.add_argument(
        "--on-env",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="extra environment of the plugin-on server (e.g. SGLANG_MMTRACE_METRICS=0), to bisect the overhead",
    )
    ap.add_argument("--request-timeout", type=float, default=120.0, help="client timeout per request (s)")
    ap.add_argument("--max-failures", type=int, default=5, help="give up after this many failed requests")
    ap.add_argument("--health-timeout", type=float, default=600.0, help="seconds a server may take to become healthy")
    args = ap.parse_args(argv)

    out_dir = Path(args.out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    work = Path(tempfile.mkdtemp(prefix="mmtrace-ttft-ab-"))
    jsonl = work / "records.jsonl"
    info = machine()
    rng = random.Random(args.seed)
    rows: list[dict[str, Any]] = []

    print(f"[ttft_ab] starting both servers (logs in {work}) ...", flush=True)
    t_start = time.monotonic()
    on_env = dict(kv.split("=", 1) for kv in args.on_env)
    servers = start_servers(jsonl, work, control=args.control, health_timeout=args.health_timeout, on_env=on_env)
    startup = {k: round(s.startup_seconds or 0, 1) for k, s in servers.items()}
    print(f"[ttft_ab] healthy after {startup} s", flush=True)
    pauser = Pauser(servers, enabled=not args.no_pause, settle_s=args.settle_ms / 1000)
    health: list[dict[str, Any]] = []
    failures: list[dict[str, Any]] = []
    try:
        total = args.warmup_rounds + args.rounds
        for i in range(total):
            timed = i >= args.warmup_rounds
            round_no = i - args.warmup_rounds
            seed = args.seed * 1000 + i
            url = data_url(make_image(512, 512, seed))
            for kind in KINDS:
                order = ["off", "on"]
                rng.shuffle(order)
                for arm in order:
                    pauser.only(arm)
                    try:
                        res = timed_chat(
                            servers[arm].port, messages_for(kind, round_no, url), timeout=args.request_timeout
                        )
                    except (OSError, RuntimeError, ValueError) as exc:  # a timeout is an OSError
                        failures.append({"round": round_no, "kind": kind, "arm": arm, "error": repr(exc)})
                        print(f"[ttft_ab] request failed: {failures[-1]}", flush=True)
                        if len(failures) >= args.max_failures:
                            raise RuntimeError(f"{len(failures)} failed requests, giving up") from exc
                        continue
                    if timed:
                        rows.append({"round": round_no, "kind": kind, "arm": arm, "order": order.index(arm), **res})
            if timed:
                health.append({"round": round_no, "loadavg_1m": os.getloadavg()[0], **server_health(servers)})
                last = [r for r in rows if r["round"] == round_no]
                brief = "  ".join(f"{r['kind']}/{r['arm']} {r['ttft_s'] * 1000:.1f}" for r in last)
                print(f"[ttft_ab] round {round_no + 1}/{args.rounds}: TTFT ms {brief}", flush=True)
    finally:
        pauser.resume_all()
        for srv in servers.values():
            srv.stop()
    info["loadavg_at_end"] = list(os.getloadavg())

    time.sleep(0.5)
    result: dict[str, Any] = {
        "benchmark": "ttft_ab",
        "machine": info,
        "config": {
            "rounds": args.rounds,
            "warmup_rounds": args.warmup_rounds,
            "seed": args.seed,
            "kinds": list(KINDS),
            "image": "512x512 PNG (harness make_image), new seed per round",
            "max_tokens": MAX_TOKENS,
            "server_args": list(SERVER_ARGS),
            "startup_s": startup,
            "pause_other_server": not args.no_pause,
            "settle_ms": args.settle_ms,
            "control_aa": args.control,
            "on_server_extra_env": on_env,
            "run_wall_s": round(time.monotonic() - t_start, 1),
        },
        "kinds": {kind: summarize(rows, kind) for kind in KINDS},
        "plugin_records": plugin_records(jsonl, rows),
        "server_health_per_round": health,
        "failed_requests": failures,
        "samples": [
            {k: (round(v, 6) if isinstance(v, float) else v) for k, v in r.items() if k != "usage"}
            | {"cached_tokens": ((r.get("usage") or {}).get("prompt_tokens_details") or {}).get("cached_tokens")}
            for r in rows
        ],
    }
    (out_dir / "ttft_ab.json").write_text(json.dumps(result, indent=2) + "\n")
    md = markdown(result)
    (out_dir / "ttft_ab.md").write_text(md)
    print(md)
    if not args.keep_logs:
        for p in work.iterdir():
            p.unlink()
        work.rmdir()
    return 0


if __name__ == "__main__":
    sys.exit(main())
