"""``sglang-mmtrace``: run, doctor, demo, report, nsys, bench.

- ``run`` (``run -- <command>``): run an SGLang server with the plugin installed in every one of its processes.
- ``doctor``: what the plugin would hook on the installed SGLang, its configuration and limits.
- ``demo``: the real SGLang server on the CPU with a tiny Qwen3-VL, plugin on, breakdown printed.
- ``report``: per-stage tables from a records JSONL (``--html``, ``--chrome-trace``); ``--compare
  BASE NEW``: two JSONL files, per group and stage the change of p50 with a 95% interval, ranked.
- ``nsys``: an Nsight Systems sqlite export's stage NVTX ranges and GPU time, against records.
- ``bench``: the controlled experiments against a running server.
"""

from __future__ import annotations

import argparse
import sys

from . import bench as bench_cli
from . import demo as demo_cli
from . import nsys as nsys_cli
from . import report as report_cli


def build_parser() -> argparse.ArgumentParser:
    """Every subcommand and its options (apart from ``main`` so a test can read them without running one)."""
    parser = argparse.ArgumentParser(
        prog="sglang-mmtrace", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    sub = parser.add_subparsers(dest="cmd", required=True)

    run = sub.add_parser("run", help="run -- python -m sglang.launch_server ...: the plugin in every server process")
    run.add_argument("command", nargs=argparse.REMAINDER, help="the server's command line, after --")
    doctor = sub.add_parser("doctor", help="SGLang version, stage -> target -> resolved?, live sinks")
    doctor.add_argument(
        "--matrix",
        action="store_true",
        help="every supported release x stage, checked in its wheel (downloads), and every harness family x"
        " its multimodal stages",
    )
    doctor.add_argument("--readme", default=None, help="with --matrix: write the tables into this README")
    doctor.add_argument(
        "--model-path",
        default=None,
        help="also name the multimodal stages the model in this folder (its config.json) would lose here"
        " (default: none)",
    )

    demo_cli.add_arguments(
        sub.add_parser("demo", help="real SGLang on the CPU with a tiny Qwen3-VL, plugin on, breakdown printed")
    )

    report = sub.add_parser(
        "report",
        help="per-stage table (p50, p95, share of TTFT) from a JSONL file; --html, --chrome-trace;"
        " --compare BASE NEW: the change per stage, with intervals",
    )
    report_cli.add_arguments(report)

    nsys_cli.add_arguments(
        sub.add_parser("nsys", help="an Nsight Systems sqlite export: stage NVTX ranges and their GPU time vs records")
    )

    bench_cli.add_arguments(
        sub.add_parser(
            "bench", help="controlled experiments (new-vs-repeat, order, caches, transport, overhead, concurrency)"
        )
    )

    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    if args.cmd == "run":
        from ..launcher import run as launch

        return launch(args.command)
    if args.cmd == "doctor":
        from .doctor import run

        return run(args.matrix, args.readme, args.model_path)
    if args.cmd == "demo":
        return demo_cli.run(args)
    if args.cmd == "report":
        return report_cli.run(args)
    if args.cmd == "nsys":
        return nsys_cli.run(args)
    if args.cmd == "bench":
        return bench_cli.run(args)
    return 2


if __name__ == "__main__":
    sys.exit(main())
