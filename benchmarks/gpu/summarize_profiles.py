"""Summarize ``profile_017.py``'s py-spy windows: CPU samples per request, plugin on vs off.

    python3 benchmarks/gpu/summarize_profiles.py PROFILE_DIR

Per process (api, scheduler, detokenizer) and window: py-spy samples (1 kHz, so ~ms of thread time)
per request sent in the window, the mean of the 'on' windows minus the mean of the 'off' windows,
and the samples whose innermost frame is plugin code or a library call made from plugin code (torch
CUDA events, ZMQ, pickle): the plugin's own time. py-spy ran with ``--nonblocking`` (the server is
not paused), so single stacks can be torn; only totals over thousands of samples are read here.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

PROCESSES = ("api", "scheduler", "detokenizer")
PLUGIN_CALLS = ("torch/cuda", "zmq/", "pickle", "threading.py")


def plugin_own(stack: list[str]) -> bool:
    """The innermost plugin frame is the leaf, or calls a library the plugin uses (not the wrapped SGLang call)."""
    idx = [k for k, f in enumerate(stack) if "sglang_mmtrace" in f]
    if not idx:
        return False
    deeper = stack[idx[-1] + 1 :]
    return not deeper or any(lib in deeper[0] for lib in PLUGIN_CALLS)


def read(path: Path) -> tuple[int, int]:
    total = own = 0
    for line in path.read_text().splitlines():
        stack, _, count = line.rpartition(" ")
        n = int(count)
        total += n
        own += n if plugin_own(stack.split(";")) else 0
    return total, own


def main(folder: Path) -> str:
    windows = json.loads((folder / "windows.json").read_text())
    rows = ["| window | arm | requests | " + " | ".join(f"{p} samples/req (plugin's own)" for p in PROCESSES) + " |",
            "|---|---|---:|" + "---:|" * len(PROCESSES)]  # fmt: skip
    per_arm: dict[str, dict[str, list[float]]] = {}
    for w in windows:
        n = sum(w["sent"].values())
        cells = []
        for proc in PROCESSES:
            path = folder / f"{w['arm']}{w['window']}_{proc}.txt"
            total, own = read(path) if path.exists() else (0, 0)
            per_arm.setdefault(w["arm"], {}).setdefault(proc, []).append(total / n)
            cells.append(f"{total / n:.2f} ({own / n:.2f})")
        rows.append(f"| {w['window']} | {w['arm']} | {n} | " + " | ".join(cells) + " |")
    mean = {arm: {p: sum(v) / len(v) for p, v in d.items()} for arm, d in per_arm.items()}
    if "on" in mean and "off" in mean:
        rows.append(
            "| on - off | | | " + " | ".join(f"{mean['on'][p] - mean['off'][p]:+.2f}" for p in PROCESSES) + " |"
        )
    return "\n".join(rows) + "\n"


if __name__ == "__main__":
    out = main(Path(sys.argv[1]))
    print(out, end="")
