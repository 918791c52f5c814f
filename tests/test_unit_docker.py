"""The one-command stack in ``docker/``, checked statically (no Docker engine runs on these machines).

The compose file parses, every file it mounts or builds from exists, every image and base image is
pinned, the services reach each other by the names and ports their configs use, and the shipped
Prometheus configuration and rules pass ``promtool``. ``docker compose config`` runs too where the
compose plugin is installed.
"""

from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml
from peers.prometheus import require_tools

REPO = Path(__file__).resolve().parents[1]
DOCKER = REPO / "docker"
COMPOSE = DOCKER / "compose.yaml"
PORT = 30000


def compose() -> dict[str, Any]:
    return yaml.safe_load(COMPOSE.read_text())


def services() -> dict[str, dict[str, Any]]:
    return compose()["services"]


def dotenv() -> dict[str, str]:
    lines = (DOCKER / ".env").read_text().splitlines()
    return dict(line.split("=", 1) for line in lines if line.strip() and not line.startswith("#"))


def bind_sources(svc: dict[str, Any]) -> list[tuple[Path, str]]:
    """(host path, container path) of every bind mount given as a relative path."""
    out = []
    for vol in svc.get("volumes", []):
        source, target = vol.split(":")[:2]
        if source.startswith("."):
            out.append(((DOCKER / source).resolve(), target))
    return out


def dockerfiles() -> dict[str, tuple[Path, Path]]:
    """Service -> (Dockerfile, build context) for every service built here."""
    out = {}
    for name, svc in services().items():
        if "build" in svc:
            context = (DOCKER / svc["build"]["context"]).resolve()
            out[name] = (context / svc["build"]["dockerfile"], context)
    return out


def pinned(image: str) -> bool:
    """``name:tag`` with a concrete tag (not latest, no variable left), or a digest."""
    if "@sha256:" in image:
        return True
    name, _, tag = image.rpartition(":")
    return bool(name) and "/" not in tag and tag not in ("", "latest") and "$" not in image


def test_compose_services_and_profiles():
    svcs = services()
    assert set(svcs) == {"sglang", "sglang-cpu", "traffic", "prometheus", "grafana", "otel-collector", "jaeger"}
    assert svcs["sglang"]["profiles"] == ["gpu"]
    assert svcs["sglang-cpu"]["profiles"] == svcs["traffic"]["profiles"] == ["cpu"]
    for name in ("prometheus", "grafana", "otel-collector", "jaeger"):
        assert "profiles" not in svcs[name], name  # in both profiles
    # plain `up` is the GPU stack; `--profile cpu` replaces it (the CLI flag overrides COMPOSE_PROFILES)
    assert dotenv()["COMPOSE_PROFILES"] == "gpu"


def test_every_image_is_pinned():
    for name, svc in services().items():
        if "build" not in svc:
            assert pinned(svc["image"]), f"{name}: {svc['image']}"
    svcs = services()
    assert svcs["traffic"]["image"] == svcs["sglang-cpu"]["image"]  # one CPU image for both
    assert svcs["traffic"]["build"] == svcs["sglang-cpu"]["build"]
    for dockerfile, _ in dockerfiles().values():
        text = dockerfile.read_text()
        args = dict(re.findall(r"^ARG (\w+)=(\S+)$", text, re.M))
        froms = re.findall(r"^FROM (\S+)", text, re.M)
        assert froms, dockerfile
        for base in froms:
            resolved = re.sub(r"\$\{(\w+)\}", lambda m, args=args: args.get(m.group(1), m.group(0)), base)
            assert pinned(resolved), f"{dockerfile.name}: FROM {base} -> {resolved}"


def test_gpu_image_is_the_official_sglang_image():
    dockerfile, _ = dockerfiles()["sglang"]
    args = dict(re.findall(r"^ARG (\w+)=(\S+)$", dockerfile.read_text(), re.M))
    assert re.fullmatch(r"lmsysorg/sglang:v0\.5\.(17|23)-cu\d+", args["SGLANG_IMAGE"]), args
    cpu_text = dockerfiles()["sglang-cpu"][0].read_text()
    assert '"sglang==0.5.23"' in cpu_text
    for path in (dockerfile, dockerfiles()["sglang-cpu"][0]):
        assert 'pip install --no-cache-dir "."' in path.read_text(), f"{path.name} must install this package"


def test_the_span_exporter_is_an_ordinary_dependency():
    """Setting SGLANG_MMTRACE_OTLP_ENDPOINT after ``pip install sglang-mmtrace`` must be enough."""
    import tomllib

    deps = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["dependencies"]
    names = {re.split(r"[<>=!~ ]", d, maxsplit=1)[0] for d in deps}
    assert {
        "opentelemetry-sdk",
        "opentelemetry-exporter-otlp-proto-http",
        "opentelemetry-exporter-otlp-proto-grpc",
    } <= names


def test_every_mounted_and_copied_file_exists():
    for name, svc in services().items():
        for source, _ in bind_sources(svc):
            assert source.exists(), f"{name}: mounts {source}, which does not exist"
    for name, (dockerfile, context) in dockerfiles().items():
        assert dockerfile.is_file(), f"{name}: {dockerfile}"
        ignore = dockerfile.with_name(dockerfile.name + ".dockerignore")
        allowed = [line[1:].rstrip("/") for line in ignore.read_text().splitlines() if line.startswith("!")]
        for line in re.findall(r"^COPY (.+)$", dockerfile.read_text(), re.M):
            *sources, _ = line.split()
            for source in sources:
                assert (context / source).exists(), f"{dockerfile.name}: COPY {source} is not in the context"
                assert any(source == a or source.startswith(a + "/") for a in allowed), (
                    f"{dockerfile.name}: COPY {source} is excluded by {ignore.name}"
                )
    entry = re.search(r'^ENTRYPOINT \["/bin/sh", "(\S+)"\]', dockerfiles()["sglang-cpu"][0].read_text(), re.M)
    assert entry and (DOCKER / Path(entry.group(1)).name).is_file()
    assert subprocess.run(["sh", "-n", str(DOCKER / "cpu-entrypoint.sh")]).returncode == 0


def test_sglang_services_serve_metrics_where_prometheus_scrapes():
    svcs = services()
    prom = yaml.safe_load((DOCKER / "prometheus" / "prometheus.yml").read_text())
    job, plugin_job = prom["scrape_configs"]
    assert job["metrics_path"] == "/metrics"
    assert job["static_configs"][0]["targets"] == [f"sglang:{PORT}"]
    # the plugin's own port (exemplars need it: SGLang serves /metrics in multiprocess mode), relabelled
    # to SGLang's instance so the dashboard's instance filter matches both jobs
    env = svcs["sglang"]["environment"]
    assert (
        env["SGLANG_MMTRACE_EXEMPLARS"] == "1" and svcs["sglang-cpu"]["environment"]["SGLANG_MMTRACE_EXEMPLARS"] == "1"
    )
    assert plugin_job["static_configs"][0]["targets"] == [f"sglang:{env['SGLANG_MMTRACE_METRICS_PORT']}"]
    assert plugin_job["relabel_configs"] == [{"target_label": "instance", "replacement": f"sglang:{PORT}"}]
    assert "--enable-feature=exemplar-storage" in svcs["prometheus"]["command"]
    gpu_cmd = " ".join(svcs["sglang"]["command"])
    assert "--enable-metrics" in gpu_cmd and f"--port {PORT}" in gpu_cmd and "--host 0.0.0.0" in gpu_cmd
    assert '--model-path "$${MODEL}"' in gpu_cmd and svcs["sglang"]["environment"]["MODEL"].startswith("${MODEL")
    (device,) = svcs["sglang"]["deploy"]["resources"]["reservations"]["devices"]
    assert device["device_ids"] == ["${GPU:-0}"] and device["capabilities"] == ["gpu"]
    # the CPU service answers as `sglang` too, on the same port (socat in front of the demo server)
    assert svcs["sglang-cpu"]["networks"]["default"]["aliases"] == ["sglang"]
    entry = (DOCKER / "cpu-entrypoint.sh").read_text()
    assert f"TCP-LISTEN:{PORT}" in entry and "sglang-mmtrace demo --serve-only" in entry
    assert f"{PORT}:{PORT}" in svcs["sglang"]["ports"] and f"{PORT}:{PORT}" in svcs["sglang-cpu"]["ports"]
    assert svcs["traffic"]["environment"]["SGLANG_URL"] == f"http://sglang:{PORT}"
    # the rules Prometheus loads are the ones shipped (relative to the mounted config folder)
    (mount,) = [t for s, t in bind_sources(svcs["prometheus"]) if s == DOCKER / "prometheus"]
    assert mount == "/etc/prometheus" and prom["rule_files"] == ["rules/*.yml"]
    assert list((DOCKER / "prometheus" / "rules").glob("*.yml"))


def test_plugin_env_exports_traces_to_the_collector_and_on_to_jaeger():
    svcs = services()
    collector = yaml.safe_load((DOCKER / "otel-collector" / "config.yaml").read_text())
    http = collector["receivers"]["otlp"]["protocols"]["http"]["endpoint"]
    for name in ("sglang", "sglang-cpu"):
        env = svcs[name]["environment"]
        assert env["SGLANG_MMTRACE"] == "1" and env["SGLANG_MMTRACE_METRICS"] == "1", name
        assert env["SGLANG_MMTRACE_OTLP_ENDPOINT"] == f"http://otel-collector:{http.rsplit(':', 1)[1]}", name
        assert env["SGLANG_MMTRACE_OTLP_PROTOCOL"] == "http/protobuf", name
    (mount,) = [t for s, t in bind_sources(svcs["otel-collector"])]
    assert svcs["otel-collector"]["command"] == [f"--config={mount}"]
    (pipeline,) = collector["service"]["pipelines"].values()
    assert pipeline["receivers"] == ["otlp"]
    for exporter in pipeline["exporters"]:
        host, port = collector["exporters"][exporter]["endpoint"].split(":")
        assert host == "jaeger" and host in svcs and port == "4317"  # Jaeger v2 takes OTLP gRPC on 4317
    for processor in pipeline.get("processors", []):
        assert processor in collector["processors"]


def test_grafana_provisioning_points_at_the_services_and_the_dashboards():
    svcs = services()
    mounts = dict(bind_sources(svcs["grafana"]))
    assert mounts[DOCKER / "grafana" / "provisioning"] == "/etc/grafana/provisioning"
    ds = yaml.safe_load((DOCKER / "grafana" / "provisioning" / "datasources" / "datasources.yaml").read_text())
    by_type = {d["type"]: d for d in ds["datasources"]}
    assert by_type["prometheus"]["url"] == "http://prometheus:9090" and "prometheus" in svcs
    assert by_type["jaeger"]["url"] == "http://jaeger:16686" and "jaeger" in svcs
    # Exemplars' trace ids (the TTFT panels ask for them) open in the provisioned trace datasource.
    (dest,) = by_type["prometheus"]["jsonData"]["exemplarTraceIdDestinations"]
    assert dest == {"name": "trace_id", "datasourceUid": by_type["jaeger"]["uid"]}
    assert "9090:9090" in svcs["prometheus"]["ports"] and "16686:16686" in svcs["jaeger"]["ports"]
    providers = yaml.safe_load((DOCKER / "grafana" / "provisioning" / "dashboards" / "dashboards.yaml").read_text())
    (provider,) = providers["providers"]
    assert mounts[REPO / "dashboards"] == provider["options"]["path"]
    home = svcs["grafana"]["environment"]["GF_DASHBOARDS_DEFAULT_HOME_DASHBOARD_PATH"]
    assert home.startswith(provider["options"]["path"] + "/") and (REPO / "dashboards" / Path(home).name).is_file()


@pytest.mark.parametrize("what", ["config", "rules"])
def test_promtool_checks_the_shipped_prometheus_files(what: str):
    require_tools()
    paths = (
        [DOCKER / "prometheus" / "prometheus.yml"]
        if what == "config"
        else sorted((DOCKER / "prometheus" / "rules").glob("*.yml"))
    )
    proc = subprocess.run(["promtool", "check", what, *map(str, paths)], capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    if what == "config":
        assert "1 rule files found" in proc.stdout + proc.stderr  # the rules glob resolves


def test_docker_compose_config_where_available():
    docker = shutil.which("docker")
    has_compose = docker and subprocess.run([docker, "compose", "version"], capture_output=True).returncode == 0
    if not has_compose:
        pytest.skip("no `docker compose` plugin here; the static checks above cover the file")
    for profile in ("gpu", "cpu"):
        proc = subprocess.run(
            [docker, "compose", "-f", str(COMPOSE), "--profile", profile, "config", "-q"],
            capture_output=True,
            text=True,
        )
        assert proc.returncode == 0, proc.stderr
