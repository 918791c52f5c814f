"""``sglang-mmtrace``: run, doctor, demo, report, nsys, bench.

- ``run`` (``run -- <command>``): run an SGLang server with the plugin installed in every one of its processes.
- ``doctor``: what the plugin would hook on the installed SGLang, its configuration and limits.
- ``demo``: the real SGLang server on the CPU with a tiny Qwen3-VL, plugin on, breakdown printed.
- ``report``: per-stage tables from a records JSONL (``--html``, ``--chrome-trace``); ``--compare
  BASE NEW``: two JSONL files, per group and stage the change of p50 with a 95% interval, ranked.
- ``nsys``: an Nsight Systems sqlite export's stage NVTX ranges and GPU time, against records.
- ``bench``: the controlled experiments against a running server.

``run``, ``doctor``, ``report`` and ``nsys`` work on the base install; ``bench`` needs the ``bench``
extra and ``demo`` SGLang (the ``instruments`` extra), and without it each says so in one line with
exit status 2 (:mod:`.extras`). Their modules are imported here only when present, so the base
install's subcommands never load the lab.
"""

from __future__ import annotations

import argparse
import sys
from types import ModuleType

from ..package import sglang_version
from . import nsys as nsys_cli
from . import report as report_cli
from .extras import BENCH, SGLANG, lacks_extra, needs_extra

PROG = "sglang-mmtrace"
LAB_EXTRAS = {"bench": BENCH, "demo": SGLANG}  # the lab's subcommands and the extra each needs


def _lab_cli(name: str) -> ModuleType | None:
    """The lab subcommand's module ``cli.<name>``, or None where the lab's modules are not installed."""
    # Plain imports, not importlib: the import graph (tests/test_unit_layers.py) sees them.
    try:
        if name == "bench":
            from . import bench as module
        else:
            from . import demo as module
    except ModuleNotFoundError as exc:
        if not lacks_extra(exc):
            raise
        return None
    return module


def _add_lab(sub: argparse._SubParsersAction, name: str, summary: str) -> None:
    """``name``'s parser with its options, or, without the extra, one that takes any arguments and
    marks the namespace so that ``main`` says what to install instead of a usage error."""
    module = _lab_cli(name)
    if module is None:
        extra = LAB_EXTRAS[name]
        sub.add_parser(name, help=f"{summary} (needs the '{extra}' extra)", add_help=False).set_defaults(
            missing_extra=extra
        )
    else:
        module.add_arguments(sub.add_parser(name, help=summary))


def build_parser() -> argparse.ArgumentParser:
    """Every subcommand and its options (apart from ``main`` so a test can read them without running one)."""
    parser = argparse.ArgumentParser(
        prog=PROG, description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
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
        help="also name the multimodal stages the model in this folder (its config.json) would lose here,"
        " per modality it takes, and the cache outcome a new item's record will claim (default: none)",
    )
    doctor.add_argument(
        "--model-impl",
        default="sglang",
        help="with --model-path: SGLang's --model-impl the model is served with, sglang or transformers"
        " (default: %(default)s)",
    )
    doctor.add_argument(
        "--url",
        default=None,
        help="a running server: read its model path and --model-impl from GET /get_server_info (then as --model-path)",
    )

    _add_lab(sub, "demo", "real SGLang on the CPU with a tiny Qwen3-VL, plugin on, breakdown printed")

    report = sub.add_parser(
        "report",
        help="per-stage table (p50, p95, share of TTFT) from a JSONL file; --html, --chrome-trace;"
        " --compare BASE NEW: the change per stage, with intervals",
    )
    report_cli.add_arguments(report)

    nsys_cli.add_arguments(
        sub.add_parser("nsys", help="an Nsight Systems sqlite export: stage NVTX ranges and their GPU time vs records")
    )

    _add_lab(sub, "bench", "controlled experiments (new-vs-repeat, order, caches, transport, overhead, concurrency)")

    return parser


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args, unknown = parser.parse_known_args(argv)
    if getattr(args, "missing_extra", None):
        return needs_extra(f"{PROG} {args.cmd}", args.missing_extra)
    if args.cmd == "demo" and sglang_version() is None:
        return needs_extra(f"{PROG} demo", SGLANG)
    if unknown:
        parser.error(f"unrecognized arguments: {' '.join(unknown)}")
    try:
        return _run(args)
    except ModuleNotFoundError as exc:  # an extra's module imported where a subcommand's mode needs it
        if not lacks_extra(exc):
            raise
        return needs_extra(f"{PROG} {args.cmd}")


def _run(args: argparse.Namespace) -> int:
    if args.cmd == "run":
        from ..launcher import run as launch

        return launch(args.command)
    if args.cmd == "doctor":
        from .doctor import run

        return run(args.matrix, args.readme, args.model_path, args.model_impl, args.url)
    if args.cmd in ("demo", "bench"):
        module = _lab_cli(args.cmd)
        assert module is not None  # main said what to install when the extra is missing
        return module.run(args)
    if args.cmd == "report":
        return report_cli.run(args)
    if args.cmd == "nsys":
        return nsys_cli.run(args)
    return 2


if __name__ == "__main__":
    sys.exit(main())
