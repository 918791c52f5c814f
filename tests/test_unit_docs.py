"""The README's generated tables are up to date with the catalogue and the env-var list; the README stays the
user's document and the committed results stay curated (issue 41's limits)."""

import argparse
import re
from pathlib import Path

import pytest

from sglang_mmtrace import docs
from sglang_mmtrace.cli import main as cli
from sglang_mmtrace.join.collector import JOINED_STAGES
from sglang_mmtrace.stages import STAGES

ROOT = Path(__file__).resolve().parents[1]
README = ROOT / "README.md"
RESULTS = ROOT / "benchmarks" / "results"


def test_readme_tables_are_generated_from_the_code():
    text = README.read_text()
    assert docs.render(text) == text, "run: python -m sglang_mmtrace.docs README.md"
    assert "`model.vision_encoder`" in text and "`SGLANG_MMTRACE_JSONL`" in text


def test_every_stage_names_what_measures_it():
    """A hook of the primary version's manifest, or the collector's join; never an empty cell."""
    by = docs.measured_by()
    assert set(STAGES) <= set(by), set(STAGES) - set(by)
    assert {s for s, v in by.items() if v == "collector (join)"} == set(JOINED_STAGES)


def test_cli_docstring_names_every_subcommand(capsys):
    with pytest.raises(SystemExit):
        cli.main(["--help"])
    commands = re.search(r"\{([a-z,]+)\}", capsys.readouterr().out).group(1).split(",")
    assert commands and all(f"``{c}``" in cli.__doc__ for c in commands), (commands, cli.__doc__)


def test_every_option_has_help_and_names_its_default():
    """``--help`` of every subcommand: each argument explains itself, and each with a default worth
    knowing (not None, off, or empty) prints it through ``%(default)s``, so the text cannot drift from
    the code."""
    sub = next(a for a in cli.build_parser()._actions if isinstance(a, argparse._SubParsersAction))
    seen = 0
    for name, parser in sub.choices.items():
        for action in parser._actions:
            if isinstance(action, argparse._HelpAction):
                continue
            seen += 1
            where = f"{name} {'/'.join(action.option_strings) or action.dest}"
            assert action.help, f"{where}: no help text"
            if action.default not in (None, False, [], argparse.SUPPRESS):
                assert "%(default)s" in action.help, f"{where}: default {action.default!r} not in its help"
    assert seen > 40  # every subcommand's options were read
    demo_help = sub.choices["demo"].format_help()
    assert "(default 5)" in demo_help and "(default 0: a free port)" in demo_help


def test_readme_is_the_users_document():
    """Method, history and every run's figures live in docs/; the README links to them."""
    lines = README.read_text().splitlines()
    assert len(lines) <= 300, f"README.md has {len(lines)} lines: move detail to docs/"
    assert "docs/performance.md" in README.read_text()


def test_committed_results_are_curated_and_hold_no_code():
    """benchmarks/results keeps the runs docs/ cite (its README is the index), and no code: analysis
    worth keeping is a tool in benchmarks/ that takes result folders as arguments."""
    entries = sorted(p.name for p in RESULTS.iterdir())
    assert len(entries) <= 15, entries
    code = [p for p in RESULTS.rglob("*") if p.suffix in {".py", ".sh", ".diff", ".patch"}]
    assert not code, code
    index = (RESULTS / "README.md").read_text()
    assert all(name in index for name in entries if name != "README.md"), "an entry missing from the index"
