"""Run a real Prometheus server (Debian package ``prometheus``) and ``promtool`` from tests.

The package starts no service on these machines; :class:`PrometheusServer` starts
``prometheus`` itself with a generated config that scrapes one target every second (and evaluates
the given rule files as often), a temporary TSDB and a free port on 127.0.0.1, and stops it
(SIGTERM, then SIGKILL) when done.
"""

from __future__ import annotations

import contextlib
import json
import shutil
import socket
import subprocess
import time
import urllib.error
import urllib.parse
import urllib.request
from collections import deque
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pytest

INSTALL_HINT = "apt-get update && apt-get install -y prometheus  (Debian package; provides prometheus and promtool)"


def missing_tools() -> list[str]:
    return [tool for tool in ("prometheus", "promtool") if shutil.which(tool) is None]


def require_tools() -> None:
    """Skip the calling test (or fixture) when ``prometheus`` or ``promtool`` is not on PATH.

    A missing peer is the machine's gap, not the plugin's failure: the skip names what to install
    (``tests/run.sh`` installs it where it can) and pytest's ``-rs`` summary shows it.
    """
    missing = missing_tools()
    if missing:
        pytest.skip(f"{' and '.join(missing)} not on PATH; install with: {INSTALL_HINT}")


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def http_get(url: str, timeout: float = 10.0) -> tuple[int, bytes]:
    try:
        with urllib.request.urlopen(url, timeout=timeout) as resp:
            return resp.status, resp.read()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read()


class PrometheusServer:
    """``prometheus`` scraping ``target`` (``host:port``) at ``metrics_path`` every ``interval_s``."""

    JOB = "sglang"

    def __init__(
        self,
        target: str,
        folder: Path,
        metrics_path: str = "/metrics",
        interval_s: int = 1,
        rule_files: Sequence[Path] = (),
        exemplars: bool = False,
    ) -> None:
        self.target = target
        self.exemplars = exemplars
        # --enable-feature=exemplar-storage: Prometheus then scrapes in OpenMetrics and keeps exemplars.
        self.rule_files = [Path(p).resolve() for p in rule_files]
        self.folder = folder
        self.metrics_path = metrics_path
        self.interval_s = interval_s
        self.port = 0
        self.process: subprocess.Popen[bytes] | None = None
        self.log_path = folder / "prometheus.log"
        self.config_path = folder / "prometheus.yml"

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def config(self) -> str:
        rules = "".join(f"  - {json.dumps(str(p))}\n" for p in self.rule_files)
        return (
            "global:\n"
            f"  scrape_interval: {self.interval_s}s\n"
            f"  scrape_timeout: {self.interval_s}s\n"
            f"  evaluation_interval: {self.interval_s}s\n"
            + (f"rule_files:\n{rules}" if rules else "")
            + "scrape_configs:\n"
            f"  - job_name: {self.JOB}\n"
            f"    metrics_path: {self.metrics_path}\n"
            "    static_configs:\n"
            f"      - targets: ['{self.target}']\n"
        )

    def start(self, timeout: float = 120.0) -> PrometheusServer:
        self.folder.mkdir(parents=True, exist_ok=True)
        self.config_path.write_text(self.config())
        check = subprocess.run(
            ["promtool", "check", "config", str(self.config_path)], capture_output=True, text=True, timeout=60
        )
        if check.returncode != 0:
            raise RuntimeError(f"promtool check config failed:\n{check.stdout}\n{check.stderr}")
        self.port = free_port()
        with self.log_path.open("wb") as log:
            self.process = subprocess.Popen(
                [
                    "prometheus",
                    f"--config.file={self.config_path}",
                    f"--storage.tsdb.path={self.folder / 'tsdb'}",
                    f"--web.listen-address=127.0.0.1:{self.port}",
                    "--storage.tsdb.retention.time=1h",
                    "--log.level=warn",
                    *(["--enable-feature=exemplar-storage"] if self.exemplars else []),
                ],
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
        deadline = time.monotonic() + timeout
        while True:
            if self.process.poll() is not None:
                raise RuntimeError(f"prometheus exited with {self.process.returncode}:\n{self.log_tail()}")
            with contextlib.suppress(OSError):
                if http_get(self.url + "/-/ready", timeout=2)[0] == 200:
                    return self
            if time.monotonic() > deadline:
                self.stop()
                raise TimeoutError(f"prometheus not ready after {timeout:.0f} s:\n{self.log_tail()}")
            time.sleep(0.25)

    def __enter__(self) -> PrometheusServer:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def stop(self) -> None:
        proc = self.process
        if proc is None:
            return
        proc.terminate()
        try:
            proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(timeout=10)
        self.process = None

    def log_tail(self, lines: int = 30) -> str:
        try:
            with self.log_path.open("r", errors="replace") as fh:
                return "".join(deque(fh, maxlen=lines))
        except OSError as exc:
            return f"<no log: {exc}>"

    # -- HTTP API ----------------------------------------------------------------------------
    def api(self, path: str, **params: Any) -> Any:
        url = f"{self.url}/api/v1/{path}"
        if params:
            url += "?" + urllib.parse.urlencode(params, doseq=True)
        status, body = http_get(url, timeout=30)
        payload = json.loads(body)
        if status != 200 or payload.get("status") != "success":
            raise AssertionError(f"Prometheus API {path} {params} -> HTTP {status}: {body[:1000]!r}")
        return payload["data"]

    def query(self, promql: str, at: float | None = None) -> list[dict[str, Any]]:
        """Instant vector query; returns ``[{"metric": {...}, "value": float}]``."""
        params: dict[str, Any] = {"query": promql}
        if at is not None:
            params["time"] = f"{at:.6f}"  # sub-ms precision: see the scraped fixture
        data = self.api("query", **params)
        assert data["resultType"] == "vector", f"{promql}: expected a vector, got {data['resultType']}"
        return [{"metric": r["metric"], "value": float(r["value"][1])} for r in data["result"]]

    def scalar(self, promql: str, at: float | None = None, default: float = 0.0) -> float:
        """The single value of a query that aggregates to one series (``default`` when empty)."""
        result = self.query(promql, at)
        assert len(result) <= 1, f"{promql}: expected at most one series, got {result}"
        return result[0]["value"] if result else default

    def query_exemplars(self, promql: str, start: float, end: float) -> list[dict[str, Any]]:
        """``GET /api/v1/query_exemplars``: ``[{"seriesLabels": {...}, "exemplars": [{"labels", "value",
        "timestamp"}]}]`` for the series ``promql`` selects, between ``start`` and ``end`` (unix s)."""
        return list(self.api("query_exemplars", query=promql, start=f"{start:.3f}", end=f"{end:.3f}"))

    def alerts(self) -> list[dict[str, Any]]:
        """Active alerts (pending or firing) of the loaded alerting rules: ``GET /api/v1/alerts``."""
        return list(self.api("alerts")["alerts"])

    def last_scrape_unix(self) -> float | None:
        """Timestamp (unix s) of the latest successful scrape of the target.

        Read from the raw samples of ``up`` (a range selector): ``timestamp(up == 1)`` would return the
        *evaluation* time, not the scrape's, because ``timestamp()`` keeps sample timestamps only for a
        bare selector (Prometheus 2.42 here), and a scrape that ran before the caller's cut-off would
        then pass for one after it.
        """
        data = self.api("query", query=f'up{{job="{self.JOB}"}}[30s]')
        assert data["resultType"] == "matrix", f"up[30s]: expected a matrix, got {data['resultType']}"
        times = [float(t) for series in data["result"] for t, v in series["values"] if float(v) == 1.0]
        return max(times, default=None)

    def wait_scrape_after(self, t_unix: float, timeout: float = 60.0) -> float:
        """Block until a successful scrape started after ``t_unix``; returns its timestamp."""
        deadline = time.monotonic() + timeout
        while True:
            ts = self.last_scrape_unix()
            if ts is not None and ts > t_unix:
                return ts
            if time.monotonic() > deadline:
                targets = self.api("targets")
                raise AssertionError(
                    f"no successful scrape after {t_unix:.3f} within {timeout:.0f} s (last: {ts}); "
                    f"targets: {json.dumps(targets)[:2000]}\n{self.log_tail()}"
                )
            time.sleep(0.3)


def promtool_check_metrics(text: str) -> tuple[int, str]:
    """``promtool check metrics`` on exposition text; returns (exit code, combined output)."""
    proc = subprocess.run(["promtool", "check", "metrics"], input=text, capture_output=True, text=True, timeout=60)
    return proc.returncode, (proc.stdout + proc.stderr).strip()
