"""Check the SGLang 0.5.17 manifest against an unpacked 0.5.17 source tree, without importing sglang.

    python benchmarks/gpu/check_manifest_017.py /tmp/sg17/src [--manifest PATH]

For every hook: the module file exists, the class exists in it (at module level), the attribute is
defined in that class's own body (not inherited) or at module level, and its kind matches the
manifest: ``async`` = ``async def`` without ``yield``, ``asyncgen`` = ``async def`` with ``yield``,
``sync`` = ``def`` (``classmethod``/``staticmethod`` and other decorators are reported), ``asgi`` =
a module-level assignment. It also checks that each hook id has an implementation and each stage is
in the catalogue (that imports ``sglang_mmtrace``, not ``sglang``). Exit status 1 on any failure.
"""

from __future__ import annotations

import argparse
import ast
import sys
import tomllib
from pathlib import Path

HERE = Path(__file__).resolve()
DEFAULT_MANIFEST = HERE.parents[2] / "sglang_mmtrace" / "patches" / "sglang-0.5.17.toml"


def _module_file(root: Path, parts: list[str]) -> tuple[Path, int] | None:
    """The longest dotted prefix that is a module file: (path, number of parts it consumed)."""
    for n in range(len(parts) - 1, 0, -1):
        base = root.joinpath(*parts[:n])
        for cand in (base.with_suffix(".py"), base / "__init__.py"):
            if cand.is_file():
                return cand, n
    return None


def _yields(fn: ast.AST) -> bool:
    """Does this function's own body (not nested defs/lambdas) contain yield?"""
    stack = list(ast.iter_child_nodes(fn))
    while stack:
        node = stack.pop()
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.Lambda | ast.ClassDef):
            continue
        if isinstance(node, ast.Yield | ast.YieldFrom):
            return True
        stack.extend(ast.iter_child_nodes(node))
    return False


def _kind(fn: ast.FunctionDef | ast.AsyncFunctionDef) -> str:
    if isinstance(fn, ast.AsyncFunctionDef):
        return "asyncgen" if _yields(fn) else "async"
    return "sync"


def _decorators(fn: ast.FunctionDef | ast.AsyncFunctionDef) -> list[str]:
    out = []
    for d in fn.decorator_list:
        node = d.func if isinstance(d, ast.Call) else d
        out.append(ast.unparse(node))
    return out


def _defines(node: ast.stmt, name: str) -> bool:
    if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
        return node.name == name
    if isinstance(node, ast.Assign):
        return any(isinstance(t, ast.Name) and t.id == name for t in node.targets)
    if isinstance(node, ast.AnnAssign):
        return isinstance(node.target, ast.Name) and node.target.id == name
    return False


def _find(body: list[ast.stmt], name: str) -> ast.AST | None:
    """The last definition of ``name`` in a body (later definitions win, as at run time)."""
    found = None
    for node in body:
        if _defines(node, name):
            found = node
        elif isinstance(node, ast.If | ast.Try):  # module-level conditional definitions
            for sub in (getattr(node, "body", []), getattr(node, "orelse", []), getattr(node, "finalbody", [])):
                hit = _find(sub, name)
                if hit is not None:
                    found = hit
    return found


def check_target(root: Path, target: str, kind: str) -> tuple[bool, str]:
    parts = target.split(".")
    mod = _module_file(root, parts)
    if mod is None:
        return False, "no module file"
    path, n = mod
    rel = path.relative_to(root)
    tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
    body, where = tree.body, str(rel)
    rest = parts[n:]
    for i, name in enumerate(rest):
        node = _find(body, name)
        last = i == len(rest) - 1
        if node is None:
            return False, f"{name} not defined in {where}"
        if not last:
            if not isinstance(node, ast.ClassDef):
                return False, f"{name} in {where} is not a class"
            body, where = node.body, f"{where}:{node.name}"
            continue
        line = getattr(node, "lineno", 0)
        if kind == "asgi":
            ok = isinstance(node, ast.Assign | ast.AnnAssign)
            return ok, f"{rel}:{line} module-level assignment" + ("" if ok else f" (found {type(node).__name__})")
        if not isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
            return False, f"{where}.{name} is a {type(node).__name__}, not a function"
        actual = _kind(node)
        decos = _decorators(node)
        deco = f" @{','.join(decos)}" if decos else ""
        return actual == kind, f"{rel}:{line} {actual}{deco}" + ("" if actual == kind else f" (manifest says {kind})")
    return False, "empty attribute path"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("src", help="unpacked sglang 0.5.17 wheel (the folder that holds sglang/)")
    ap.add_argument("--manifest", default=str(DEFAULT_MANIFEST))
    args = ap.parse_args(argv)
    root = Path(args.src)
    if not (root / "sglang").is_dir():
        print(f"{root}: no sglang/ folder", file=sys.stderr)
        return 2
    data = tomllib.loads(Path(args.manifest).read_text(encoding="utf-8"))
    version = "unknown"
    for meta in root.glob("sglang-*.dist-info/METADATA"):
        version = next(
            (ln.split(":", 1)[1].strip() for ln in meta.read_text().splitlines() if ln.startswith("Version:")), version
        )
    print(f"manifest sglang={data.get('sglang')}  source: {root} (sglang {version})")
    if data.get("sglang") != version:
        print("  WARNING: the manifest and the source are different versions")

    try:
        sys.path.insert(0, str(HERE.parents[2]))
        from sglang_mmtrace.hooks.registry import HOOKS
        from sglang_mmtrace.stages import STAGES
    except Exception as exc:  # the AST part still runs
        print(f"(cannot import sglang_mmtrace: {exc!r}; implementations not checked)")
        HOOKS, STAGES = None, None

    failures = 0
    covered: set[str] = set()
    for hook_id, h in data["hooks"].items():
        ok, detail = check_target(root, h["target"], h["kind"])
        notes = []
        if HOOKS is not None and hook_id not in HOOKS:
            ok, notes = False, [*notes, "NO IMPLEMENTATION"]
        if STAGES is not None:
            unknown = [s for s in h.get("stages", ()) if s not in STAGES]
            if unknown:
                ok, notes = False, [*notes, f"unknown stages {unknown}"]
        covered.update(h.get("stages", ()))
        failures += not ok
        flag = "ok  " if ok else "FAIL"
        req = "" if h.get("required", True) else " (optional)"
        print(f"{flag} {hook_id:<38} [{h['process']:<11} {h['kind']:<5}]{req} {h['target']}")
        print(f"       -> {detail}{'; ' + '; '.join(notes) if notes else ''}")
    if STAGES is not None:
        from sglang_mmtrace.stages import contract_stage_names

        absent = [s for s in contract_stage_names() if s not in covered]
        print(f"contract stages with no 0.5.17 target: {', '.join(absent) or 'none'}")
    print(f"{len(data['hooks'])} hooks, {failures} failed")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
