"""``sglang-mmtrace report`` on bad input: one line on stderr naming the file (and line), never a traceback.

Each case once, through the CLI's ``main`` on files in ``tmp_path``: a file that cannot be read
and a file without one valid record exit 1; lines that are not records (garbage, a half-written
last line as a live server's file has, a JSON value that is not a record) are skipped and counted,
and the rest is reported; ``--html`` / ``--chrome-trace`` create a missing folder, and an output that
cannot be written is one line and exit 1.
"""

from __future__ import annotations

import gzip
import json
from pathlib import Path
from typing import Any

import pytest
from record_checks import ok_record

from sglang_mmtrace.cli.main import main


def _line(rid: str) -> str:
    return json.dumps(ok_record(rid)) + "\n"


def _report(capsys: pytest.CaptureFixture[str], *args: Any) -> tuple[int, str, str]:
    rc = main(["report", *map(str, args)])
    out, err = capsys.readouterr()
    return rc, out, err


def _one_line(err: str) -> str:
    lines = err.strip().splitlines()
    assert len(lines) == 1, f"expected one line on stderr, got:\n{err}"
    assert lines[0].startswith("sglang-mmtrace report: "), lines[0]
    return lines[0]


def test_missing_file(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = tmp_path / "nothing.jsonl"
    rc, out, err = _report(capsys, path)
    assert rc == 1 and not out
    assert _one_line(err).endswith(f"{path}: No such file or directory")


def test_directory(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    rc, out, err = _report(capsys, tmp_path)
    assert rc == 1 and not out
    assert _one_line(err).endswith(f"{tmp_path}: is a directory, not a records file")


def test_garbage_line_is_skipped_and_named(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = tmp_path / "r.jsonl"
    path.write_text(_line("a") + "this is not json\n" + "\n" + _line("b"))
    rc, out, err = _report(capsys, path)
    assert rc == 0
    assert "(n=2)" in out  # both records reported
    assert _one_line(err).endswith(f"{path}: 1 line skipped (line 2: not JSON (Expecting value))")


def test_truncated_last_line_of_a_live_file(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = tmp_path / "r.jsonl"
    path.write_text(_line("a") + _line("b") + _line("c")[:40])  # the server is still writing line 3
    rc, out, err = _report(capsys, path)
    assert rc == 0
    assert "(n=2)" in out
    assert _one_line(err).endswith("1 line skipped (line 3: incomplete last line)")


def test_json_array_is_not_a_records_file(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = tmp_path / "r.json"
    path.write_text(json.dumps([ok_record("a"), ok_record("b")]) + "\n")
    rc, out, err = _report(capsys, path)
    assert rc == 1 and not out
    why = "a JSON array, not a record object"
    assert _one_line(err).endswith(f"{path}: no valid records; 1 line skipped (line 1: {why})")


@pytest.mark.parametrize(
    ("line", "why"),
    [
        ('{"ttft_s": 0.1}', "no 'rid': not a record"),
        ('{"rid": "x", "stages": [{"name": "request"}]}', "'stages' is not a list of {name, start_s, dur_s, attrs}"),
        ('{"rid": "x", "ttft_s": "fast"}', "'ttft_s' is not a number"),
        ('{"rid": "x", "cache": []}', "'cache' is not an object"),
        ('{"rid": "x", "status": "ok", "ttft_s": 0.1}', "an ok record without 'coverage'"),
    ],
)
def test_object_that_is_not_a_record_is_skipped(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], line: str, why: str
) -> None:
    path = tmp_path / "r.jsonl"
    path.write_text(_line("a") + line + "\n")
    rc, out, err = _report(capsys, path)
    assert rc == 0 and "(n=1)" in out
    assert _one_line(err).endswith(f"1 line skipped (line 2: {why})")


def test_no_valid_record_names_the_first_bad_lines(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = tmp_path / "r.jsonl"
    path.write_text("".join(f"garbage {i}\n" for i in range(5)))
    rc, out, err = _report(capsys, path)
    assert rc == 1 and not out
    assert _one_line(err).endswith(
        "no valid records; 5 lines skipped (line 1: not JSON (Expecting value); line 2: not JSON (Expecting value); "
        "line 3: not JSON (Expecting value); 2 more)"
    )


def test_a_gzipped_file_is_read_through_gzip(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = tmp_path / "overhead.lines.jsonl.gz"  # how committed bench runs keep their lines
    with gzip.open(path, "wt") as fh:
        fh.write(_line("a") + _line("b") + "not json\n")
    rc, out, err = _report(capsys, path)
    assert rc == 0 and "(n=2)" in out
    assert _one_line(err).endswith("1 line skipped (line 3: not JSON (Expecting value))")


def test_a_gzipped_file_cut_short_is_one_line(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = tmp_path / "r.jsonl.gz"
    path.write_bytes(gzip.compress((_line("a") * 50).encode())[:-30])
    rc, out, err = _report(capsys, path)
    assert rc == 1 and not out
    assert _one_line(err).endswith(f"{path}: the gzip stream ends early")


def test_empty_file(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = tmp_path / "r.jsonl"
    path.write_text("\n")
    rc, out, err = _report(capsys, path)
    assert rc == 1 and not out
    assert _one_line(err).endswith(f"{path}: no records (empty file)")


def test_outputs_into_a_missing_folder_create_it(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = tmp_path / "r.jsonl"
    path.write_text(_line("a") + _line("b"))
    html, trace = tmp_path / "new" / "deeper" / "r.html", tmp_path / "other" / "t.json"
    rc, _, err = _report(capsys, path, "--html", html, "--chrome-trace", trace)
    assert rc == 0, err
    assert html.read_text().startswith("<!DOCTYPE html>") and json.loads(trace.read_text())["traceEvents"]


def test_output_that_cannot_be_written(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = tmp_path / "r.jsonl"
    path.write_text(_line("a"))
    blocker = tmp_path / "a-file"
    blocker.write_text("")
    rc, _, err = _report(capsys, path, "--html", blocker / "r.html")
    assert rc == 1
    assert _one_line(err).endswith(f"cannot create folder {blocker}: File exists")
    rc, _, err = _report(capsys, path, "--chrome-trace", tmp_path)
    assert rc == 1
    assert _one_line(err).endswith(f"cannot write {tmp_path}: Is a directory")


def test_warmup_records_are_left_out_unless_asked(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """A JIT-bound warm-up (10 s) would be the p95 of a short run: left out, said so, kept on request."""
    path = tmp_path / "records.jsonl"
    warm = {**ok_record("warm", ttft_s=10.0), "warmup": True}
    path.write_text(json.dumps(warm) + "\n" + "".join(_line(f"r{i}") for i in range(3)))
    rc, out, err = _report(capsys, path, "--json")
    assert rc == 0 and _one_line(err).endswith("1 warm-up record(s) left out (--include-warmup keeps them)")
    (group,) = json.loads(out).values()
    assert group["n"] == 3
    rc, out, err = _report(capsys, path, "--json", "--include-warmup")
    assert rc == 0 and not err
    (group,) = json.loads(out).values()
    assert group["n"] == 4


def test_records_from_tracing_windows_are_said_to_be_a_sample(tmp_path: Path, capsys) -> None:
    path = tmp_path / "records.jsonl"
    window = {"window_s": 10.0, "period_s": 60.0}
    path.write_text("".join(json.dumps({**ok_record(f"w{i}"), "window": window}) + "\n" for i in range(2)))
    rc, out, err = _report(capsys, path, "--json")
    assert rc == 0 and _one_line(err).endswith(
        "sampled by tracing windows: 10 s every 60 s (2 of 2 records; counts and rates are a sample)"
    )
    path.write_text(_line("r0"))
    rc, out, err = _report(capsys, path, "--json")
    assert rc == 0 and not err


def test_only_warmup_records_is_an_error_that_names_the_option(tmp_path: Path, capsys) -> None:
    path = tmp_path / "records.jsonl"
    path.write_text(json.dumps({**ok_record("warm"), "warmup": True}) + "\n")
    rc, out, err = _report(capsys, path)
    assert rc == 1 and not out and _one_line(err).endswith("only warm-up records; --include-warmup shows them")
