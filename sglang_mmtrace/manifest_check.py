"""A manifest checked against an SGLang source tree without importing SGLang (or its torch).

The same check serves CI (every supported release, from its wheel), ``sglang-mmtrace doctor`` (the
installed SGLang's files) and ``sglang-mmtrace doctor --matrix`` (the README's support matrix). For
each hook it parses the target's module with ``ast`` and finds what ``patch.resolve`` would find at
run time: the module (the longest dotted prefix that is a module file), the class chain, and the
attribute defined in the owner's own body (an inherited method is refused, as ``patch.resolve``
refuses it; the message names the class that defines it). Then:

- the kind: ``async def`` = ``async`` (``asyncgen`` with ``yield``), ``def`` = ``sync`` (also under
  ``classmethod``/``staticmethod``), ``asgi`` = a module-level assignment (the ``app`` object);
- every argument the hook reads (``READS`` in its hook module: ``(position, name)``, positions
  without ``self``/``cls``) is a parameter of the target's signature at that position and name.

``hook_reads`` finds, from the hook modules' own source, which arguments each hook reads, so that a
test holds the ``READS`` declarations to the code.
"""

from __future__ import annotations

import ast
import importlib.util
import os
import re
import subprocess
import sys
import zipfile
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

from . import environment_variables as ev
from .manifest import HookEntry, Manifest, load
from .stages import (
    MM_DECODE,
    MM_EXPAND,
    MM_LOAD,
    MM_PROCESS,
    MM_RESIZE_NORMALIZE,
    MODEL_AUDIO_ENCODER,
    MODEL_VISION_ENCODER,
    STAGES,
)

Read = tuple[int | None, str | None]
"""One argument a hook reads: (position without self/cls, name); None where it reads only the other."""


class WheelUnavailable(RuntimeError):
    """A release's wheel is neither in the cache nor downloadable (``pip download`` failed)."""


# ------------------------------------------------------------------------------------------------ sources


class Source(Protocol):
    """SGLang's Python files, by path relative to the folder that holds ``sglang/``."""

    version: str

    def read(self, rel: str) -> str | None: ...

    def files(self, folder: str) -> list[str]:
        """The ``.py`` files directly in ``folder`` (relative, as ``read`` takes them), sorted."""
        ...


class WheelSource:
    def __init__(self, wheel: Path) -> None:
        self.zip = zipfile.ZipFile(wheel)
        self.names = set(self.zip.namelist())
        self.version = wheel.name.split("-")[1]

    def read(self, rel: str) -> str | None:
        return self.zip.read(rel).decode("utf-8-sig") if rel in self.names else None

    def files(self, folder: str) -> list[str]:
        prefix = folder.rstrip("/") + "/"
        return sorted(
            n for n in self.names if n.startswith(prefix) and n.endswith(".py") and "/" not in n[len(prefix) :]
        )


class DirSource:
    def __init__(self, root: Path, version: str) -> None:
        self.root = root
        self.version = version

    def read(self, rel: str) -> str | None:
        path = self.root / rel
        return path.read_text(encoding="utf-8-sig") if path.is_file() else None

    def files(self, folder: str) -> list[str]:
        return sorted(str(p.relative_to(self.root)) for p in (self.root / folder).glob("*.py"))


def installed_source(version: str) -> DirSource | None:
    """The installed SGLang's files (found without importing it), or None when it is not installed."""
    spec = importlib.util.find_spec("sglang")
    if spec is None or not spec.submodule_search_locations:
        return None
    return DirSource(Path(next(iter(spec.submodule_search_locations))).parent, version)


def wheel_cache() -> Path:
    return Path(os.environ.get(ev.SGLANG_MMTRACE_WHEEL_CACHE) or Path.home() / ".cache" / "sglang-mmtrace" / "wheels")


def wheel(version: str, cache: Path | None = None) -> Path:
    """The ``sglang==version`` wheel in the cache, downloaded there once (``pip download --no-deps``)."""
    cache = cache or wheel_cache()
    found = sorted(cache.glob(f"sglang-{version}-*.whl"))
    if found:
        return found[0]
    cache.mkdir(parents=True, exist_ok=True)
    cmd = [sys.executable, "-m", "pip", "download", f"sglang=={version}", "--no-deps", "-q", "-d", str(cache)]
    done = subprocess.run(cmd, capture_output=True, text=True)
    found = sorted(cache.glob(f"sglang-{version}-*.whl"))
    if done.returncode != 0 or not found:
        raise WheelUnavailable(
            f"sglang=={version}: no wheel in {cache} and `{' '.join(cmd[2:])}` failed "
            f"(is PyPI reachable? put the wheel in {ev.SGLANG_MMTRACE_WHEEL_CACHE}): {done.stderr.strip()[-500:]}"
        )
    return found[0]


# ------------------------------------------------------------------------------------------------ targets


@dataclass(frozen=True)
class Found:
    """Where a target is defined in the source, and what it is."""

    where: str  # file:line
    node: ast.AST
    method: bool  # defined in a class body (its first parameter is self/cls unless a staticmethod)


def _defines(node: ast.stmt, name: str) -> bool:
    if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
        return node.name == name
    if isinstance(node, ast.Assign):
        return any(isinstance(t, ast.Name) and t.id == name for t in node.targets)
    if isinstance(node, ast.AnnAssign):
        return isinstance(node.target, ast.Name) and node.target.id == name
    return False


def _find(body: list[ast.stmt], name: str) -> ast.AST | None:
    """The last definition of ``name`` in a body (later definitions win, as at run time), also inside
    module-level ``if``/``try`` blocks."""
    found = None
    for node in body:
        if _defines(node, name):
            found = node
        elif isinstance(node, ast.If | ast.Try):
            for sub in (
                node.body,
                node.orelse,
                getattr(node, "finalbody", []),
                *(h.body for h in getattr(node, "handlers", [])),
            ):
                hit = _find(sub, name)
                if hit is not None:
                    found = hit
    return found


class Tree:
    """Parsed modules of one source, by dotted name."""

    def __init__(self, source: Source) -> None:
        self.source = source
        self._parsed: dict[str, tuple[str, ast.Module] | None] = {}

    def module(self, dotted: str) -> tuple[str, ast.Module] | None:
        if dotted not in self._parsed:
            base = dotted.replace(".", "/")
            hit = None
            for rel in (f"{base}.py", f"{base}/__init__.py"):
                text = self.source.read(rel)
                if text is not None:
                    hit = (rel, ast.parse(text, filename=rel))
                    break
            self._parsed[dotted] = hit
        return self._parsed[dotted]

    def split(self, target: str) -> tuple[str, list[str]] | None:
        """(module, attribute path): the longest dotted prefix that is a module file."""
        parts = target.split(".")
        for n in range(len(parts) - 1, 0, -1):
            if self.module(".".join(parts[:n])) is not None:
                return ".".join(parts[:n]), parts[n:]
        return None

    def defining_base(self, module: str, cls: ast.ClassDef, name: str, seen: int = 0) -> str | None:
        """``module.Class`` of the nearest base class (in this source) whose own body defines ``name``."""
        if seen > 20:
            return None
        for base in cls.bases:
            resolved = self._base(module, ast.unparse(base))
            if resolved is None:
                continue
            base_mod, base_cls = resolved
            if _find(base_cls.body, name) is not None:
                return f"{base_mod}.{base_cls.name}"
            deeper = self.defining_base(base_mod, base_cls, name, seen + 1)
            if deeper is not None:
                return deeper
        return None

    def _base(self, module: str, expr: str) -> tuple[str, ast.ClassDef] | None:
        """A base-class expression of a class in ``module`` -> (its module, its ClassDef), through the
        module's absolute imports (``from pkg.mod import Base``, ``import pkg.mod as m``)."""
        _, tree = self.module(module)  # type: ignore[misc]
        head, _, rest = expr.partition(".")
        where, name = module, expr
        for node in tree.body:
            if isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                for alias in node.names:
                    if (alias.asname or alias.name) == head:
                        where, name = node.module, ".".join(filter(None, (alias.name, rest)))
            elif isinstance(node, ast.Import):
                for alias in node.names:
                    if (alias.asname or alias.name) == head and rest:
                        where, name = alias.name, rest
        split = self.split(f"{where}.{name}")
        if split is None:
            return None
        where, parts = split
        body = self.module(where)[1].body  # type: ignore[index]
        node = None
        for part in parts:
            node = _find(body, part)
            if not isinstance(node, ast.ClassDef):
                return None
            body = node.body
        return (where, node) if node is not None else None

    def find(self, target: str) -> Found | str:
        """The target's definition, or why there is none."""
        split = self.split(target)
        if split is None:
            return "no module file"
        module, rest = split
        rel, tree = self.module(module)  # type: ignore[misc]
        body: list[ast.stmt] = tree.body
        owner: ast.ClassDef | None = None
        where = rel
        for i, name in enumerate(rest):
            node = _find(body, name)
            if node is None:
                if owner is not None:
                    base = self.defining_base(module, owner, name)
                    if base is not None:
                        return f"{owner.name}.{name} is inherited from {base}: hook that class"
                if owner is None and i < len(rest) - 1:
                    return f"{module}.{name}: no module file, and {name} not defined in {where}"
                return f"{name} not defined in {where}"
            if i < len(rest) - 1:
                if not isinstance(node, ast.ClassDef):
                    return f"{name} in {where} is not a class"
                owner, body, where = node, node.body, f"{rel}:{node.name}"
                continue
            return Found(f"{rel}:{node.lineno}", node, owner is not None)
        return "no attribute path after the module"


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


def _decorators(fn: ast.FunctionDef | ast.AsyncFunctionDef) -> set[str]:
    return {ast.unparse(d.func if isinstance(d, ast.Call) else d) for d in fn.decorator_list}


def signature_problem(found: Found, reads: Iterable[Read]) -> str | None:
    """Why one of ``reads`` is not a parameter of the target at that position and name; None if all are."""
    fn = found.node
    assert isinstance(fn, ast.FunctionDef | ast.AsyncFunctionDef)
    positional = [a.arg for a in (*fn.args.posonlyargs, *fn.args.args)]
    if found.method and "staticmethod" not in _decorators(fn):
        positional = positional[1:]
    names = set(positional) | {a.arg for a in fn.args.kwonlyargs}
    for pos, name in reads:
        if pos is not None and name is not None:
            if pos >= len(positional) or positional[pos] != name:
                at = positional[pos] if pos < len(positional) else "nothing"
                return f"reads argument {pos} as {name!r}, the signature has {at!r} there ({', '.join(positional)})"
        elif name is not None and name not in names and fn.args.kwarg is None:
            return f"reads argument {name!r}, not a parameter ({', '.join(sorted(names))})"
        elif pos is not None and pos >= len(positional) and fn.args.vararg is None:
            return f"reads argument {pos}, the signature has {len(positional)} ({', '.join(positional)})"
    return None


@dataclass(frozen=True)
class HookCheck:
    entry: HookEntry
    why: str | None  # None: resolves, kind and arguments match
    where: str  # file:line of the definition ("" when not found)

    @property
    def ok(self) -> bool:
        return self.why is None


LATE_FOLDERS: dict[str, str] = {
    "processor": "sglang/srt/multimodal/processors",
    "model": "sglang/srt/models",
}
"""Where the classes of a manifest entry's ``applies_to`` live: SGLang's processors, its models."""


def _classes(tree: Tree, folder: str, needle: str) -> Iterator[tuple[str, ast.ClassDef, str]]:
    """(module, class, the module's source) of every top-level class in the ``.py`` files directly in
    ``folder`` whose source contains ``needle`` (the other files are not parsed: most of them)."""
    for rel in tree.source.files(folder):
        text = tree.source.read(rel) or ""
        if needle not in text:
            continue
        module = rel[: -len(".py")].replace("/", ".")
        parsed = tree.module(module)
        for node in parsed[1].body if parsed else ():
            if isinstance(node, ast.ClassDef):
                yield module, node, text


def definers(tree: Tree, applies_to: str, method: str) -> dict[str, ast.FunctionDef | ast.AsyncFunctionDef]:
    """``module.Class`` -> its own definition of ``method``, for every class in ``applies_to``'s folder."""
    out: dict[str, ast.FunctionDef | ast.AsyncFunctionDef] = {}
    for module, node, _ in _classes(tree, LATE_FOLDERS[applies_to], f"def {method}("):
        fn = _find(node.body, method)
        if isinstance(fn, ast.FunctionDef | ast.AsyncFunctionDef):
            out[f"{module}.{node.name}"] = fn
    return out


def _check_late(tree: Tree, entry: HookEntry) -> HookCheck:
    """An ``applies_to`` entry: some class of its folder defines the method, and every definition has
    the manifest's kind (the one SGLang builds at run time is checked again when it is hooked)."""
    assert entry.applies_to is not None
    if entry.applies_to not in LATE_FOLDERS:
        # the HF model the transformers backend wraps: its class is transformers', not in SGLang's
        # wheel; it is checked when it is hooked, on the class that was loaded
        return HookCheck(entry, None, "sglang/srt/models/transformers.py (the HF model it wraps, checked when loaded)")
    defs = definers(tree, entry.applies_to, entry.target)
    if not defs:
        return HookCheck(entry, f"no class in {LATE_FOLDERS[entry.applies_to]} defines {entry.target}", "")
    wrong = sorted(name for name, fn in defs.items() if _kind(fn) != entry.kind)
    why = f"kind is not {entry.kind} in {', '.join(wrong)}" if wrong else None
    return HookCheck(entry, why, f"{LATE_FOLDERS[entry.applies_to]}/ ({len(defs)} classes)")


def check_entry(tree: Tree, entry: HookEntry, reads: Iterable[Read] = ()) -> HookCheck:
    if entry.applies_to is not None:
        return _check_late(tree, entry)
    found = tree.find(entry.target)
    if isinstance(found, str):
        return HookCheck(entry, found, "")
    node = found.node
    if entry.kind == "asgi":
        ok = isinstance(node, ast.Assign | ast.AnnAssign) and not found.method
        return HookCheck(entry, None if ok else f"not a module-level assignment ({type(node).__name__})", found.where)
    if not isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
        return HookCheck(entry, f"a {type(node).__name__}, not a function", found.where)
    actual = _kind(node)
    if actual != entry.kind:
        return HookCheck(entry, f"kind is {actual}, manifest says {entry.kind}", found.where)
    return HookCheck(entry, signature_problem(found, reads), found.where)


def check(manifest: Manifest, source: Source) -> list[HookCheck]:
    """Every hook of ``manifest`` checked against ``source``, with the arguments its hook module reads."""
    from .hooks.registry import READS_OF

    tree = Tree(source)
    return [check_entry(tree, e, READS_OF.get(e.hook_id, ())) for e in manifest.hooks]


# ------------------------------------------------------------------------------------------------ stages


def stage_states(manifest: Manifest, results: list[HookCheck]) -> dict[str, tuple[str, str]]:
    """stage -> (state, why): ``ok``; ``partial``/``lost`` (some/all of its hooks fail); ``none`` (the
    manifest names no target: its ``[absent]`` table says why); ``joined`` (the collector joins it)."""
    from .join.collector import JOINED_STAGES

    out: dict[str, tuple[str, str]] = {}
    for stage in STAGES:
        theirs = [r for r in results if stage in r.entry.stages]
        mine = [r for r in theirs if r.entry.required] or theirs  # a stage only optional hooks measure
        failed = [r for r in mine if not r.ok]
        why = "; ".join(f"{r.entry.hook_id}: {r.why}" for r in failed)
        if stage in JOINED_STAGES:
            out[stage] = ("joined", "joined in the collector")
        elif not mine:
            out[stage] = ("none", manifest.absent.get(stage, f"the {manifest.version} manifest names no target"))
        elif not failed:
            out[stage] = ("ok", "")
        else:
            out[stage] = ("lost" if len(failed) == len(mine) else "partial", why)
    return out


MATRIX_BEGIN = "<!-- support-matrix:begin (generated by sglang-mmtrace doctor --matrix) -->"
MATRIX_END = "<!-- support-matrix:end -->"


def matrix(versions: Iterable[str], cache: Path | None = None) -> str:
    """The support matrix (stage x release) as Markdown: each release's own manifest checked against its
    wheel. Cells: ok, joined, none (no target: why below), partial/LOST (why below)."""
    versions = list(versions)
    states = {}
    for v in versions:
        manifest = load(v)
        states[v] = stage_states(manifest, check(manifest, WheelSource(wheel(v, cache))))
    lines = ["| stage | " + " | ".join(versions) + " |", "|---|" + "---|" * len(versions)]
    notes: dict[str, list[str]] = {}
    for stage in STAGES:
        cells = []
        for v in versions:
            state, why = states[v][stage]
            if state in ("none", "partial", "lost"):
                refs = notes.setdefault(why, [])
                refs.append(f"{stage} on {v}")
                state = f"{state if state != 'lost' else 'LOST'} [{list(notes).index(why) + 1}]"
            cells.append(state)
        lines.append(f"| `{stage}` | " + " | ".join(cells) + " |")
    lines.append("")
    lines += [f"{i}. {why}" for i, why in enumerate(notes, 1)]
    return "\n".join(lines)


def render_readme(readme: str, table: str, begin: str = MATRIX_BEGIN, end: str = MATRIX_END) -> str:
    """``readme`` with ``table`` between the markers ``begin`` and ``end``."""
    head, rest = readme.split(begin, 1)
    _, tail = rest.split(end, 1)
    return f"{head}{begin}\n{table}\n{end}{tail}"


# ------------------------------------------------------------------------------------------------ hook reads


def hook_reads(module_path: Path) -> dict[str, set[Read]]:
    """hook id -> the arguments its code reads, found in the hook module's source.

    From each ``HOOKS`` entry, the module-level functions it names are followed (with the constant
    arguments of factory calls bound to their parameters, and module-level constants); the reads are
    ``arg(args, kwargs, i, name)`` calls, and raw ``kwargs[...]``/``args[...]`` reads (a name and a
    position read in the same function make one pair). Functions of other hook modules named as
    ``module.function`` are followed into that module.
    """
    return _ModuleReads(module_path).by_hook()


class _ModuleReads:
    _loaded: dict[Path, _ModuleReads] = {}

    @classmethod
    def of(cls, path: Path) -> _ModuleReads:
        if path not in cls._loaded:
            cls._loaded[path] = cls(path)
        return cls._loaded[path]

    def __init__(self, path: Path) -> None:
        self.tree = ast.parse(path.read_text(encoding="utf-8"))
        body = self.tree.body
        self.funcs = {n.name: n for n in body if isinstance(n, ast.FunctionDef | ast.AsyncFunctionDef)}
        self.consts = {
            t.id: n.value.value
            for n in body
            if isinstance(n, ast.Assign) and isinstance(n.value, ast.Constant)
            for t in n.targets
            if isinstance(t, ast.Name)
        }
        self.modules: dict[str, Path] = {}  # ``from . import x`` / ``from .x import f``: sibling hook modules
        self.imported: dict[str, tuple[Path, str]] = {}
        for n in body:
            if isinstance(n, ast.ImportFrom) and n.level == 1:
                for alias in n.names:
                    if n.module is None and (path.parent / f"{alias.name}.py").is_file():
                        self.modules[alias.asname or alias.name] = path.parent / f"{alias.name}.py"
                    elif n.module is not None:
                        self.imported[alias.asname or alias.name] = (path.parent / f"{n.module}.py", alias.name)

    def by_hook(self) -> dict[str, set[Read]]:
        hooks = next(
            n.value
            for n in self.tree.body
            for t in (n.targets if isinstance(n, ast.Assign) else [n.target] if isinstance(n, ast.AnnAssign) else [])
            if isinstance(t, ast.Name) and t.id == "HOOKS"
        )
        assert isinstance(hooks, ast.Dict)
        out: dict[str, set[Read]] = {}
        for key, value in zip(hooks.keys, hooks.values, strict=True):
            reads: set[Read] = set()
            self._follow(value, {}, reads, set())
            out[ast.literal_eval(key)] = reads  # type: ignore[arg-type]
        return out

    def _value(self, node: ast.AST, env: dict[str, object]) -> object:
        if isinstance(node, ast.Constant):
            return node.value
        if isinstance(node, ast.Name):
            return env.get(node.id, self.consts.get(node.id))
        return None

    def _callee(self, node: ast.AST) -> tuple[_ModuleReads, ast.FunctionDef | ast.AsyncFunctionDef] | None:
        """The hook-package function a name (``f``, ``sibling.f``, an imported ``f``) refers to."""
        if isinstance(node, ast.Name) and node.id in self.funcs:
            return self, self.funcs[node.id]
        if isinstance(node, ast.Name) and node.id in self.imported:
            path, name = self.imported[node.id]
            other = _ModuleReads.of(path)
            return (other, other.funcs[name]) if name in other.funcs else None
        if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) and node.value.id in self.modules:
            other = _ModuleReads.of(self.modules[node.value.id])
            return (other, other.funcs[node.attr]) if node.attr in other.funcs else None
        return None

    def _follow(self, node: ast.AST, env: dict[str, object], reads: set[Read], seen: set[tuple]) -> None:
        """Into every function an expression or body calls (its constant arguments bound) or names."""
        stack = [node]
        while stack:
            sub = stack.pop()
            callee = self._callee(sub.func) if isinstance(sub, ast.Call) else self._callee(sub)
            if isinstance(sub, ast.Call) and callee is not None:
                mod, fn = callee
                params = [a.arg for a in fn.args.args]
                bound = {p: self._value(a, env) for p, a in zip(params, sub.args, strict=False)}
                bound.update({k.arg: self._value(k.value, env) for k in sub.keywords if k.arg})
                mod._function(fn, {k: v for k, v in bound.items() if v is not None}, reads, seen)
                stack.extend([*sub.args, *(k.value for k in sub.keywords)])
            elif callee is not None:
                callee[0]._function(callee[1], {}, reads, seen)
            else:
                stack.extend(ast.iter_child_nodes(sub))

    def _function(
        self, fn: ast.FunctionDef | ast.AsyncFunctionDef, env: dict[str, object], reads: set[Read], seen: set[tuple]
    ) -> None:
        key = (id(self), fn.name, tuple(sorted(env.items(), key=str)))
        if key in seen:
            return
        seen.add(key)
        for sub in ast.walk(fn):  # one function and the closures it defines
            if isinstance(sub, ast.FunctionDef | ast.AsyncFunctionDef | ast.Lambda):
                self._raw_reads(sub, env, reads)
            if (
                isinstance(sub, ast.Call)
                and isinstance(sub.func, ast.Name)
                and sub.func.id == "arg"
                and len(sub.args) == 4
            ):
                pos, name = self._value(sub.args[2], env), self._value(sub.args[3], env)
                if pos is not None or name is not None:
                    reads.add((pos, name))  # type: ignore[arg-type]
        for stmt in fn.body:
            self._follow(stmt, env, reads, seen)

    def _raw_reads(self, fn: ast.AST, env: dict[str, object], reads: set[Read]) -> None:
        """``kwargs[k]``, ``kwargs.get(k)``, ``k in kwargs``, ``args[i]`` in one function's own body; a
        name and a position read together (``kwargs[k] if k in kwargs else args[i]``) are one pair."""
        names: set[str] = set()
        positions: set[int] = set()
        stack = list(ast.iter_child_nodes(fn))
        while stack:
            sub = stack.pop()
            if isinstance(sub, ast.FunctionDef | ast.AsyncFunctionDef | ast.Lambda):
                continue
            stack.extend(ast.iter_child_nodes(sub))
            if isinstance(sub, ast.Subscript) and isinstance(sub.value, ast.Name):
                index = self._value(sub.slice, env)
                if sub.value.id == "kwargs" and isinstance(index, str):
                    names.add(index)
                elif sub.value.id == "args" and isinstance(index, int):
                    positions.add(index)
            elif (
                isinstance(sub, ast.Call)
                and isinstance(sub.func, ast.Attribute)
                and sub.func.attr == "get"
                and isinstance(sub.func.value, ast.Name)
                and sub.func.value.id == "kwargs"
                and sub.args
            ):
                names.add(self._value(sub.args[0], env))  # type: ignore[arg-type]
            elif isinstance(sub, ast.Compare) and isinstance(sub.ops[0], ast.In):
                right = sub.comparators[0]
                if isinstance(right, ast.Name) and right.id == "kwargs":
                    names.add(self._value(sub.left, env))  # type: ignore[arg-type]
        names.discard(None)  # type: ignore[arg-type]
        if len(names) == 1 and len(positions) == 1:
            reads.add((positions.pop(), names.pop()))
            return
        reads.update((None, n) for n in names)
        reads.update((p, None) for p in positions)


# ------------------------------------------------------------------------------------------------ families

FAMILY_BEGIN = "<!-- family-matrix:begin (generated by sglang-mmtrace doctor --matrix) -->"
FAMILY_END = "<!-- family-matrix:end -->"
FAMILY_STAGES: dict[str, tuple[str, ...]] = {
    MM_PROCESS: ("process_mm_data_async",),
    MM_LOAD: ("load_mm_data", "MediaArtifactCacheMixin", "def _load_images"),
    MM_DECODE: ("load_mm_data", "MediaArtifactCacheMixin", "def _load_images"),
    MM_RESIZE_NORMALIZE: (
        "process_and_combine_mm_data",
        "MediaArtifactCacheMixin",
        "def dynamic_preprocess",
        "def _apply_hf_processor",
    ),
    MM_EXPAND: (
        "process_and_combine_mm_data",
        "MediaArtifactCacheMixin",
        "def dynamic_preprocess",
        "def _build_mm_items",
    ),
}
"""The per-family processor stages, and what the family's processor source must name for the generic
hooks to see them (its ``process_mm_data_async``; the base processor's ``load_mm_data`` and
``process_and_combine_mm_data``; Qwen-VL's artifact pipeline; InternVL's own tiling, the one per-model
hook; the transformers backend's processor, whose own three calls are hooked). An audio clip has no ``mm.load`` of its own (SGLang reads, decodes and resamples it in one call,
its ``mm.decode``). Every other stage is the same for every model."""
ENCODERS: dict[str, tuple[str, tuple[str, ...]]] = {
    "image": (MODEL_VISION_ENCODER, ("get_image_feature",)),
    "video": (MODEL_VISION_ENCODER, ("get_video_feature", "get_image_feature")),
    "audio": (MODEL_AUDIO_ENCODER, ("get_audio_feature",)),
}
"""Per modality: its encoder stage, and the embedders ``embed_mm_inputs`` resolves for it (a model may
embed video with its image embedder)."""
GENERIC_ROUTINE = ("general_mm_embed_routine", "embed_mm_inputs", "prepare_mm_inputs")
"""What a model's forward calls when it embeds through SGLang's generic routine: only there are the
embedding cache's lookups and the per-modality embedders seen (``join.outcomes``)."""
OWN_ENCODERS = {"image": ("encode_images",)}
"""Per-model encoder hooks (manifest ``mm_embedding.llava_encoder``): a model whose own forward calls
these is seen there instead, with no embedding cache to prove a hit."""
TRANSFORMERS_BACKEND = "transformers"
"""``--model-impl transformers``: SGLang serves any HF model through its own Transformers* classes."""


def _class(tree: Tree, folder: str, name: str) -> tuple[str, ast.ClassDef] | None:
    """(module, class) of the class ``name`` in ``folder`` (first definition found)."""
    return next(((m, n) for m, n, _ in _classes(tree, folder, f"class {name}") if n.name == name), None)


def _processor_of(tree: Tree, architecture: str, model_impl: str = "sglang") -> tuple[str, ast.ClassDef] | None:
    """(module, class) of the processor SGLang picks for ``architecture``: the one whose ``models`` list
    names it; with the transformers backend only one that says ``supports_transformers_backend``, else
    SGLang's ``TransformersAutoMultimodalProcessor`` (``get_mm_processor``)."""
    listed = re.compile(rf"models\s*=\s*\[[^\]]*\b{architecture}\b")
    for module, node, text in _classes(tree, LATE_FOLDERS["processor"], architecture):
        segment = ast.get_source_segment(text, node) or ""
        if listed.search(segment) and (
            model_impl != TRANSFORMERS_BACKEND or "supports_transformers_backend = True" in segment
        ):
            return module, node
    if model_impl == TRANSFORMERS_BACKEND:
        return _class(tree, LATE_FOLDERS["processor"], "TransformersAutoMultimodalProcessor")
    return None


def _inner_processor(
    tree: Tree, proc: tuple[str, ast.ClassDef], vision_type: str | None
) -> tuple[str, ast.ClassDef] | None:
    """The processor that does the work where ``proc`` is a wrapper that picks one by the checkpoint's
    vision tower (SGLang's ``LlavaMultimodalProcessor``: CLIP -> LLaVA-1.5's own processor, else the
    processor of the tower's model type, Pixtral's for Mistral 3); None where the tower is unknown."""
    module, node = proc
    text = ast.get_source_segment(tree.source.read(module.replace(".", "/") + ".py") or "", node) or ""
    if "_get_sgl_processor_cls" not in text:
        return proc
    if vision_type is None:
        return None
    if vision_type == "clip_vision_model":
        return _class(tree, LATE_FOLDERS["processor"], "LlavaImageProcessor")
    rel = f"{LATE_FOLDERS['processor']}/{vision_type}.py"
    found = next(
        (n for m, n, _ in _classes(tree, LATE_FOLDERS["processor"], "class ") if m.endswith(f".{vision_type}")), None
    )
    return (rel[:-3].replace("/", "."), found) if found is not None else None


def _with_delegates(tree: Tree, module: str, node: ast.ClassDef) -> str:
    """The processor class's source and that of the processor modules it delegates to: a wrapper
    (LLaVA's picks Pixtral's processor for Mistral 3) calls a processor of another module. Only the
    class's own source counts from its module, for a module may hold processors of other paths
    (LLaVA-1.5's own, which loads in a process pool, beside that wrapper)."""
    folder = LATE_FOLDERS["processor"].replace("/", ".")
    rel = module.replace(".", "/") + ".py"
    whole = tree.source.read(rel) or ""
    text = ast.get_source_segment(whole, node) or ""
    for dep in sorted(set(re.findall(rf"from ({re.escape(folder)}\.\w+) import ([\w, ()\n]+)", whole))):
        dep_module, names = dep
        if dep_module in (module, f"{folder}.base_processor"):
            continue  # the base's generic path counts only where the class calls it (its own source says)
        if any(n.strip() and n.strip() in text for n in re.split(r"[,()\s]+", names)):
            text += tree.source.read(dep_module.replace(".", "/") + ".py") or ""
    return text


def family_stages(
    tree: Tree,
    architecture: str,
    modalities: Iterable[str] = ("image",),
    model_impl: str = "sglang",
    vision_type: str | None = None,
) -> dict[str, tuple[str, str]]:
    """stage -> (``ok`` or ``LOST``, why) for one model class and the modalities it takes, read from the
    source (no import): what a new item's record will show, a ``LOST`` stage listed in its
    ``unobserved`` and, for a lost encoder, its embedding outcome ``null`` (``predicted_embedding``).

    Static and approximate: a processor whose source names the base processor's generic path is taken
    to go through it; the CPU tests (``tests/test_server_families.py``) check the prediction against
    the records of every family built here."""
    wanted = list(dict.fromkeys(modalities))
    proc = _processor_of(tree, architecture, model_impl)
    if proc is not None:
        proc = _inner_processor(tree, proc, vision_type)
    out: dict[str, tuple[str, str]] = {}
    stages = [s for s in FAMILY_STAGES if s != MM_LOAD or set(wanted) - {"audio"}]
    if proc is None:
        why = f"no processor in {LATE_FOLDERS['processor']} lists {architecture}"
        if vision_type is None and _processor_of(tree, architecture, model_impl) is not None:
            why = f"{architecture}'s processor is picked by the checkpoint's vision tower (give its config)"
        out.update(dict.fromkeys(stages, ("LOST", why)))
    else:
        module, node = proc
        # what the processor's code names: its module and the processor modules it imports, the base
        # class's process_mm_data_async where it inherits that, and its own bases
        parts = [_with_delegates(tree, module, node), ast.unparse(node.bases)]
        base = (
            None
            if _find(node.body, "process_mm_data_async")
            else tree.defining_base(module, node, "process_mm_data_async")
        )
        if base is not None and (found := tree.find(f"{base}.process_mm_data_async")) and not isinstance(found, str):
            parts.append(ast.unparse(found.node))
        text = "\n".join(parts)
        for stage in stages:
            names = FAMILY_STAGES[stage]
            hit = any(n in text for n in names)
            out[stage] = ("ok", "") if hit else ("LOST", f"{node.name} does not use {' or '.join(names)}")
    for modality in wanted:
        stage, _ = ENCODERS[modality]
        state = _encoder_state(tree, architecture, modality, model_impl)
        if out.get(stage, ("ok", ""))[0] == "ok":
            out[stage] = state
    return out


def _encoder_state(tree: Tree, architecture: str, modality: str, model_impl: str) -> tuple[str, str]:
    """Whether a new item's encoder run of ``modality`` is seen: the model's forward goes through the
    generic routine and its class has the modality's embedder, or it calls a per-model encoder hook."""
    if model_impl == TRANSFORMERS_BACKEND:
        # the HF model encodes in its own forward through get_<modality>_features, which every
        # transformers VLM defines (manifest mm_embedding.hf_*_encoder; checked when it is loaded)
        return ("ok", "")
    model = _class(tree, LATE_FOLDERS["model"], architecture)
    if model is None:
        return ("LOST", f"no model class {architecture} in {LATE_FOLDERS['model']}")
    module, node = model
    stage, embedders = ENCODERS[modality]

    def has(name: str) -> bool:
        return _find(node.body, name) is not None or tree.defining_base(module, node, name) is not None

    text = _with_bases(tree, module, node)
    if any(n in text for n in GENERIC_ROUTINE):
        if any(has(e) for e in embedders):
            return ("ok", "")
        return ("LOST", f"{architecture} has no {' or '.join(embedders)}")
    if any(has(e) and f"self.{e}(" in text for e in OWN_ENCODERS.get(modality, ())):
        return ("ok", "")
    return ("LOST", f"{architecture}'s forward does not go through SGLang's generic embedding routine")


def _with_bases(tree: Tree, module: str, node: ast.ClassDef) -> str:
    """The model class's source and that of the classes that define its ``forward`` (where the forward
    is inherited, the base's: LLaVA's families share ``LlavaBaseForCausalLM.forward``)."""
    text = ast.get_source_segment(tree.source.read(module.replace(".", "/") + ".py") or "", node) or ""
    base = tree.defining_base(module, node, "forward")
    if _find(node.body, "forward") is None and base is not None:
        base_mod, _, base_cls = base.rpartition(".")
        found = _class(tree, LATE_FOLDERS["model"], base_cls)
        if found is not None:
            text += "\n" + (
                ast.get_source_segment(tree.source.read(base_mod.replace(".", "/") + ".py") or "", found[1]) or ""
            )
    return text


def predicted_embedding(states: dict[str, tuple[str, str]], modality: str) -> str | None:
    """A new item's ``cache.modalities[modality].embedding``: ``miss`` where its encoder run is seen."""
    stage, _ = ENCODERS[modality]
    return "miss" if states.get(stage, ("LOST", ""))[0] == "ok" else None


def family_matrix(version: str, cache: Path | None = None) -> str:
    """The harness families x their multimodal stages on ``version`` (from its wheel), as Markdown."""
    from .harness.families import families

    tree = Tree(WheelSource(wheel(version, cache)))
    fams = families()
    states = {
        name: family_stages(tree, fam.architecture, fam.modalities, fam.model_impl, fam.vision_type)
        for name, fam in fams.items()
    }
    stages = [*FAMILY_STAGES, MODEL_VISION_ENCODER, MODEL_AUDIO_ENCODER]
    lines = [f"| stage (SGLang {version}) | " + " | ".join(fams) + " |", "|---|" + "---|" * len(fams)]
    notes: list[str] = []
    for stage in stages:
        cells = []
        for name in fams:
            if stage not in states[name]:
                cells.append("-")  # the family takes no modality that has this stage
                continue
            state, why = states[name][stage]
            if why and why not in notes:
                notes.append(why)
            cells.append(f"{state} [{notes.index(why) + 1}]" if why else state)
        lines.append(f"| `{stage}` | " + " | ".join(cells) + " |")
    lines.append("")
    lines.append("| family | " + " | ".join(fams) + " |")
    lines.append("|---|" + "---|" * len(fams))
    lines.append("| model class | " + " | ".join(f"`{f.architecture}`" for f in fams.values()) + " |")
    lines += ["", *(f"{i}. {why}" for i, why in enumerate(notes, 1))]
    return "\n".join(lines).rstrip()
