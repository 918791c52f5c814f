"""Faults in the plugin's own path: requests keep succeeding, the failure is counted and logged once.

Two real servers (run side by side):

- ``faulty``: OTLP export to a collector that accepts the TCP connection and never reads or answers;
  JSONL records on a 64 KiB tmpfs that fills up after a few dozen records; later its Prometheus
  multiprocess folder (``PROMETHEUS_MULTIPROC_DIR``, set by the test) is deleted while it serves.
- ``readonly``: JSONL records in a read-only folder (a read-only tmpfs: root ignores permission bits).

Without ``mount`` permission the full disk falls back to ``/dev/full`` (every write is ENOSPC) and the
read-only folder to a path under ``/proc``; the test prints which one it used. The OTLP collector that
is down altogether is covered by ``test_server_exporters_grpc.py``, an exception inside every hook by
``test_server_containment.py``. Latency is not asserted here (benchmarks compare it); the observed
counters go to ``faults.md`` in the session's figures folder (``conftest.figures_dir``).
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import subprocess
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest
from conftest import figures_dir, start_server, state
from reliability import (
    SilentCollector,
    at_rest_problems,
    chat_body,
    get,
    metric_total,
    plugin_lines,
    post,
    settled_state,
    sse_usage,
)

from sglang_mmtrace.harness import CpuServer, data_url, image_message, make_image

pytestmark = pytest.mark.server

FILL = 30  # requests that fill the 64 KiB tmpfs (records of a few KiB each)
BATCH = 20  # requests per phase once the faults are established
FIGURE: dict[str, dict[str, Any]] = {}


def _mount(path: Path, options: str) -> bool:
    path.mkdir(parents=True, exist_ok=True)
    return (
        subprocess.run(["mount", "-t", "tmpfs", "-o", options, "tmpfs", str(path)], capture_output=True).returncode == 0
    )


@pytest.fixture(scope="module")
def places(tmp_path_factory):
    root = tmp_path_factory.mktemp("faults-fs")
    full, ro = root / "full", root / "ro"
    mounted = []
    if _mount(full, "size=64k"):
        mounted.append(full)
        full_path, full_kind = str(full / "records.jsonl"), "tmpfs size=64k"
    else:
        full_path, full_kind = "/dev/full", "/dev/full (mount not permitted)"
    if _mount(ro, "ro,size=64k"):
        mounted.append(ro)
        ro_path, ro_kind = str(ro / "records.jsonl"), "read-only tmpfs"
    else:
        ro_path, ro_kind = "/proc/sglang-mmtrace-ro/records.jsonl", "/proc (mount not permitted)"
    print(f"disk full: {full_kind}; read-only: {ro_kind}")
    yield {"full": full_path, "full_kind": full_kind, "ro": ro_path, "ro_kind": ro_kind, "root": root}
    for m in mounted:
        subprocess.run(["umount", str(m)], check=False)


@pytest.fixture(scope="module")
def silent():
    c = SilentCollector()
    yield c
    c.close()


@pytest.fixture(scope="module")
def servers(tmp_path_factory, places, silent):
    prom = places["root"] / "prom"
    prom.mkdir()
    faulty_env = {
        "SGLANG_MMTRACE_JSONL": places["full"],
        "SGLANG_MMTRACE_OTLP_ENDPOINT": f"http://127.0.0.1:{silent.port}",
        "PROMETHEUS_MULTIPROC_DIR": str(prom),
    }
    with contextlib.ExitStack() as stack, ThreadPoolExecutor(2) as pool:
        faulty, readonly = pool.map(
            lambda a: stack.enter_context(start_server(tmp_path_factory, a[0], env=a[1])),
            (("faults-faulty", faulty_env), ("faults-readonly", {"SGLANG_MMTRACE_JSONL": places["ro"]})),
        )
        yield {"faulty": faulty, "readonly": readonly, "prom": prom}
    _write_figure(places)


def _send(srv: CpuServer, tag: str, n: int) -> list[tuple[int, dict[str, Any] | None]]:
    """n requests (alternating new image / text), 2 client threads; (status, usage) each."""

    def one(i: int) -> tuple[int, dict[str, Any] | None]:
        message = {"role": "user", "content": "Fault test: say something short."}
        if i % 2 == 0:
            image = data_url(make_image(128, 128, seed=hash((tag, i)) % 10**6))
            message = image_message("Fault test: what is shown?", [image])
        status, raw = post(srv.port, chat_body(f"fault-{tag}-{i}-{time.time_ns()}", messages=[message]))
        return status, sse_usage(raw) if status == 200 else None

    with ThreadPoolExecutor(2) as pool:
        return list(pool.map(one, range(n)))


def _all_served(results: list[tuple[int, dict[str, Any] | None]]) -> bool:
    return all(status == 200 and usage and usage["completion_tokens"] > 0 for status, usage in results)


def _wait(predicate, limit_s: float = 90.0) -> Any:
    deadline = time.monotonic() + limit_s
    while True:
        value = predicate()
        if value or time.monotonic() > deadline:
            return value
        time.sleep(0.5)


def _jsonl_lines(path: str) -> int:
    if path == "/dev/full":
        return 0
    with open(path, encoding="utf-8") as fh:
        lines = fh.read().split("\n")
    assert lines[-1] == "", "the records file ends mid-line"
    assert all(json.loads(line)["rid"] for line in lines[:-1])
    return len(lines) - 1


def test_full_disk_and_silent_collector(servers, places, silent):
    """Phase 1 and 2 on the faulty server: every request served; records that did not fit are dropped
    and counted exactly (file lines + dropped = records built); OTLP spans pile up against a collector
    that never answers and are dropped and counted; the plugin's log does not grow per request."""
    srv = servers["faulty"]
    base = settled_state(srv)["api"]["records"]  # SGLang's own warm-up request has a record too
    first = _send(srv, "p1", FILL)
    assert _all_served(first), first

    def failing() -> dict[str, Any] | None:
        api = settled_state(srv)["api"]
        return api if api["dropped"].get("jsonl", 0) > 0 and api["dropped"].get("otlp", 0) > 0 else None

    assert _wait(failing, 120), f"the faults did not show yet: {state(srv)['api']}"
    lines_before = plugin_lines(srv)
    failed_batches_before = srv.log_path.read_text(errors="replace").count("Failed to export spans batch")
    second = _send(srv, "p2", BATCH)
    assert _all_served(second), second

    def settled() -> dict[str, Any] | None:
        st = settled_state(srv)
        return st if st["api"]["records"] >= base + FILL + BATCH else None

    st = _wait(settled, 120)
    assert st, json.dumps(state(srv), indent=1)
    api = st["api"]
    written = _jsonl_lines(places["full"])
    assert api["records"] == base + FILL + BATCH, (base, api)
    assert written + api["dropped"]["jsonl"] == api["records"], (written, api)
    assert silent.accepted, "the exporter never connected to the silent collector"
    assert not at_rest_problems(st), st

    lines = plugin_lines(srv)
    assert lines == lines_before, "plugin log grew per request:\n" + "\n".join(lines[len(lines_before) :])
    assert sum("jsonl dropped" in line for line in lines) == 1, "\n".join(lines)
    assert sum("otlp dropped" in line for line in lines) == 1, "\n".join(lines)
    # the OpenTelemetry exporter's own complaint (one per failed batch, every few seconds) is let through once
    log = srv.log_path.read_text(errors="replace")
    assert log.count("Failed to export spans batch") == failed_batches_before == 1
    dropped_metric = _wait(
        lambda: (
            (m := metric_total(srv, "sglang_mmtrace_dropped_total", "sink")).get("jsonl") == api["dropped"]["jsonl"]
            and m
        )
    ) or metric_total(srv, "sglang_mmtrace_dropped_total", "sink")  # synced to /metrics once a second
    assert dropped_metric.get("jsonl") == api["dropped"]["jsonl"], (dropped_metric, api)
    FIGURE["JSONL on a full disk (" + places["full_kind"] + ")"] = {
        "served": f"{sum(s == 200 for s, _ in first + second)}/{FILL + BATCH}",
        "counter": f'dropped_total{{sink="jsonl"}} = {api["dropped"]["jsonl"]} ({written} records written)',
        "log lines": sum("jsonl" in line for line in lines),
    }
    FIGURE["OTLP collector accepts, never answers"] = {
        "served": f"{sum(s == 200 for s, _ in first + second)}/{FILL + BATCH}",
        "counter": f'dropped_total{{sink="otlp"}} = {api["dropped"]["otlp"]} (spans; rising while the exporter times out)',
        "log lines": f"{sum('otlp' in line for line in lines)} (+ {log.count('Failed to export spans batch')} "
        "from the OpenTelemetry exporter)",
    }


def test_prometheus_folder_removed_while_serving(servers):
    srv, prom = servers["faulty"], servers["prom"]
    assert any(prom.iterdir()), "no multiprocess files: is PROMETHEUS_MULTIPROC_DIR honoured?"
    before = len(plugin_lines(srv))
    errors_before = dict(state(srv)["api"]["errors"])
    shutil.rmtree(prom)
    results = _send(srv, "p3", BATCH)
    assert _all_served(results), results
    status, _ = get(srv.port, "/metrics")
    st = settled_state(srv)
    assert not at_rest_problems(st), st
    new_errors = {
        k: v - errors_before.get(k, 0) for k, v in st["api"]["errors"].items() if v != errors_before.get(k, 0)
    }
    lines = plugin_lines(srv)[before:]
    assert len(lines) <= len(new_errors), "more log lines than newly failing components:\n" + "\n".join(lines)
    FIGURE["Prometheus multiprocess folder removed"] = {
        "served": f"{sum(s == 200 for s, _ in results)}/{BATCH}",
        "counter": f"new contained errors {new_errors or 'none'}; GET /metrics -> {status}",
        "log lines": len(lines),
    }


def test_readonly_jsonl_folder(servers, places):
    """The plugin still installs (it used to fail as a whole when the file could not be opened): requests
    are served and measured (records built, other sinks fed), the failure counted once and logged once."""
    srv = servers["readonly"]
    base = settled_state(srv)["api"]["records"]  # SGLang's own warm-up request has a record too
    results = _send(srv, "ro", BATCH)
    assert _all_served(results), results
    st = _wait(lambda: (s := settled_state(srv))["api"]["records"] >= base + BATCH and s)
    assert st and st["api"]["records"] == base + BATCH, state(srv)
    assert st["api"]["errors"] == {"sink.jsonl": 1}, st["api"]
    assert not os.path.exists(places["ro"])
    lines = [line for line in plugin_lines(srv) if "JSONL" in line]
    assert len(lines) == 1, "\n".join(plugin_lines(srv))
    requests = _wait(lambda: metric_total(srv, "sglang_mmtrace_requests_total", "status").get("ok"))
    assert base >= 1 and requests == base - 1 + BATCH  # every record but the start-up warm-up's
    errors = _wait(lambda: metric_total(srv, "sglang_mmtrace_errors_total", "component").get("sink.jsonl"))
    assert errors == 1
    FIGURE["JSONL folder read-only (" + places["ro_kind"] + ")"] = {
        "served": f"{sum(s == 200 for s, _ in results)}/{BATCH}",
        "counter": f'errors_total{{component="sink.jsonl"}} = {int(errors)}; requests_total{{status="ok"}} = {int(requests)}',
        "log lines": len(lines),
    }


def _write_figure(places: dict[str, Any]) -> None:
    if not FIGURE:
        return
    lines = [
        "# Faults in the plugin's own path (real SGLang 0.5.23, CPU, tiny Qwen3-VL)",
        "",
        f"Written by `tests/test_server_faults.py` on {time.strftime('%Y-%m-%d %H:%M:%S %Z')}. "
        "`served` = HTTP 200 with a complete stream; `log lines` = the plugin's own lines about this fault "
        "in the server log (all processes) over the whole run.",
        "",
        "| fault | served | counters | log lines |",
        "|---|---|---|---|",
    ]
    lines += [f"| {k} | {v['served']} | {v['counter']} | {v['log lines']} |" for k, v in FIGURE.items()]
    lines += [
        "| OTLP collector down | see `tests/test_server_exporters_grpc.py` | every span counted in "
        '`dropped_total{sink="otlp"}` | |',
        "| exception in every hook | see `tests/test_server_containment.py` | `errors_total` per hook component "
        "| one per component |",
    ]
    (figures_dir() / "faults.md").write_text("\n".join(lines) + "\n")
