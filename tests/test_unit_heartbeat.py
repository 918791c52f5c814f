"""The suite's heartbeat (``conftest.Heartbeat``): a step that lasts is named while it runs, with its
elapsed time and latest detail; a short step, or one that has ended, prints nothing."""

from __future__ import annotations

import time

from conftest import Heartbeat


def test_a_long_step_is_named_with_its_elapsed_time_and_detail():
    lines: list[str] = []
    beat = Heartbeat(lines.append, every=0.4)
    with beat.step("setting up server (module)"):
        beat.detail("demo-server: loading the model weights")
        time.sleep(1.0)
    assert lines, "no progress line during a step of 2.5 intervals"
    assert all(line.startswith("  ... setting up server (module): ") for line in lines), lines
    assert lines[-1].endswith("s (demo-server: loading the model weights)"), lines
    done = len(lines)
    time.sleep(0.6)
    assert len(lines) == done, f"lines after the step ended: {lines[done:]}"


def test_the_innermost_step_is_named_and_a_short_one_prints_nothing():
    lines: list[str] = []
    beat = Heartbeat(lines.append, every=0.4)
    with beat.step("outer"):
        with beat.step("inner"):
            time.sleep(0.1)
        assert lines == []
        with beat.step("inner 2"):
            time.sleep(0.7)
    assert lines and lines[0].startswith("  ... inner 2: "), lines
