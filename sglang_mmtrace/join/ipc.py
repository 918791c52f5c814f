"""Where the collector's ZMQ sockets live: one folder per server, removed when its processes end.

The collector binds three IPC sockets (events, control, admin), which are files. They go into one
folder, ``<tempdir>/sglang-mmtrace-<API process pid>-<random>/``, made by the process that starts the
collector, so that each server's files leave together instead of three loose files per start
piling up in the temp folder. Whoever may outlive the other removes it:

- the collector process (which binds them) when it ends normally or on SIGTERM (the API process
  stopping it, or the kernel when the API process dies, ``collector._die_with_parent``);
- the API process when it exits normally: SGLang's graceful shutdown SIGKILLs its children,
  the collector among them (``kill_process_tree``), before its own normal exit.

The API process installs no signal handler: SGLang's event loop owns its SIGTERM. A server killed
outright leaves its folder behind; the next start of a server of the same user removes the folders
(and the loose files of earlier plugin versions) whose pid is no longer alive and on whose sockets
nothing listens.
"""

from __future__ import annotations

import atexit
import os
import re
import shutil
import signal
import socket
import tempfile
from typing import Any

from .. import telemetry

PREFIX = "sglang-mmtrace-"
KINDS = ("events", "control", "admin")
LEFT_BEHIND = re.compile(PREFIX + r"(\d+)-(?:[a-z0-9_]{8}|(?:events|control|admin)-[0-9a-f]{8}\.ipc)")
"""A folder ``new_folder`` made (``mkdtemp``'s eight characters), or a loose socket file of an
earlier plugin version; group 1 is the pid of the process that made it."""


def new_folder() -> str:
    """A new folder for one collector's sockets, removed when this process exits normally.

    First removes what dead servers left (``sweep``): a start is the only moment that runs after a
    crash of the same server."""
    sweep()
    folder = tempfile.mkdtemp(prefix=f"{PREFIX}{os.getpid()}-")
    remove_at_exit(folder)
    return folder


def addresses(folder: str) -> tuple[str, str, str]:
    """The collector's ``(events, control, admin)`` addresses in ``folder``."""
    events, control, admin = ("ipc://" + os.path.join(folder, f"{kind}.ipc") for kind in KINDS)
    return events, control, admin


def remove(path: str) -> None:
    """Remove a socket folder or a loose socket file. Never raises: a failure is counted and logged
    like any contained plugin error, so cleaning up cannot hurt serving or shutting down."""
    try:
        if os.path.isdir(path) and not os.path.islink(path):
            shutil.rmtree(path)
        else:
            os.unlink(path)
    except FileNotFoundError:
        pass  # the other process, or another server's sweep, removed it first
    except Exception as exc:
        telemetry.contained("ipc", exc)


def remove_at_exit(folder: str) -> None:
    """Remove ``folder`` when this process exits normally, not when a child forked from it does
    (a forked child inherits atexit handlers, and the folder is not its to remove)."""
    owner = os.getpid()

    def at_exit() -> None:
        if os.getpid() == owner:
            remove(folder)

    atexit.register(at_exit)


def remove_on_sigterm(folder: str) -> None:
    """Remove ``folder`` on SIGTERM, then hand the signal to the handler that was there before: the
    default one ends the process by the signal, as it did without this handler. For the collector
    process only: in the API process SIGTERM belongs to SGLang's event loop."""
    previous = signal.getsignal(signal.SIGTERM)

    def on_sigterm(signum: int, frame: Any) -> None:
        remove(folder)
        if callable(previous):
            previous(signum, frame)
        elif previous != signal.SIG_IGN:
            signal.signal(signum, signal.SIG_DFL)
            signal.raise_signal(signum)

    try:
        signal.signal(signal.SIGTERM, on_sigterm)
    except Exception as exc:  # not the main thread: the folder then goes at exit or at the next start
        telemetry.contained("ipc", exc)


def sweep() -> None:
    """Remove this user's socket folders and loose socket files in the temp folder whose process is
    no longer alive and whose sockets nobody listens on: what a crashed or killed server left. A live
    server's are never touched."""
    root = tempfile.gettempdir()
    try:
        entries = list(os.scandir(root))
    except OSError as exc:
        telemetry.contained("ipc", exc)
        return
    uid = os.getuid()
    for entry in entries:
        match = LEFT_BEHIND.fullmatch(entry.name)
        if match is None or _alive(int(match[1])) or _listening(entry.path):
            continue
        try:
            if entry.stat(follow_symlinks=False).st_uid != uid:
                continue  # another user's: not ours to judge, and the sticky temp folder forbids it
        except FileNotFoundError:
            continue
        remove(entry.path)


def _listening(path: str) -> bool:
    """Whether a socket file ``path``, or one in the folder ``path``, is bound by a live process: a pid
    is only known in its own pid namespace, and a temp folder shared with another one (a container's
    sidecar) holds live servers whose pids look dead from here."""
    files = [os.path.join(path, f"{kind}.ipc") for kind in KINDS] if os.path.isdir(path) else [path]
    for name in files:
        with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as sock:
            try:
                sock.connect(name)
            except OSError:
                continue  # no such file, or nothing accepts on it any more
            return True
    return False


def _alive(pid: int) -> bool:
    """Whether a process ``pid`` exists (any user's); when in doubt, alive, so nothing live is removed."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except (PermissionError, OverflowError):
        pass  # another user's process, or a number no pid can be: kept
    return True
