"""The check recorded in this folder's NOTES.md: how many of the plugin's per-request objects the API
process still holds after its requests ended, and what a full collection then frees.

    python3 benchmarks/results/gc-cpu-20261201/live_check.py OUTDIR

Starts the CPU demo server with the probe (``benchmarks/gpu/probe``) on its PYTHONPATH, sends 30
then 60 requests (new image / same image / text, one at a time), and after each batch signals the
API, scheduler and detokenizer processes (SIGUSR1): the probe counts live ``ApiTrace``/``HttpCtx``/
``ReqTrace``/``FwdCtx`` objects, runs ``gc.collect()`` and counts again, into
``OUTDIR/probe/<pid>.live.txt``, printed per process at the end.
"""

import os
import signal
import sys
import time
from pathlib import Path

from sglang_mmtrace.bench import procs
from sglang_mmtrace.bench.client import timed_chat
from sglang_mmtrace.bench.overhead import Workload
from sglang_mmtrace.bench.targets import LaunchConfig, default_config, launched
from sglang_mmtrace.harness import SHIMS_DIR

PROBE = Path(__file__).resolve().parents[2] / "gpu" / "probe"
out = Path(sys.argv[1]) / "probe"
out.mkdir(parents=True, exist_ok=True)
path = os.pathsep.join((str(PROBE), str(SHIMS_DIR), os.environ.get("PYTHONPATH", "")))
cfg = LaunchConfig("cpu live check", default_config(False).args, {"MMTRACE_PROBE_DIR": str(out), "PYTHONPATH": path})
workload = Workload(seed=7, nonce=f"live{int(time.time())}")
with launched(cfg, Path("/tmp/live-check-work"), False, 300.0) as target:
    roles = procs.server_processes(target.pid)
    pids = {role: roles[role][0] for role in ("api", "scheduler", "detokenizer")}
    for first, last in ((0, 10), (10, 30)):
        for r in range(first, last):
            for kind in ("new_image", "same_image", "text"):
                timed_chat(target.base_url, workload.messages(kind, r, "live"))
        time.sleep(3)
        for pid in pids.values():
            os.kill(pid, signal.SIGUSR1)
        time.sleep(1)
    for role, pid in pids.items():
        live = out / f"{pid}.live.txt"
        print(role, live.read_text() if live.exists() else "(no answer)")
