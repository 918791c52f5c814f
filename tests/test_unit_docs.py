"""The README's generated tables are up to date with the catalogue and the env-var list."""

import re
from pathlib import Path

import pytest

from sglang_mmtrace import docs
from sglang_mmtrace.cli import main as cli

README = Path(__file__).resolve().parents[1] / "README.md"


def test_readme_tables_are_generated_from_the_code():
    text = README.read_text()
    assert docs.render(text) == text, "run: python -m sglang_mmtrace.docs README.md"
    assert "`model.vision_encoder`" in text and "`SGLANG_MMTRACE_JSONL`" in text


def test_cli_docstring_names_every_subcommand(capsys):
    with pytest.raises(SystemExit):
        cli.main(["--help"])
    commands = re.search(r"\{([a-z,]+)\}", capsys.readouterr().out).group(1).split(",")
    assert commands and all(f"``{c}``" in cli.__doc__ for c in commands), (commands, cli.__doc__)
