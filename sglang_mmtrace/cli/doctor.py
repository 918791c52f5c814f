"""``sglang-mmtrace doctor``: what would be hooked on this SGLang, where the data would go, and what would not work.

The targets are checked in the installed SGLang's source, without importing it, by the check CI runs
on every supported release (``manifest_check``: each target resolves, its kind matches, the arguments
its hook reads are in its signature), so a user of a release without a manifest of its own learns
which stages are lost before serving. ``--matrix`` prints that check for every supported release
(from their wheels) as the README's support matrix, and the multimodal stages of every family the
harness builds (model x stage, on the primary release). ``--model-path`` names the multimodal stages
that the model in that folder (its ``config.json``'s architecture) would lose on this SGLang.

Exits non-zero, with one line per reason at the end, when a required target of a supported version
is missing or a configured exporter could not deliver: the OTLP exporter for the configured
protocol does not load, or its endpoint does not accept a connection. Starts no server.
"""

from __future__ import annotations

import json
import os
import re
import socket
import sys
import urllib.request
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

from .. import config
from ..environment_variables import VARIABLES, Variable
from ..join.collector import JOINED_STAGES
from ..manifest import load
from ..manifest_check import (
    FAMILY_BEGIN,
    FAMILY_END,
    MATRIX_BEGIN,
    MATRIX_END,
    Tree,
    check,
    family_matrix,
    family_stages,
    installed_source,
    matrix,
    predicted_embedding,
    render_readme,
    stage_states,
)
from ..package import PRIMARY_VERSION, SUPPORTED_RANGE, SUPPORTED_VERSIONS, in_supported_range, sglang_version
from ..sinks import nvtx
from ..stages import SCHEDULER_OVERLAP_WAIT, STAGES

OTLP_PROTOCOLS = ("grpc", "http/protobuf")
CONNECT_TIMEOUT_S = 1.0
GAP_STAGES = {
    SCHEDULER_OVERLAP_WAIT: "the gap from the forward's end to this call's start (only when the overlap "
    "scheduler delays the result)",
}
"""Stages a hook measures as the gap between two points rather than as the wrapped call itself."""


def run(
    show_matrix: bool = False,
    readme: str | None = None,
    model_path: str | None = None,
    model_impl: str = "sglang",
    url: str | None = None,
) -> int:
    if show_matrix or readme:
        return _matrix(readme)
    version = sglang_version()
    if version is None:
        print("SGLang: not installed")
        return 1
    missing = _targets(version)
    if url is not None:
        try:
            model_path, model_impl = _served_model(url)
        except (OSError, ValueError, KeyError) as exc:
            print(f"doctor: cannot read {url}/get_server_info: {exc}", file=sys.stderr)
            return 1
    if model_path is not None and (problem := _model(version, model_path, model_impl)):
        print(f"doctor: {problem}", file=sys.stderr)
        return 1
    cfg = config.get()
    problems = _sinks(cfg)
    _configuration()
    if missing and version in SUPPORTED_VERSIONS:
        problems.insert(0, f"{missing} required target(s) of SGLang {version} MISSING (listed above)")
    for problem in problems:
        print(f"doctor: {problem}", file=sys.stderr)
    return 1 if problems else 0


def _targets(version: str) -> int:
    """Print each stage and how it is measured here; returns how many required targets are missing."""
    manifest = load(version)
    supported = version in SUPPORTED_VERSIONS
    print(f"SGLang {version} ({'supported' if supported else f'unknown; using the {manifest.version} manifest'})")
    inside = in_supported_range(version)
    print(f"supported range: {SUPPORTED_RANGE} ({'inside' if inside else 'OUTSIDE: untested, hooks may not resolve'})")
    if manifest.override:
        print(f"manifest: {manifest.override} (SGLANG_MMTRACE_MANIFEST)")
    source = installed_source(version)
    if source is None:
        print("SGLang's source files: not found")
        return len(manifest.hooks)
    missing = 0
    by_stage: dict[str, list[str]] = {name: [] for name in STAGES}
    results = check(manifest, source)
    for result in results:
        entry = result.entry
        status = "resolved" if result.ok else f"MISSING: {result.why}"
        if not result.ok and entry.required:
            missing += 1
        for stage in entry.stages:
            by_stage.setdefault(stage, []).append(f"-> {entry.target} [{entry.process}, {entry.kind}] {status}")
    for stage, lines in by_stage.items():
        print(stage)
        if stage in JOINED_STAGES:
            lines = [f"joined in the collector from {_joined_ends(stage)} (no hook of its own)"]
        elif stage in GAP_STAGES:
            lines.append(f"measured as {GAP_STAGES[stage]}")
        why = manifest.absent.get(stage, "its manifest names no target for this stage")
        for line in lines or [f"not measured on SGLang {version}: {why}"]:
            print(f"    {line}")
    lost = [s for s, (state, _) in stage_states(manifest, results).items() if state in ("lost", "partial")]
    print(f"stages lost on this SGLang: {', '.join(lost) or 'none'}")
    return missing


def _served_model(url: str) -> tuple[str, str]:
    """(model path, --model-impl) of a running server, from its ``/get_server_info``."""
    with urllib.request.urlopen(url.rstrip("/") + "/get_server_info", timeout=10) as resp:  # noqa: S310 (the user's server)
        info = json.loads(resp.read())
    return str(info["model_path"]), str(info.get("model_impl") or "sglang")


def config_modalities(config: dict[str, Any]) -> tuple[str, ...]:
    """The modalities a checkpoint's config.json says its model takes: a vision tower (``vision_config``,
    ``mm_vision_tower``) means images, an audio tower (``audio_config``) audio."""
    out = []
    if any(k in config for k in ("vision_config", "mm_vision_tower", "vision_tower", "image_token_index")):
        out.append("image")
    if any(k in config for k in ("audio_config", "audio_token_index", "audio_token_id")):
        out.append("audio")
    return tuple(out) or ("image",)


def _model(version: str, model_path: str, model_impl: str = "sglang") -> str | None:
    """Print what a new item of each modality the model at ``model_path`` takes will show here: the
    stages seen and lost, and the embedding outcome its record will claim; a problem, or None."""
    try:
        config = json.loads((Path(model_path) / "config.json").read_text(encoding="utf-8"))
        arch = config["architectures"][0]
    except (OSError, ValueError, KeyError, IndexError, TypeError) as exc:
        return f"cannot read the architecture from {model_path}/config.json: {exc}"
    source = installed_source(version)
    if source is None:
        return "SGLang's source files: not found"
    tree = Tree(source)
    impl = f", --model-impl {model_impl}" if model_impl != "sglang" else ""
    print(f"model {arch} ({model_path}{impl})")
    lost_all: list[str] = []
    for modality in config_modalities(config):
        vision = config.get("vision_config")
        vision_type = vision.get("model_type") if isinstance(vision, dict) else None
        states = family_stages(tree, arch, (modality,), model_impl, vision_type)
        outcome = predicted_embedding(states, modality)
        print(f"  a new {modality}: cache.embedding {outcome or 'null'}")
        for stage, (state, why) in states.items():
            print(f"    {stage}: {state}{f' ({why})' if why else ''}")
        lost_all += [f"{stage} ({modality})" for stage, (state, _) in states.items() if state != "ok"]
    print(f"stages this model loses: {', '.join(lost_all) or 'none'}")
    return None


def _matrix(readme: str | None) -> int:
    """Print the support matrix (each supported release's manifest against its wheel); with ``readme``,
    also write it into that file between its markers.

    The README is read, and its markers checked, before the matrix is built: building it downloads
    wheels, and a mistyped path should cost one line, not that wait and a printed matrix."""
    text = None
    if readme:
        try:
            text = Path(readme).read_text(encoding="utf-8")
        except OSError as exc:
            return _fail(f"cannot read {readme}: {exc.strerror or exc}")
        except UnicodeDecodeError:
            return _fail(f"cannot read {readme}: not UTF-8 text")
        if MATRIX_BEGIN not in text or MATRIX_END not in text:
            return _fail(f"{readme} has no support-matrix markers ({MATRIX_BEGIN} ... {MATRIX_END})")
    table = matrix(SUPPORTED_VERSIONS)
    print(table)
    families = family_matrix(PRIMARY_VERSION)
    print()
    print(families)
    if text is not None and readme is not None:
        text = render_readme(text, table)
        if FAMILY_BEGIN in text and FAMILY_END in text:
            text = render_readme(text, families, FAMILY_BEGIN, FAMILY_END)
        try:
            Path(readme).write_text(text, encoding="utf-8")
            # the family table lives in docs/families.md beside the README, where there is one
            doc = Path(readme).parent / FAMILIES_DOC
            if doc.is_file() and FAMILY_BEGIN in (page := doc.read_text(encoding="utf-8")):
                doc.write_text(render_readme(page, families, FAMILY_BEGIN, FAMILY_END), encoding="utf-8")
        except OSError as exc:
            return _fail(f"cannot write {readme}: {exc.strerror or exc}")
    return 0


FAMILIES_DOC = "docs/families.md"
"""Where ``doctor --matrix --readme README.md`` writes the family table (relative to the README)."""


def _fail(message: str) -> int:
    """A ``--matrix`` error: one line on stderr, exit status 1."""
    print(f"doctor: {message}", file=sys.stderr)
    return 1


def _joined_ends(stage: str) -> str:
    """The two ends a joined stage spans, as the stage catalogue words them (``(joined: A -> B)``)."""
    covers = STAGES[stage].covers
    m = re.search(r"\(joined: ([^)]+)\)", covers)
    return m.group(1) if m else covers


def _sinks(cfg: config.Config) -> list[str]:
    """Print every sink and its state; returns why a configured one cannot deliver (empty: all can)."""
    print("sinks:")
    if not cfg.enabled:
        print("    plugin        off (SGLANG_MMTRACE=0): no hooks, no sinks")
        return []
    print("    plugin        on")
    print(f"    jsonl         {cfg.jsonl_path or 'off (set SGLANG_MMTRACE_JSONL)'}")
    problem = None
    otlp = _otlp_settings(cfg)
    if otlp is None:
        problem = "the OpenTelemetry SDK does not load (the otlp line above)" if cfg.otlp_endpoint else None
    elif otlp.disabled:
        print("    otlp          off (OTEL_SDK_DISABLED=true)")
    elif otlp.endpoint is not None:
        problem = otlp_problem(otlp)
        state = "NOT WORKING (why: the last lines)" if problem else "exporter loads, endpoint reachable"
        print(f"    otlp          {otlp.endpoint} ({otlp.protocol}): {state}")
    else:
        print("    otlp          off (set SGLANG_MMTRACE_OTLP_ENDPOINT or OTEL_EXPORTER_OTLP_[TRACES_]ENDPOINT)")
    if cfg.metrics:
        print(
            "    prometheus    on: SGLang's /metrics when the server runs with --enable-metrics, "
            f"else its own port {cfg.metrics_port} (SGLANG_MMTRACE_METRICS_PORT)"
        )
    else:
        print("    prometheus    off (SGLANG_MMTRACE_METRICS=0)")
    print(f"    nvtx          {_nvtx_state(cfg)}")
    print(f"    gpu timing    {_gpu_timing_state(cfg)}")
    if otlp is not None:
        _print_otel(otlp)
    return [problem] if problem else []


def otlp_address(endpoint: str, protocol: str) -> tuple[str, int]:
    """The host and port the exporter would connect to: ``http://host:4318/v1/traces``, ``host:4317``.

    Without a port: 443 for https and for gRPC (gRPC's own default), 80 for http.
    """
    parts = urlsplit(endpoint if "://" in endpoint else f"//{endpoint}")
    if not parts.hostname:
        raise ValueError(f"no host in {endpoint!r}")
    if parts.port is not None:
        return parts.hostname, parts.port
    return parts.hostname, 80 if parts.scheme == "http" and protocol != "grpc" else 443


def _otlp_settings(cfg: config.Config) -> Any:
    """The span export's effective settings (``sinks.otlp.settings``); None where the OpenTelemetry
    packages do not load (the line that builds the exporter says why)."""
    try:
        from ..sinks.otlp import settings
    except Exception as exc:
        print(f"    otlp          the OpenTelemetry SDK does not load: {exc!r}")
        return None
    return settings(cfg)


def _print_otel(s: Any) -> None:
    """One block: what the OpenTelemetry environment resolves to, as the collector would build it."""
    if s.protocol == "grpc" and s.insecure is not None:
        tls = "no (plaintext gRPC)" if s.insecure else "yes"
    elif s.endpoint is not None:
        tls = "yes" if urlsplit(s.endpoint).scheme == "https" else "no"
    else:
        tls = "-"
    print("otel:")
    print(f"    service.name  {s.service_name}")
    print(f"    protocol      {s.protocol}")
    print(f"    endpoint      {s.endpoint or 'unset'}" + (f" (from {s.endpoint_from})" if s.endpoint else ""))
    print(f"    tls           {tls}")
    sampler = s.sampler.get_description()
    if sampler.startswith("ParentBased{root:"):  # the other four branches are the SDK's fixed ones
        sampler = "parent-based, root " + sampler.removeprefix("ParentBased{root:").split(",", 1)[0]
    print(f"    sampler       {sampler}")
    print(f"    propagators   {s.propagators}")
    print(f"    sdk disabled  {'yes (OTEL_SDK_DISABLED=true)' if s.disabled else 'no'}")


def otlp_problem(s: Any) -> str | None:
    """Why spans would not reach the endpoint of ``s`` (``sinks.otlp.OtlpSettings``), in one line;
    None when they could.

    Builds the exporter the collector would build (so a broken install shows here, not as one
    warning in a server log) and opens, then closes, one TCP connection to its address.
    """
    endpoint, protocol = s.endpoint, s.protocol
    if protocol not in OTLP_PROTOCOLS:
        return (
            f"unknown OTLP protocol {protocol!r} for {endpoint} (expected {' or '.join(OTLP_PROTOCOLS)}; "
            "the plugin would send http/protobuf)"
        )
    try:
        from ..sinks.otlp import make_exporter

        make_exporter(s).shutdown()
    except Exception as exc:
        return f"the OTLP {protocol} exporter for {endpoint} does not load: {exc!r}"
    if protocol == "http/protobuf" and urlsplit(endpoint).scheme not in ("http", "https"):
        return f"OTLP http/protobuf endpoint {endpoint} needs http:// or https://"
    try:
        host, port = otlp_address(endpoint, protocol)
    except ValueError as exc:
        return f"OTLP endpoint {endpoint} is not an address: {exc}"
    try:
        socket.create_connection((host, port), timeout=CONNECT_TIMEOUT_S).close()
    except OSError as exc:
        return f"OTLP endpoint {endpoint} ({protocol}) does not accept a connection at {host}:{port}: {exc!r}"
    return None


def _nvtx_state(cfg: config.Config) -> str:
    """On/off, and whether ranges would be pushed in this process (the plugin's own ``setup`` decides)."""
    if not cfg.nvtx:
        return "off (SGLANG_MMTRACE_NVTX=0)"
    attached = nvtx.setup()
    nvtx.teardown()
    if attached:
        return "on; an NVTX tool is attached to this process: ranges are pushed"
    return "on; no NVTX tool attached to this process: ranges are pushed only under one (e.g. nsys profile)"


def _gpu_timing_state(cfg: config.Config) -> str:
    if cfg.gpu_timing == "0":
        return "off (SGLANG_MMTRACE_GPU_TIMING=0)"
    which = "the scheduler's and the API's" if cfg.gpu_timing == "all" else "the scheduler's (the API's: all)"
    import torch  # SGLang's own dependency

    if torch.cuda.is_available():
        return f"on; CUDA available here: {which} GPU stages are timed with CUDA events"
    return "on; CUDA not available here: GPU stages are timed on the host clock"


def _shown(v: Variable) -> str:
    """The variable's text, or where its value comes from instead (an OpenTelemetry fallback, the default)."""
    if os.environ.get(v.name):
        return os.environ[v.name]
    used = next((n for n in v.fallbacks if os.environ.get(n)), None)
    if used is not None:
        return f"unset; {used}={os.environ[used]} used"
    return os.environ.get(v.name, f"{v.shown_default} (default)")


def _configuration() -> None:
    print("configuration:")
    for v in VARIABLES:
        if v.documented:
            print(f"    {v.name:32} {_shown(v)}")
    print("limits:")
    print(
        "    --tokenizer-worker-num > 1: needs `sglang-mmtrace run -- ...` (SGLang loads no plugin in the workers;"
        " under the launcher each request served by any worker gets its record and trace)"
    )
    print(
        "    sglang.Engine (offline, no HTTP): records from the generate/async_generate call; sglang_mmtrace.install()"
        " is not needed (the Engine loads the plugin)"
    )
    print(
        "    --dp-size > 1: works on the CPU build (one API process; each record joins the scheduler that served it); not tried on GPUs"
    )
