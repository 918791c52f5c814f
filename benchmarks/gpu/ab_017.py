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
from benchmarks.ttft_ab import timed_chat  # noqa: E402
from sglang_mmtrace.cli.demo import reference_requests  # noqa: E402

ARMS = {"on": ("1", 30010), "off": ("0", 30011)}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", required=True)
    ap.add_argument("--out", required=True)
    ap.add_argument("--rounds", type=int, default=30)
    ap.add_argument("--deadline", type=float, default=time.time() + 540)
    ap.add_argument("--server-flags", default=os.environ.get("SGLANG_GPU_FLAGS", ""))
    args = ap.parse_args()
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    procs = {}
    rows: list[dict] = []
    result: dict = {"rounds": args.rounds, "server_flags": args.server_flags, "rows": rows, "errors": []}
    try:
        for arm, (flag, port) in ARMS.items():
            a = argparse.Namespace(model=args.model, port=port, server_flags=args.server_flags, nsys=None)
            procs[arm] = start_server(
                a, out / f"records_ab_{arm}.jsonl", Path(f"/tmp/server_ab_{arm}.log"), [], {"SGLANG_MMTRACE": flag}
            )
        for arm, (_, port) in ARMS.items():
            result[f"startup_{arm}_s"] = wait_healthy(procs[arm], f"http://127.0.0.1:{port}", args.deadline - 60)
        log(f"both healthy: {result}")
        for _, port in ARMS.values():  # warm-up (Triton JIT), not measured
            for _, messages in reference_requests(100):
                timed_chat(port, messages, max_tokens=4)
        for r in range(args.rounds):
            if time.time() > args.deadline - 20:
                result["errors"].append(f"stopped before round {r}: deadline")
                break
            order = ["on", "off"] if r % 2 == 0 else ["off", "on"]
            for kind, messages in reference_requests(r):
                for arm in order:
                    try:
                        t = timed_chat(ARMS[arm][1], messages, max_tokens=4)
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
