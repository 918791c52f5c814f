"""The README's generated tables are up to date with the catalogue and the env-var list."""

import re
from pathlib import Path

import pytest

from sglang_mmtrace import docs
from sglang_mmtrace.cli import main as cli
from sglang_mmtrace.join.collector import JOINED_STAGES
from sglang_mmtrace.stages import STAGES

README = Path(__file__).resolve().parents[1] / "README.md"


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
