"""CPU-only shims that let the real SGLang server start without a GPU (test harness only).

Two shims:

* ``cuda_stub.c``: a stub ``libcuda.so.1`` so sgl-kernel's CUDA extension can be dlopen'ed.
* ``sitecustomize.py``: placeholders for ``torch.ops.sgl_kernel.*_cpu`` names that SGLang looks
  up at import time. This directory goes on ``PYTHONPATH`` so spawned children load it too.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import subprocess
import tempfile
from pathlib import Path

SHIMS_DIR: Path = Path(__file__).resolve().parent
"""Directory to prepend to ``PYTHONPATH`` (it holds ``sitecustomize.py``)."""

CPU_SHIMS_ENV: str = "MMTRACE_HARNESS_CPU_SHIMS"
"""Switch read by ``sitecustomize.py``; no ``SGL_`` prefix because SGLang warns on those."""

_STUB_SOURCE: Path = SHIMS_DIR / "cuda_stub.c"
_STUB_NAME: str = "libcuda.so.1"


def build_cuda_stub(cache_dir: Path) -> Path:
    """Compile the stub ``libcuda.so.1`` once and return the directory for ``LD_LIBRARY_PATH``.

    The output folder is keyed by the source hash, so an edited stub is rebuilt, and the library
    is written under a temporary name then renamed, so concurrent builders never see half a file.
    """
    source = _STUB_SOURCE.read_bytes()
    digest = hashlib.sha256(source).hexdigest()[:12]
    out_dir = Path(cache_dir) / f"cuda-stub-{digest}"
    lib = out_dir / _STUB_NAME
    if lib.is_file():
        return out_dir
    out_dir.mkdir(parents=True, exist_ok=True)
    gcc = shutil.which("gcc") or shutil.which("cc")
    if gcc is None:
        raise RuntimeError("building the stub libcuda.so.1 needs gcc (or cc) on PATH")
    fd, tmp_name = tempfile.mkstemp(prefix=".libcuda-", suffix=".so", dir=out_dir)
    os.close(fd)
    try:
        subprocess.run(
            [gcc, "-shared", "-fPIC", "-O2", "-Wl,-soname,libcuda.so.1", "-o", tmp_name, str(_STUB_SOURCE)],
            check=True,
            capture_output=True,
            text=True,
        )
        os.replace(tmp_name, lib)
    except subprocess.CalledProcessError as exc:
        raise RuntimeError(f"compiling {_STUB_SOURCE} failed:\n{exc.stderr}") from exc
    finally:
        if os.path.exists(tmp_name):
            os.unlink(tmp_name)
    return out_dir


__all__ = ["CPU_SHIMS_ENV", "SHIMS_DIR", "build_cuda_stub"]
