"""A server's processes from /proc: which is the API process, the scheduler(s), the detokenizer,
and how much CPU time each has used (utime + stime).

SGLang names its children with setproctitle (``sglang::scheduler``, ``sglang::scheduler_TP0``,
``sglang::detokenizer``); the API process is the launched one (``python -m sglang.launch_server``).
A running server is found by its listening port when its pid is not known.
"""

from __future__ import annotations

import os
from pathlib import Path

ROLES = ("api", "scheduler", "detokenizer", "collector", "other")
ACCOUNTED = ROLES[:-1]
"""The roles whose CPU time the benchmarks report (``collector``: the plugin's own process)."""


def _stat_fields(pid: int) -> list[str] | None:
    """``/proc/<pid>/stat`` fields from the state on (the command name may hold spaces)."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except (OSError, IndexError):
        return None


def cpu_seconds(pid: int) -> float | None:
    """utime + stime of ``pid`` in seconds (None once it is gone)."""
    f = _stat_fields(pid)
    if f is None:
        return None
    return (int(f[11]) + int(f[12])) / os.sysconf("SC_CLK_TCK")


def rss_mb(pid: int) -> float | None:
    f = _stat_fields(pid)
    return None if f is None else int(f[21]) * os.sysconf("SC_PAGE_SIZE") / 2**20


def children_of(pid: int) -> list[int]:
    """Every live descendant of ``pid`` (by parent pid), breadth first."""
    parent: dict[int, int] = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            f = _stat_fields(int(entry))
            if f is not None and f[0] not in ("Z", "X"):
                parent[int(entry)] = int(f[1])
    out, frontier = [], [pid]
    while frontier:
        nxt = [c for c, p in parent.items() if p in frontier]
        out += nxt
        frontier = nxt
    return out


def role(pid: int) -> str:
    """scheduler / detokenizer from the process title (cmdline, else comm), the plugin's collector from its
    command line; anything else is ``other``."""
    text = ""
    for name in ("cmdline", "comm"):
        try:
            text += Path(f"/proc/{pid}/{name}").read_bytes().replace(b"\0", b" ").decode(errors="replace").lower()
        except OSError:
            continue
    if "sglang_mmtrace.join.collector" in text:
        return "collector"
    if "sglang::detokenizer" in text or "detokenizer" in text:
        return "detokenizer"
    if "sglang::schedul" in text or "scheduler" in text:
        return "scheduler"
    return "other"


def server_processes(api_pid: int) -> dict[str, list[int]]:
    """role -> pids: the API process itself and its descendants by role."""
    out: dict[str, list[int]] = {r: [] for r in ROLES}
    out["api"].append(api_pid)
    for pid in children_of(api_pid):
        out[role(pid)].append(pid)
    return out


def _listen_inodes(port: int) -> set[str]:
    inodes = set()
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        try:
            rows = Path(table).read_text().splitlines()[1:]
        except OSError:
            continue
        for row in rows:
            cols = row.split()
            if len(cols) > 9 and cols[3] == "0A" and int(cols[1].rsplit(":", 1)[1], 16) == port:
                inodes.add(cols[9])
    return inodes


def pid_listening_on(port: int) -> int | None:
    """The process holding a listening socket on ``port`` (readable only for this user's processes)."""
    inodes = _listen_inodes(port)
    if not inodes:
        return None
    targets = {f"socket:[{i}]" for i in inodes}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            fds = os.listdir(f"/proc/{entry}/fd")
        except OSError:
            continue
        for fd in fds:
            try:
                if os.readlink(f"/proc/{entry}/fd/{fd}") in targets:
                    return int(entry)
            except OSError:
                continue
    return None


def cpu_by_role(procs: dict[str, list[int]]) -> dict[str, float]:
    """Summed CPU seconds per role (processes that are gone count 0)."""
    return {r: sum(cpu_seconds(p) or 0.0 for p in pids) for r, pids in procs.items()}
