"""Where the plugin's per-request cost goes: py-spy on one server, plugin on vs off by the switch.

    python3 benchmarks/gpu/profile_017.py --out OUTDIR --deadline EPOCH_S [--model DIR] [--window-s 25]

One server (``$SGLANG_GPU_FLAGS --enable-metrics``, JSONL). For each arm (on, off, on, off), the
switch is set, then py-spy samples the API process, the scheduler and the detokenizer (raw collapsed
stacks, 1 kHz, idle frames excluded) while one client sends new-image / same-image / text requests
one after the other for ``--window-s`` seconds. Writes ``OUTDIR/<arm><i>_<process>.txt`` (py-spy's
raw output) and ``OUTDIR/windows.json`` (requests per window); ``summarize_profiles.py`` reads them.
The samples are CPU time on the process's threads, so a cost anywhere (a hook, a thread, the GC)
shows as more samples per request in the 'on' windows.
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import subprocess
import sys
import time
from pathlib import Path

from sglang_mmtrace.bench import procs, switchctl
from sglang_mmtrace.bench.client import timed_chat
from sglang_mmtrace.bench.experiments import QUESTION
from sglang_mmtrace.bench.targets import LaunchConfig, launched
from sglang_mmtrace.harness import data_url, image_message, make_image
from sglang_mmtrace.harness.random_model import ensure_model
from sglang_mmtrace.report.analysis import quantile


def log(msg: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {msg}", file=sys.stderr, flush=True)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", required=True)
    ap.add_argument("--deadline", type=float, default=time.time() + 540)
    ap.add_argument("--model", default=os.environ.get("MODEL", "/tmp/tiny-qwen3vl"))
    ap.add_argument("--server-flags", default=os.environ.get("SGLANG_GPU_FLAGS", ""))
    ap.add_argument("--window-s", type=float, default=25.0)
    ap.add_argument("--arms", default="on,off,on,off")
    ap.add_argument("--py-spy", default="py-spy")
    args = ap.parse_args()
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    model = ensure_model(Path(args.model))
    cfg = LaunchConfig(
        "h200 0.5.17", ("--model-path", str(model), *shlex.split(args.server_flags), "--enable-metrics"), {}
    )
    fixed = data_url(make_image(640, 480, seed=7, fmt="JPEG"))
    windows = []
    with launched(cfg, Path("/tmp/profile-work"), True, 300.0) as target:
        roles = procs.server_processes(target.pid)
        log(f"processes {roles}")
        for i in range(5):  # warm-up (JIT)
            timed_chat(
                target.base_url, [image_message(QUESTION, [data_url(make_image(640, 480, seed=100 + i, fmt="JPEG"))])]
            )
        n_img = 1000
        for w, arm in enumerate(args.arms.split(",")):
            if time.time() + args.window_s + 20 > args.deadline:
                log(f"stopping before window {w}: deadline")
                break
            switchctl.set_level(target.base_url, None if arm == "off" else tuple(switchctl.PARTS))
            spies = []
            for name in ("api", "scheduler", "detokenizer"):
                pid = target.pid if name == "api" else (roles.get(name) or [None])[0]
                if pid is None:
                    continue
                path = out / f"{arm}{w}_{name}.txt"
                cmd = [args.py_spy, "record", "--pid", str(pid), "--rate", "1000", "--duration", str(int(args.window_s)),
                       "--format", "raw", "--output", str(path), "--nonblocking"]  # fmt: skip
                with (out / f"{arm}{w}_{name}.err").open("w") as err:
                    spies.append(subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=err))
            time.sleep(1.0)
            t_end = time.time() + args.window_s - 2.0
            sent = {"new_image": 0, "same_image": 0, "text": 0}
            ttft: dict[str, list[float]] = {k: [] for k in sent}
            while time.time() < t_end:
                for kind in sent:
                    if kind == "text":
                        msgs = [{"role": "user", "content": f"Round {n_img}: name one colour and one shape."}]
                    else:
                        url = fixed if kind == "same_image" else data_url(make_image(640, 480, seed=n_img, fmt="JPEG"))
                        msgs = [image_message(QUESTION, [url])]
                    n_img += 1
                    r = timed_chat(target.base_url, msgs)
                    sent[kind] += 1
                    ttft[kind].append(r["ttft_s"])
                    time.sleep(0.06)
            for p in spies:
                p.wait(timeout=60)
            med = {k: (quantile(v, 0.5) * 1000 if v else None) for k, v in ttft.items()}
            windows.append({"window": w, "arm": arm, "sent": sent, "ttft_p50_ms": med})
            log(f"window {w} ({arm}): {sent} TTFT p50 ms {med}")
            (out / "windows.json").write_text(json.dumps(windows, indent=1))
        switchctl.set_level(target.base_url, tuple(switchctl.PARTS))
    return 0


if __name__ == "__main__":
    sys.exit(main())
