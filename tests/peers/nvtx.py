"""Build the NVTX capture library (``nvtx_capture.c``) with gcc and read what it recorded.

The NVTX v3 headers come from the installed NVIDIA wheels (``nvidia/cu13/include/nvtx3`` next to
the CUDA torch that SGLang 0.5.23 pins, or ``nvidia/nvtx/include/nvtx3`` of ``nvidia-nvtx-cu12``);
the ``nvtx`` Python package ships none.
"""

from __future__ import annotations

import shutil
import site
import subprocess
import sys
import sysconfig
from dataclasses import dataclass
from pathlib import Path

SOURCE = Path(__file__).with_name("nvtx_capture.c")
DIR_ENV = "NVTX_CAPTURE_DIR"
INJECTION_ENV = "NVTX_INJECTION64_PATH"


def site_dirs() -> list[Path]:
    dirs = [sysconfig.get_paths()["purelib"], sysconfig.get_paths()["platlib"], *site.getsitepackages()]
    with_user = [*dirs, site.getusersitepackages(), *sys.path]
    return list(dict.fromkeys(Path(d) for d in with_user if d and Path(d).is_dir()))


def find_nvtx_include() -> Path | None:
    """The ``include`` folder holding ``nvtx3/nvToolsExt.h`` in an installed ``nvidia`` wheel."""
    for base in site_dirs():
        nvidia = base / "nvidia"
        if not nvidia.is_dir():
            continue
        for header in sorted(nvidia.glob("*/include/nvtx3/nvToolsExt.h")):
            return header.parent.parent
    return None


def build(out_dir: Path) -> Path:
    """Compile the capture library into ``out_dir``; raises with the compiler output on failure."""
    gcc = shutil.which("gcc") or shutil.which("cc")
    if gcc is None:
        raise RuntimeError("no C compiler (gcc) on PATH: needed to build the NVTX capture library")
    include = find_nvtx_include()
    if include is None:
        raise RuntimeError(
            "no nvtx3/nvToolsExt.h under site-packages/nvidia/*/include: install the CUDA torch wheel's "
            "NVIDIA dependencies (SGLang pulls them) or `pip install nvidia-nvtx-cu12`"
        )
    out_dir.mkdir(parents=True, exist_ok=True)
    lib = out_dir / "libnvtx_capture.so"
    cmd = [gcc, "-shared", "-fPIC", "-O2", "-Wall", "-DNVTX_NO_IMPL", f"-I{include}", "-o", str(lib), str(SOURCE)]
    proc = subprocess.run([*cmd, "-lpthread"], capture_output=True, text=True, timeout=120)
    if proc.returncode != 0:
        raise RuntimeError(f"building the NVTX capture library failed: {' '.join(cmd)}\n{proc.stdout}{proc.stderr}")
    return lib


@dataclass(frozen=True)
class Event:
    kind: str  # D P O B E M S C (see nvtx_capture.c)
    pid: int
    tid: int
    t_ns: int
    domain: str
    id: int
    color: str | None
    category: int  # 0: none
    payload: int | str | None  # an int64 payload, None for none, "?<type>" for another payload type
    message: str
    line_no: int  # position in its process file: the call order within each thread


def read_events(folder: Path, offsets: dict[Path, int] | None = None) -> list[Event]:
    """Every complete line of every ``nvtx-<pid>.log`` (from ``offsets[path]`` bytes on, if given)."""
    events: list[Event] = []
    for path in sorted(folder.glob("nvtx-*.log")):
        data = path.read_bytes()[(offsets or {}).get(path, 0) :]
        lines = data.decode("utf-8", errors="replace").split("\n")[:-1]  # the last piece is incomplete or ""
        for n, line in enumerate(lines):
            parts = line.split("\t", 9)
            if len(parts) != 10:
                raise AssertionError(f"{path}: malformed capture line {n}: {line!r}")
            kind, pid, tid, t_ns, domain, rid, color, category, payload, message = parts
            value = None if payload == "-" else payload if payload.startswith("?") else int(payload)
            events.append(
                Event(
                    kind,
                    int(pid),
                    int(tid),
                    int(t_ns),
                    domain,
                    int(rid),
                    None if color == "-" else color,
                    int(category),
                    value,
                    message,
                    n,
                )
            )
    return events


def file_offsets(folder: Path) -> dict[Path, int]:
    """Current size of every capture file: pass to :func:`read_events` to read only what follows."""
    return {path: path.stat().st_size for path in folder.glob("nvtx-*.log")}
