"""Feature hand-off to the scheduler (api process): shared memory, CUDA IPC, or inline pickling."""

from __future__ import annotations

from typing import Any

from ...join.context import LIVE
from ...stages import TRANSPORT_PREPARE
from ..base import HookSpec, arg, interval

_MODE_BY_TYPE = {
    "ShmPointerMMData": "cpu",
    "CudaIpcTensorTransportProxy": "cuda_ipc",
    "CudaVmmTensorTransportProxy": "cuda_vmm",
    "Tensor": "inline",
}


def _items(obj: Any) -> list[Any]:
    mm = getattr(obj, "mm_inputs", None)
    if mm is None:
        return []
    items = mm.get("mm_items") if isinstance(mm, dict) else getattr(mm, "mm_items", None)
    return list(items or ())


def _feature_bytes(items: list[Any]) -> int:
    total = 0
    for item in items:
        feature = getattr(item, "feature", None)
        for t in feature if isinstance(feature, list) else (feature,):
            nbytes = getattr(t, "nbytes", None)
            if isinstance(nbytes, int):
                total += nbytes
    return total


def _enter(instance: Any, args: tuple, kwargs: dict) -> Any:
    """(trace, feature bytes) for a traced request with features; None (the call goes straight
    through, untimed) for a text request, an untraced one, or 0.5.17's ``cuda_ipc`` request whose
    pool copies were already its ``transport.prepare`` (PROC thread): this host step inside
    ``dispatch`` then moves no bytes, and a stage appears once per request."""
    obj = arg(args, kwargs, 0, "obj")
    items = _items(obj)
    if not items:
        return None
    rid = getattr(obj, "rid", None)
    trace = LIVE.get(rid) if isinstance(rid, str) else None
    if trace is None:
        return None
    nbytes = _feature_bytes(items)
    if nbytes == 0 and trace.transport_mode == "cuda_ipc":
        return None
    return trace, nbytes


def _exit(st, t0, t1, instance, args, kwargs, result, exc) -> None:
    trace, nbytes = st
    modes = {_MODE_BY_TYPE.get(type(getattr(i, "feature", None)).__name__, "other") for i in _items(result)}
    mode = "cpu" if "cpu" in modes else (sorted(modes)[0] if modes else "none")
    trace.transport_mode = mode
    trace.transport_bytes += nbytes
    trace.add(TRANSPORT_PREPARE, t0, t1, {"mode": mode, "bytes": nbytes})


def _detail(instance: Any, args: tuple, kwargs: dict) -> str | None:
    obj = arg(args, kwargs, 0, "obj")
    return obj.rid if _items(obj) and getattr(obj, "rid", None) in LIVE else None


PART = "mm"  # the switch part that gates these hooks

HOOKS: dict[str, HookSpec] = {
    # entered_only: a text request (and 0.5.17's cuda_ipc one) goes straight through
    "transport.wrap_shm_features": interval(
        "transport.wrap_shm_features", _exit, _enter, nvtx=(TRANSPORT_PREPARE, _detail), entered_only=True
    ),
}

# the arguments each hook reads from its target (registry.READS_OF)
READS: dict[str, tuple[tuple[int | None, str | None], ...]] = {
    "transport.wrap_shm_features": ((0, "obj"),),
}
