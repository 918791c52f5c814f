"""Issue 11's overhead target applied to A/A controls: would a plugin that costs nothing pass it?

That target (``target_met``; issue 43 replaced it with a paired delta in µs judged against the A/A
of the same rounds) asks that the same-instance ratio of TTFT medians, on over off, be <= 1.005 with
its upper 95% bound <= 1.01. Runs with the A/A control hold a third arm per round with the plugin
off again. For every run under the given folders
(each ``overhead.lines.jsonl.gz`` with a control arm) and each request kind this prints the A/A's
ratio with its interval and whether it meets the target, beside the A/B's. Then, per host kind (GPU,
CPU) and request kind, the A/A rounds of all runs, each divided by its run's 'off' median so that
hosts pool as ratios, are resampled at n rounds (with replacement, seeded) and the share of
resampled runs meeting the target is printed: the chance that a zero-cost plugin passes at n rounds,
i.e. how many rounds the statistic needs before a pass or a fail says something.

    python -m benchmarks.aa_target benchmarks/results --rounds 200 250 500 1000
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import numpy as np

from sglang_mmtrace.bench.overhead import CONTROL, KINDS, pairs, ratio_summary, ttft_ms
from sglang_mmtrace.bench.stats import paired_ratio_ci
from sglang_mmtrace.report.analysis import read_jsonl

TARGET_RATIO = 1.005
TARGET_UPPER = 1.01


def target_met(ratio: float, upper: float) -> bool:
    return bool(ratio <= TARGET_RATIO and upper <= TARGET_UPPER)


def host(lines: list[dict]) -> str:
    """The bench's own target label: the CPU server's starts "cpu" (the GPU scripts' start "h200", on
    an H100 too)."""
    return "cpu" if lines[0]["bench"]["target"].startswith("cpu") else "gpu"


def control_runs(folders: list[str]) -> dict[str, list[dict]]:
    """Every run under the folders whose lines hold a control arm, by its folder."""
    runs = {}
    for folder in folders:
        for path in sorted(Path(folder).glob("**/overhead.lines.jsonl.gz")):
            lines = read_jsonl(str(path))
            if any(ln["bench"].get("arm") == CONTROL for ln in lines):
                runs[str(path.parent)] = lines
    return runs


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("folders", nargs="+", help="result folders, searched for overhead.lines.jsonl.gz")
    ap.add_argument("--rounds", type=int, nargs="+", default=[200, 250, 500, 1000], help="resampled run lengths")
    ap.add_argument("--draws", type=int, default=200, help="resampled runs per length")
    ap.add_argument("--out", help="write the result as JSON here too")
    args = ap.parse_args(argv)
    out: dict = {"runs": {}, "resampled": {}}
    pooled: dict[tuple[str, str], list[np.ndarray]] = {}
    for run, lines in control_runs(args.folders).items():
        out["runs"][run] = {}
        for kind in KINDS:
            aa = ratio_summary(lines, kind, ("off", CONTROL))
            ab = ratio_summary(lines, kind)
            out["runs"][run][kind] = {
                "n": aa["n_pairs"],
                "aa_ratio": [aa["ttft_ratio_on_off"], *aa["ttft_ratio_ci95"]],
                "aa_meets_target": target_met(aa["ttft_ratio_on_off"], aa["ttft_ratio_ci95"][1]),
                "ab_ratio": [ab["ttft_ratio_on_off"], *ab["ttft_ratio_ci95"]],
                "ab_meets_target": target_met(ab["ttft_ratio_on_off"], ab["ttft_ratio_ci95"][1]),
            }
            off, ctl = ttft_ms(pairs(lines, kind, ("off", CONTROL)))
            scale = np.median(off)
            pooled.setdefault((host(lines), kind), []).append(np.stack([off / scale, ctl / scale]))
    rng = np.random.default_rng(0)
    for (h, kind), parts in sorted(pooled.items()):
        both = np.concatenate(parts, axis=1)
        row = {"pooled_rounds": int(both.shape[1])}
        # a length beyond the pooled rounds would only repeat them
        for n in (n for n in args.rounds if n <= both.shape[1]):
            met = 0
            for d in range(args.draws):
                idx = rng.integers(0, both.shape[1], n)
                ratio, _, hi = paired_ratio_ci(both[0, idx], both[1, idx], n_boot=500, seed=d)
                met += target_met(ratio, hi)
            row[f"share_meeting_target_at_{n}"] = round(met / args.draws, 3)
        out["resampled"][f"{h} {kind}"] = row
    for run, kinds in out["runs"].items():
        cells = "  ".join(
            f"{k}: A/A {v['aa_ratio'][0]:.3f} [{v['aa_ratio'][1]:.3f}, {v['aa_ratio'][2]:.3f}] "
            f"{'meets' if v['aa_meets_target'] else 'fails'}"
            for k, v in kinds.items()
        )
        print(f"{run} (n={kinds[KINDS[0]]['n']}): {cells}")
    for key, row in out["resampled"].items():
        print(key, row)
    if args.out:
        Path(args.out).write_text(json.dumps(out, indent=1) + "\n")


if __name__ == "__main__":
    main()
