"""``sglang-mmtrace doctor`` says what is true, and fails with one line when a configured exporter cannot deliver.

Also the demo's relay of the plugin's own log lines (``sglang-mmtrace: ...``) from the server log.
No server is started: the OTLP peer is a plain TCP server socket (a real peer for a connect check).
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys

import pytest

from sglang_mmtrace import config
from sglang_mmtrace import environment_variables as ev
from sglang_mmtrace import manifest_check as mc
from sglang_mmtrace.cli import doctor, main
from sglang_mmtrace.cli.demo import PluginLines
from sglang_mmtrace.config import Config
from sglang_mmtrace.join.collector import JOINED_STAGES
from sglang_mmtrace.manifest_check import MATRIX_BEGIN, MATRIX_END
from sglang_mmtrace.sinks import otlp
from sglang_mmtrace.stages import STAGES

SINKS = ("plugin", "jsonl", "otlp", "prometheus", "nvtx", "gpu timing")


@pytest.fixture
def listening():
    """A TCP server socket on 127.0.0.1: it accepts connections (the kernel's backlog) until closed."""
    srv = socket.create_server(("127.0.0.1", 0))
    yield srv.getsockname()[1]
    srv.close()


@pytest.fixture
def closed_port():
    """A port nothing listens on (bound, then released)."""
    with socket.create_server(("127.0.0.1", 0)) as s:
        return s.getsockname()[1]


@pytest.fixture(scope="module")
def doctor_cli(tmp_path_factory):
    """The real command, in a fresh process (SGLang's import-time warnings happen only there), with an
    OTLP endpoint that refuses connections."""
    with socket.create_server(("127.0.0.1", 0)) as s:
        port = s.getsockname()[1]
    env = {k: v for k, v in os.environ.items() if not k.startswith(("SGLANG_MMTRACE", "OTEL_EXPORTER_OTLP"))}
    env["OTEL_EXPORTER_OTLP_TRACES_ENDPOINT"] = endpoint = f"http://127.0.0.1:{port}/v1/traces"
    out = subprocess.run(
        [sys.executable, "-m", "sglang_mmtrace.cli.main", "doctor"],
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    return out, endpoint


def _run(monkeypatch, capsys, cfg: Config) -> tuple[int, list[str], list[str]]:
    """``doctor.run`` in this process with ``cfg``; the SGLang target check is the subprocess test's job."""
    monkeypatch.setattr(config, "_config", cfg)
    monkeypatch.setattr(doctor, "_targets", lambda version: 0)
    rc = doctor.run()
    out, err = capsys.readouterr()
    return rc, out.splitlines(), err.splitlines()


def _sink_line(lines: list[str], sink: str) -> str:
    return next(line for line in lines if line.startswith(f"    {sink} "))


def test_cli_unreachable_endpoint_fails_with_one_line_naming_it(doctor_cli):
    out, endpoint = doctor_cli
    assert out.returncode == 1, out.stdout[-3000:] + out.stderr[-3000:]
    reasons = [line for line in out.stderr.splitlines() if line.startswith("doctor: ")]
    assert len(reasons) == 1, out.stderr[-3000:]
    assert endpoint in reasons[0] and "does not accept a connection" in reasons[0], reasons


def test_cli_configuration_names_the_fallback_in_use(doctor_cli):
    out, endpoint = doctor_cli
    line = next(line for line in out.stdout.splitlines() if line.startswith("    SGLANG_MMTRACE_OTLP_ENDPOINT "))
    assert line.endswith(f"unset; OTEL_EXPORTER_OTLP_TRACES_ENDPOINT={endpoint} used"), line
    assert f"{endpoint} (http/protobuf): NOT WORKING" in _sink_line(out.stdout.splitlines(), "otlp")


def test_cli_output_has_no_sglang_import_warnings(doctor_cli):
    out, _ = doctor_cli
    assert "UserWarning" not in out.stdout + out.stderr, out.stderr[-3000:]
    assert "warnings.warn" not in out.stderr, out.stderr[-3000:]


def test_cli_describes_joined_stages_instead_of_no_target(doctor_cli):
    lines = doctor_cli[0].stdout.splitlines()
    assert "no target" not in doctor_cli[0].stdout
    for stage in JOINED_STAGES:
        detail = lines[lines.index(stage) + 1]
        assert detail.startswith("    joined in the collector from "), detail
        assert "->" in detail, detail  # both ends: "<end> -> <start>"
    at = lines.index("scheduler.overlap_wait")
    block = lines[at + 1 : at + 4]
    assert any("resolved" in line for line in block) and any("gap" in line for line in block), block


def test_cli_lists_every_sink(doctor_cli):
    lines = doctor_cli[0].stdout.splitlines()
    for sink in SINKS:
        assert _sink_line(lines, sink), sink


def test_every_joined_stage_names_its_two_ends():
    """The doctor's wording comes from the catalogue's "(joined: A -> B)"; a new joined stage needs it."""
    for stage in JOINED_STAGES:
        assert "(joined: " in STAGES[stage].covers, stage
        assert " -> " in doctor._joined_ends(stage), stage


def test_no_endpoint_no_otlp_check_exit_zero(monkeypatch, capsys):
    rc, out, err = _run(monkeypatch, capsys, Config())
    assert rc == 0, err
    assert err == []
    assert _sink_line(out, "otlp").split()[1] == "off"
    assert _sink_line(out, "jsonl").split()[1] == "off"
    assert "on: SGLang's /metrics when the server runs with --enable-metrics" in _sink_line(out, "prometheus")
    assert "9464" in _sink_line(out, "prometheus")
    assert "no NVTX tool attached" in _sink_line(out, "nvtx")  # nothing profiles this test process
    assert "CUDA not available here" in _sink_line(out, "gpu timing")


def test_sinks_off_say_off(monkeypatch, capsys):
    cfg = Config(jsonl_path="/tmp/r.jsonl", metrics=False, nvtx=False, gpu_timing="0")
    rc, out, _ = _run(monkeypatch, capsys, cfg)
    assert rc == 0
    assert _sink_line(out, "jsonl").split()[1] == "/tmp/r.jsonl"
    for sink, var in (("prometheus", "METRICS"), ("nvtx", "NVTX"), ("gpu timing", "GPU_TIMING")):
        assert _sink_line(out, sink).endswith(f"off (SGLANG_MMTRACE_{var}=0)"), sink


@pytest.mark.parametrize("protocol", ["http/protobuf", "grpc"])
def test_listening_endpoint_is_reachable_exit_zero(monkeypatch, capsys, listening, protocol):
    endpoint = f"http://127.0.0.1:{listening}" if protocol == "http/protobuf" else f"127.0.0.1:{listening}"
    rc, out, err = _run(monkeypatch, capsys, Config(otlp_endpoint=endpoint, otlp_protocol=protocol))
    assert rc == 0, err
    line = _sink_line(out, "otlp")
    assert endpoint in line and protocol in line and "reachable" in line and "NOT" not in line, line


def test_refused_endpoint_exit_nonzero_one_line(monkeypatch, capsys, closed_port):
    endpoint = f"http://127.0.0.1:{closed_port}/v1/traces"
    rc, out, err = _run(monkeypatch, capsys, Config(otlp_endpoint=endpoint))
    assert rc == 1
    assert len(err) == 1 and endpoint in err[0] and f"127.0.0.1:{closed_port}" in err[0], err
    assert "NOT WORKING" in _sink_line(out, "otlp")


def test_unknown_protocol_exit_nonzero(monkeypatch, capsys, listening):
    cfg = Config(otlp_endpoint=f"http://127.0.0.1:{listening}", otlp_protocol="http/json")
    rc, _, err = _run(monkeypatch, capsys, cfg)
    assert rc == 1
    assert len(err) == 1 and "unknown OTLP protocol 'http/json'" in err[0], err


def test_exporter_that_does_not_load_exit_nonzero(monkeypatch, capsys, listening):
    # None in sys.modules makes the exporter's import raise ImportError, as a broken install would.
    monkeypatch.setitem(sys.modules, "opentelemetry.exporter.otlp.proto.grpc.trace_exporter", None)
    cfg = Config(otlp_endpoint=f"127.0.0.1:{listening}", otlp_protocol="grpc")
    rc, _, err = _run(monkeypatch, capsys, cfg)
    assert rc == 1
    assert (
        len(err) == 1 and "grpc exporter" in err[0] and "does not load" in err[0] and "ModuleNotFoundError" in err[0]
    ), err


def test_http_endpoint_without_scheme_is_a_problem(listening):
    problem = doctor.otlp_problem(otlp.settings(Config(otlp_endpoint=f"127.0.0.1:{listening}")))
    assert problem is not None and "needs http:// or https://" in problem


def test_plugin_off_lists_no_sinks_and_checks_nothing(monkeypatch, capsys, closed_port):
    cfg = Config(enabled=False, otlp_endpoint=f"http://127.0.0.1:{closed_port}")
    rc, out, err = _run(monkeypatch, capsys, cfg)
    assert rc == 0 and err == []
    assert "    plugin        off (SGLANG_MMTRACE=0): no hooks, no sinks" in out


def test_missing_targets_keep_the_exit_rule(monkeypatch, capsys):
    monkeypatch.setattr(config, "_config", Config())
    monkeypatch.setattr(doctor, "_targets", lambda version: 2)
    assert doctor.run() == 1
    err = capsys.readouterr().err.splitlines()
    assert len(err) == 1 and "2 required target(s)" in err[0] and "MISSING" in err[0], err


@pytest.mark.parametrize(
    ("endpoint", "protocol", "address"),
    [
        ("http://collector:4318/v1/traces", "http/protobuf", ("collector", 4318)),
        ("https://collector/v1/traces", "http/protobuf", ("collector", 443)),
        ("http://collector", "http/protobuf", ("collector", 80)),
        ("collector:4317", "grpc", ("collector", 4317)),
        ("http://collector:4317", "grpc", ("collector", 4317)),
        ("collector", "grpc", ("collector", 443)),
        ("[::1]:4317", "grpc", ("::1", 4317)),
    ],
)
def test_otlp_address(endpoint, protocol, address):
    assert doctor.otlp_address(endpoint, protocol) == address


def test_otlp_address_rejects_a_bad_port():
    with pytest.raises(ValueError):
        doctor.otlp_address("http://collector:port", "http/protobuf")


def test_endpoint_comes_from_the_otel_fallbacks(monkeypatch):
    """What the doctor checks is what the collector would use: the standard variables count."""
    for v in ev.VARIABLES:
        for name in (v.name, *v.fallbacks):
            monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_ENDPOINT", "http://collector:4318")
    assert Config.from_env().otlp_endpoint == "http://collector:4318"


def test_plugin_lines_each_once_and_only_new(tmp_path):
    log = tmp_path / "server.log"
    log.write_text(
        "[2026-11-30 10:00:00] INFO: server started\n"
        "[2026-11-30 10:00:01] sglang-mmtrace: OTLP export disabled: ImportError('x')\n"
        "sglang-mmtrace: metrics disabled: port 9464 in use\n"
    )
    lines = PluginLines(log)
    assert lines.new() == [
        "[2026-11-30 10:00:01] sglang-mmtrace: OTLP export disabled: ImportError('x')",
        "sglang-mmtrace: metrics disabled: port 9464 in use",
    ]
    with log.open("a") as f:
        f.write("[2026-11-30 10:00:09] sglang-mmtrace: OTLP export disabled: ImportError('x')\n")  # again
        f.write("[TP0] sglang-mmtrace: otlp dropped 3 item(s); further drops are only counted\n")
        f.write("sglang-mmtrace: half a li")  # not finished yet: read when it is
    assert lines.new() == ["[TP0] sglang-mmtrace: otlp dropped 3 item(s); further drops are only counted"]
    with log.open("a") as f:
        f.write("ne\n")
    assert lines.new() == ["sglang-mmtrace: half a line"]
    assert lines.new() == []


def test_plugin_lines_before_the_log_exists(tmp_path):
    assert PluginLines(tmp_path / "not-yet.log").new() == []


def test_matrix_readme_that_cannot_be_used_is_one_line_before_any_matrix(tmp_path, monkeypatch, capsys):
    """``doctor --matrix --readme PATH``: a path that cannot be read or has no markers ends in one line
    and exit 1, before the matrix is built (that downloads wheels) or printed; a good one is rewritten."""
    built: list[object] = []
    monkeypatch.setattr(doctor, "matrix", lambda versions: built.append(versions) or "| stage |\n|---|")
    monkeypatch.setattr(doctor, "family_matrix", lambda version: "| stage (families) |")
    plain, binary = tmp_path / "plain.md", tmp_path / "binary.md"
    plain.write_text("# no markers here\n")
    binary.write_bytes(b"\xff\xfe\x00 not text")
    cases = [
        (tmp_path / "missing.md", "cannot read {}: No such file or directory"),
        (tmp_path, "cannot read {}: Is a directory"),
        (binary, "cannot read {}: not UTF-8 text"),
        (plain, f"{{}} has no support-matrix markers ({MATRIX_BEGIN} ... {MATRIX_END})"),
    ]
    for path, message in cases:
        assert main.main(["doctor", "--matrix", "--readme", str(path)]) == 1
        out, err = capsys.readouterr()
        assert out == "" and err == f"doctor: {message.format(path)}\n"
    assert built == []
    readme = tmp_path / "README.md"
    readme.write_text(f"head\n{MATRIX_BEGIN}\nold table\n{MATRIX_END}\ntail\n")
    assert main.main(["doctor", "--matrix", "--readme", str(readme)]) == 0
    assert readme.read_text() == f"head\n{MATRIX_BEGIN}\n| stage |\n|---|\n{MATRIX_END}\ntail\n"
    assert capsys.readouterr().out == "| stage |\n|---|\n\n| stage (families) |\n" and len(built) == 1


def test_model_path_names_the_stages_a_model_would_lose(tmp_path, capsys):
    version = doctor.sglang_version()
    served, unknown = tmp_path / "served", tmp_path / "unknown"
    for folder, arch in ((served, "Qwen2_5_VLForConditionalGeneration"), (unknown, "NoSuchVLModel")):
        folder.mkdir()
        (folder / "config.json").write_text(json.dumps({"architectures": [arch]}))
    assert doctor._model(version, str(served)) is None
    assert capsys.readouterr().out.splitlines()[-1] == "stages this model loses: none"
    assert doctor._model(version, str(unknown)) is None
    last = capsys.readouterr().out.splitlines()[-1]
    assert last == "stages this model loses: " + ", ".join(
        f"{s} (image)" for s in [*mc.FAMILY_STAGES, "model.vision_encoder"]
    )
    # an audio model's config: its clip's stages, no mm.load (the read is inside its mm.decode)
    audio = tmp_path / "audio"
    audio.mkdir()
    (audio / "config.json").write_text(json.dumps({"architectures": ["NoSuchAudioModel"], "audio_config": {}}))
    assert doctor._model(version, str(audio)) is None
    out = capsys.readouterr().out
    assert "a new audio: cache.embedding null" in out and "mm.load" not in out and "model.audio_encoder: LOST" in out
    assert "cannot read the architecture" in doctor._model(version, str(tmp_path / "none"))
