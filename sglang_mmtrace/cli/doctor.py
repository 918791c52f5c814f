"""``sglang-mmtrace doctor``: what would be hooked on this SGLang, and what would not."""

from __future__ import annotations

import os

from .. import config
from ..environment_variables import VARIABLES
from ..manifest import load
from ..package import SUPPORTED_VERSIONS, _instruments, in_supported_range, sglang_version
from ..plugin import check
from ..stages import STAGES


def run() -> int:
    version = sglang_version()
    if version is None:
        print("SGLang: not installed")
        return 1
    manifest = load(version)
    supported = version in SUPPORTED_VERSIONS
    print(f"SGLang {version} ({'supported' if supported else f'unknown; using the {manifest.version} manifest'})")
    inside = in_supported_range(version)
    print(f"supported range: {_instruments[0]} ({'inside' if inside else 'OUTSIDE: untested, hooks may not resolve'})")
    if manifest.override:
        print(f"manifest: {manifest.override} (SGLANG_MMTRACE_MANIFEST)")
    failures = 0
    by_stage: dict[str, list[str]] = {name: [] for name in STAGES}
    for entry in manifest.hooks:
        _, why = check(entry)
        status = "resolved" if why is None else f"MISSING: {why}"
        if why is not None and entry.required:
            failures += 1
        for stage in entry.stages:
            by_stage.setdefault(stage, []).append(f"{entry.target} [{entry.process}, {entry.kind}] {status}")
    for stage, lines in by_stage.items():
        print(f"{stage}")
        for line in lines or ["(no target in this version)"]:
            print(f"    -> {line}")
    cfg = config.get()
    print("sinks:")
    print(f"    plugin        {'on' if cfg.enabled else 'off (SGLANG_MMTRACE=0)'}")
    print(f"    jsonl         {cfg.jsonl_path or 'off (set SGLANG_MMTRACE_JSONL)'}")
    print(f"    otlp          {cfg.otlp_endpoint or 'off (no endpoint)'}")
    print("configuration:")
    for v in VARIABLES:
        if v.documented:
            shown = os.environ.get(v.name, f"{v.shown_default} (default)")
            print(f"    {v.name:32} {shown}")
    print("limits:")
    print("    --tokenizer-worker-num > 1: not supported (no records or traces for requests served by the workers)")
    print(
        "    --dp-size > 1: works on the CPU build (one API process; each record joins the scheduler that served it); not tried on GPUs"
    )
    return 1 if (failures and supported) else 0
