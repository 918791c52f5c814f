"""Plugin on vs off on the GPU: two servers side by side, the reference requests interleaved.

    python benchmarks/gpu/ab_017.py --model DIR --out OUTDIR [--rounds 30] [--deadline EPOCH_S]

Both servers get the same request sequence (each round's images are new to both); the arm that goes
first alternates by round. Writes OUTDIR/ab_raw.json (client TTFT per request and arm) and the on
server's records (OUTDIR/records_ab_on.jsonl); statistics are computed off the device
(``benchmarks/gpu/ab_stats.py``).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from benchmarks.gpu.drive_017 import log, start_server, stop_server, wait_healthy  # noqa: E402
from sglang_mmtrace.bench.client import timed_chat  # noqa: E402
from sglang_mmtrace.cli.demo import reference_requests  # noqa: E402

DEFAULT_ARMS = "on:SGLANG_MMTRACE=1,off:SGLANG_MMTRACE=0"


def parse_arms(spec: str) -> dict[str, dict[str, str]]:
    """``name:K=V;K=V,name2:...`` -> arm name -> the server's extra environment."""
    arms = {}
    for part in spec.split(","):
        name, _, env = part.partition(":")
        arms[name] = dict(kv.split("=", 1) for kv in env.split(";") if kv)
    return arms


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", required=True)
    ap.add_argument("--out", required=True)
    ap.add_argument("--rounds", type=int, default=30)
    ap.add_argument("--deadline", type=float, default=time.time() + 540)
    ap.add_argument("--server-flags", default=os.environ.get("SGLANG_GPU_FLAGS", ""))
    ap.add_argument("--arms", default=os.environ.get("AB_ARMS", DEFAULT_ARMS), help=DEFAULT_ARMS)
    args = ap.parse_args()
    arms = parse_arms(args.arms)
    ports = {arm: 30010 + i for i, arm in enumerate(arms)}
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    procs = {}
    rows: list[dict] = []
    result: dict = {"rounds": args.rounds, "server_flags": args.server_flags, "arms": arms, "rows": rows, "errors": []}
    try:
        for arm, env in arms.items():
            a = argparse.Namespace(model=args.model, port=ports[arm], server_flags=args.server_flags, nsys=None)
            procs[arm] = start_server(a, out / f"records_ab_{arm}.jsonl", Path(f"/tmp/server_ab_{arm}.log"), [], env)
        for arm, port in ports.items():
            result[f"startup_{arm}_s"] = wait_healthy(procs[arm], f"http://127.0.0.1:{port}", args.deadline - 60)
        log(f"all healthy: {result}")
        for port in ports.values():  # warm-up (Triton JIT), not measured
            for _, messages in reference_requests(100):
                timed_chat(f"http://127.0.0.1:{port}", messages, max_tokens=4)
        for r in range(args.rounds):
            if time.time() > args.deadline - 20:
                result["errors"].append(f"stopped before round {r}: deadline")
                break
            names = list(arms)
            order = names[r % len(names) :] + names[: r % len(names)]  # each arm leads in turn
            for kind, messages in reference_requests(r):
                for arm in order:
                    try:
                        t = timed_chat(f"http://127.0.0.1:{ports[arm]}", messages, max_tokens=4)
                        rows.append({"round": r, "kind": kind, "arm": arm, "ttft_s": t["ttft_s"], "e2e_s": t["e2e_s"],
                                     "rid": t["id"], "usage": t["usage"]})  # fmt: skip
                    except Exception as exc:
                        rows.append({"round": r, "kind": kind, "arm": arm, "error": repr(exc)})
        log(f"sent {len(rows)} requests")
        time.sleep(3.0)  # the on server's last records
    except Exception as exc:
        result["errors"].append(repr(exc))
        log(f"ERROR {exc!r}")
    finally:
        for p in procs.values():
            stop_server(p)
    (out / "ab_raw.json").write_text(json.dumps(result, indent=1))
    return 0 if not result["errors"] else 1


if __name__ == "__main__":
    sys.exit(main())
