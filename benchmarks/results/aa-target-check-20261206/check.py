"""The issue 11 target's statistic applied to the committed same-instance A/A controls (plugin off in
both arms): how often does a run with no plugin cost pass it, and how many rounds would it need?

    python benchmarks/results/aa-target-check-20261206/check.py

For every committed run with a control arm, per kind: the A/A ratio of medians with its bootstrap
interval (``overhead.paired_summary`` with arms ``("off", CONTROL)``, the bench's own helper) and
whether it meets the target (ratio <= 1.005 and upper bound <= 1.01), and the same for the A/B.
Then, per host kind (GPU: H100/H200; CPU), the A/A rounds of all runs pooled per kind are resampled
at n rounds (with replacement, seeded), and the share of those resampled A/A runs that meet the
target is given: the chance that a plugin costing nothing passes the issue's test at n rounds.
Each kind's A/A rounds are first divided by their run's A/A off median, so runs on slower and
faster hosts pool as ratios.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np

from sglang_mmtrace.bench.overhead import CONTROL, KINDS, paired_summary, pairs, target_met, ttft_ms
from sglang_mmtrace.bench.stats import paired_ratio_ci
from sglang_mmtrace.report.analysis import read_jsonl

HERE = Path(__file__).parent
RESULTS = HERE.parent
ROUNDS = (200, 250, 500, 1000)
"""Resampled run lengths; one longer than a host's pooled rounds is skipped (it would only repeat them)."""
DRAWS = 200


def host(lines: list[dict]) -> str:
    """The bench's own target label: the CPU server's is "cpu demo config" (every GPU run's starts "h200",
    on an H100 too)."""
    return "cpu" if lines[0]["bench"]["target"].startswith("cpu") else "gpu"


def main() -> None:
    runs = {}
    for path in sorted(RESULTS.glob("**/overhead.lines.jsonl.gz")):
        lines = read_jsonl(str(path))
        if any(ln["bench"].get("arm") == CONTROL for ln in lines):
            runs[str(path.parent.relative_to(RESULTS))] = lines
    out: dict = {"runs": {}, "resampled": {}}
    pooled: dict[tuple[str, str], list[np.ndarray]] = {}
    for run, lines in runs.items():
        out["runs"][run] = {}
        for kind in KINDS:
            aa = paired_summary(lines, kind, ("off", CONTROL))
            ab = paired_summary(lines, kind)
            out["runs"][run][kind] = {
                "n": aa["n_pairs"],
                "aa_ratio": [aa["ttft_ratio_on_off"], *aa["ttft_ratio_ci95"]],
                "aa_meets_target": aa["target"]["met"],
                "ab_ratio": [ab["ttft_ratio_on_off"], *ab["ttft_ratio_ci95"]],
                "ab_meets_target": ab["target"]["met"],
            }
            off, ctl = ttft_ms(pairs(lines, kind, ("off", CONTROL)))
            scale = np.median(off)
            pooled.setdefault((host(lines), kind), []).append(np.stack([off / scale, ctl / scale]))
    rng = np.random.default_rng(0)
    for (h, kind), parts in sorted(pooled.items()):
        both = np.concatenate(parts, axis=1)
        row = {"pooled_rounds": int(both.shape[1])}
        for n in (n for n in ROUNDS if n <= both.shape[1]):
            met = 0
            for d in range(DRAWS):
                idx = rng.integers(0, both.shape[1], n)
                ratio, _, hi = paired_ratio_ci(both[0, idx], both[1, idx], n_boot=500, seed=d)
                met += target_met(ratio, hi)
            row[f"share_meeting_target_at_{n}"] = round(met / DRAWS, 3)
        out["resampled"][f"{h} {kind}"] = row
    text = json.dumps(out, indent=1) + "\n"
    (HERE / "aa_target.json").write_text(text)
    for run, kinds in out["runs"].items():
        cells = "  ".join(
            f"{k}: A/A {v['aa_ratio'][0]:.3f} [{v['aa_ratio'][1]:.3f}, {v['aa_ratio'][2]:.3f}] {'meets' if v['aa_meets_target'] else 'fails'}"
            for k, v in kinds.items()
        )
        print(f"{run} (n={kinds[KINDS[0]]['n']}): {cells}")
    for key, row in out["resampled"].items():
        print(key, row)


if __name__ == "__main__":
    main()
