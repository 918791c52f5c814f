"""CPU harness shim: placeholders for missing ``torch.ops.sgl_kernel.*_cpu`` ops (tests only).

Why: the only sgl-kernel on the registry is a CUDA build, yet with ``SGLANG_USE_CPU_ENGINE=1``
SGLang modules look up CPU kernels such as ``torch.ops.sgl_kernel.fused_sigmoid_mul_cpu`` at
import time. The lookup raises ``AttributeError`` and, e.g., the Qwen-VL processor module fails
to import ("No processor registered for Qwen3VLForConditionalGeneration"). The tiny model never
calls these kernels, so a placeholder that raises loudly *if called* is enough.

How: ``torch.ops.<ns>.<op>`` is resolved by ``torch._ops._OpNamespace.__getattr__``, which turns
a missing op into ``AttributeError``. A meta-path hook waits for ``torch._ops`` to be executed
(so torch is not imported eagerly by every Python process) and wraps that method so a missing
``sgl_kernel`` op whose name ends in ``_cpu`` yields a placeholder. Names SGLang probes with
``hasattr()`` to pick a fused path stay missing, so it keeps its pure-torch paths.

Active only when ``MMTRACE_HARNESS_CPU_SHIMS=1`` (``MMTRACE_HARNESS_CPU_SHIMS_LOG=1`` lists each
placeholder on stderr); the harness puts this directory on
``PYTHONPATH`` so spawned scheduler/detokenizer children run it too. Any other
``sitecustomize`` later on ``sys.path`` is still executed afterwards.
"""

from __future__ import annotations

import importlib.abc
import importlib.machinery
import importlib.util
import os
import sys
from collections.abc import Callable, Sequence
from types import ModuleType
from typing import Any

ENV_SWITCH = "MMTRACE_HARNESS_CPU_SHIMS"
ENV_LOG = "MMTRACE_HARNESS_CPU_SHIMS_LOG"  # "1": report each placeholder on stderr
NAMESPACE = "sgl_kernel"
# SGLang probes these with hasattr() to choose fused kernels; a placeholder would select a path
# that calls it. Keep them missing.
NEVER_PLACEHOLDER: frozenset[str] = frozenset(
    {"convert_weight_packed", "fused_qk_norm_cpu", "fused_qk_norm_rope_cpu", "shm_group_initialize"}
)
PLACEHOLDERS: list[str] = []
"""Names placeholdered in this process, in lookup order (for debugging and tests)."""


class MissingCpuOpError(RuntimeError):
    """Raised when SGLang actually calls a placeholdered CPU kernel."""


class MissingCpuOp:
    """Stands in for an absent ``torch.ops.sgl_kernel.<name>_cpu``; any call raises."""

    def __init__(self, name: str) -> None:
        self.name = name
        self.__name__ = name
        self.__qualname__ = f"{NAMESPACE}::{name}"

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        raise MissingCpuOpError(
            f"torch.ops.{NAMESPACE}.{self.name} was CALLED, but it is only a placeholder from the "
            f"sglang_mmtrace CPU harness (no CPU sgl-kernel is installed). The code path that "
            f"needs this kernel cannot run on the CPU test harness."
        )

    def __getattr__(self, attr: str) -> MissingCpuOp:
        # Overload access such as ``op.default`` returns the same raising placeholder.
        if attr.startswith("__"):
            raise AttributeError(attr)
        return self

    def __repr__(self) -> str:
        return f"<MissingCpuOp {NAMESPACE}::{self.name} (sglang_mmtrace CPU harness placeholder)>"


def should_placeholder(namespace: str, op_name: str) -> bool:
    """Whether a failed ``torch.ops`` lookup gets a placeholder instead of ``AttributeError``."""
    return namespace == NAMESPACE and op_name.endswith("_cpu") and op_name not in NEVER_PLACEHOLDER


def patch_op_namespace(ops_module: ModuleType) -> None:
    """Wrap ``_OpNamespace.__getattr__`` in an already executed ``torch._ops`` module."""
    cls = ops_module._OpNamespace
    original: Callable[[Any, str], Any] = cls.__getattr__
    if getattr(original, "_mmtrace_harness_patched", False):
        return

    def __getattr__(self: Any, op_name: str) -> Any:
        try:
            return original(self, op_name)
        except AttributeError:
            if not should_placeholder(getattr(self, "name", ""), op_name):
                raise
        placeholder = MissingCpuOp(op_name)
        setattr(self, op_name, placeholder)  # cache like torch does for real ops
        PLACEHOLDERS.append(op_name)
        if os.environ.get(ENV_LOG) == "1":
            print(f"[mmtrace-harness] placeholder torch.ops.{NAMESPACE}.{op_name} (pid {os.getpid()})", file=sys.stderr)
        return placeholder

    __getattr__._mmtrace_harness_patched = True  # type: ignore[attr-defined]
    cls.__getattr__ = __getattr__


class _PatchAfterExecLoader(importlib.abc.Loader):
    """Delegates to torch's real loader, then patches the freshly executed module."""

    def __init__(self, inner: importlib.abc.Loader) -> None:
        self._inner = inner

    def create_module(self, spec: importlib.machinery.ModuleSpec) -> ModuleType | None:
        return self._inner.create_module(spec)

    def exec_module(self, module: ModuleType) -> None:
        self._inner.exec_module(module)
        patch_op_namespace(module)


class _TorchOpsFinder(importlib.abc.MetaPathFinder):
    """Intercepts the import of ``torch._ops`` only; every other import is untouched."""

    target = "torch._ops"

    def find_spec(
        self,
        fullname: str,
        path: Sequence[str] | None,
        target: ModuleType | None = None,
    ) -> importlib.machinery.ModuleSpec | None:
        if fullname != self.target:
            return None
        sys.meta_path.remove(self)  # one-shot; also avoids recursing into ourselves
        for finder in sys.meta_path:
            find = getattr(finder, "find_spec", None)
            spec = find(fullname, path, target) if find is not None else None
            if spec is not None:
                if spec.loader is not None:
                    spec.loader = _PatchAfterExecLoader(spec.loader)
                return spec
        return None


def install() -> None:
    """Arrange for the patch to apply whether or not torch is already imported."""
    ops_module = sys.modules.get("torch._ops")
    if ops_module is not None and hasattr(ops_module, "_OpNamespace"):
        patch_op_namespace(ops_module)
    elif not any(isinstance(f, _TorchOpsFinder) for f in sys.meta_path):
        sys.meta_path.insert(0, _TorchOpsFinder())


def _chain_next_sitecustomize() -> None:
    """Run the ``sitecustomize`` this file shadows: the next one on ``sys.path`` after this folder, if any
    (not an earlier one: ``sglang-mmtrace run`` puts its own first and chains to this one)."""
    here = os.path.dirname(os.path.abspath(__file__))
    folders = [os.path.abspath(entry or os.getcwd()) for entry in sys.path]
    for folder in folders[folders.index(here) + 1 :] if here in folders else ():
        candidate = os.path.join(folder, "sitecustomize.py")
        if os.path.isfile(candidate):
            spec = importlib.util.spec_from_file_location("_mmtrace_chained_sitecustomize", candidate)
            if spec is not None and spec.loader is not None:
                module = importlib.util.module_from_spec(spec)
                spec.loader.exec_module(module)
            return


if os.environ.get(ENV_SWITCH) == "1":
    install()
_chain_next_sitecustomize()
