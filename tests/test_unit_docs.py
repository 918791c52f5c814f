"""The README's generated tables are up to date with the catalogue and the env-var list."""

from pathlib import Path

from sglang_mmtrace import docs

README = Path(__file__).resolve().parents[1] / "README.md"


def test_readme_tables_are_generated_from_the_code():
    text = README.read_text()
    assert docs.render(text) == text, "run: python -m sglang_mmtrace.docs README.md"
    assert "`model.vision_encoder`" in text and "`SGLANG_MMTRACE_JSONL`" in text
