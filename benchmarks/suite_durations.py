"""Where the test suite's time goes: the ``--durations=0`` lines of a pytest log, per test module.

Usage: ``python -m benchmarks.suite_durations LOG [LOG...]`` (``tests/run.sh --durations=0 > LOG``);
one Markdown table per log: each module's set-up (mostly server start-ups: a module fixture is set
up by its first test), call and teardown seconds, its share of the whole, and the slowest items.
"""

from __future__ import annotations

import argparse
import re
from collections import defaultdict
from pathlib import Path

LINE = re.compile(r"^(?P<s>[0-9.]+)s (?P<phase>setup|call|teardown)\s+(?P<node>\S+)")
WALL = re.compile(r"=+ .*? in (?P<s>[0-9.]+)s(?: \((?P<hms>[0-9:]+)\))? =+$")
PHASES = ("setup", "call", "teardown")


def parse(text: str) -> tuple[list[tuple[float, str, str]], float | None]:
    """(seconds, phase, node id) of every duration line, and the session's wall time when printed."""
    items = [(float(m["s"]), m["phase"], m["node"]) for line in text.splitlines() if (m := LINE.match(line))]
    walls = [float(m["s"]) for line in text.splitlines() if (m := WALL.search(line))]
    return items, (walls[-1] if walls else None)


def table(items: list[tuple[float, str, str]], wall: float | None, top: int) -> str:
    per: dict[str, dict[str, float]] = defaultdict(lambda: dict.fromkeys(PHASES, 0.0))
    for seconds, phase, node in items:
        per[node.split("::", 1)[0]][phase] += seconds
    total = sum(s for s, _, _ in items)
    out = [
        f"Sum of the listed durations: {total:.0f} s" + (f"; session wall time {wall:.0f} s" if wall else ""),
        "",
        "| module | setup s | call s | teardown s | total s | share |",
        "|---|---:|---:|---:|---:|---:|",
    ]
    for module, ph in sorted(per.items(), key=lambda kv: -sum(kv[1].values())):
        t = sum(ph.values())
        out.append(
            f"| `{module}` | {ph['setup']:.1f} | {ph['call']:.1f} | {ph['teardown']:.1f} | {t:.1f} | {t / total:.1%} |"
        )
    out += ["", f"Slowest {top} items:", "", "| s | phase | test |", "|---:|---|---|"]
    out += [f"| {s:.1f} | {phase} | `{node}` |" for s, phase, node in sorted(items, reverse=True)[:top]]
    return "\n".join(out)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("logs", nargs="+", type=Path, help="pytest logs written with --durations=0")
    ap.add_argument("--top", type=int, default=25, help="how many of the slowest items to list (default %(default)s)")
    args = ap.parse_args(argv)
    for log in args.logs:
        items, wall = parse(log.read_text(errors="replace"))
        print(f"## {log}\n\n{table(items, wall, args.top)}\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
