"""CUDA event marks for the GPU-timed stages, taken and read without letting go of the GIL.

Why not ``torch.cuda.Event``: torch releases the GIL around each event call (record, query,
elapsed_time). When another thread of the process wants the GIL at that moment (the API's event
loop while an executor thread resizes images; SGLang's own threads in the scheduler), the hook's
thread waits to get it back, up to the interpreter's switch interval (``sys.getswitchinterval``):
a call that costs microseconds alone can cost milliseconds then. The same CUDA call through
``ctypes.PyDLL``, which keeps the GIL, stays in microseconds while another thread wants it
(figures: docs/performance.md).

So the hooks call the process's own CUDA runtime (the ``libcudart`` that torch loaded, found in
``/proc/self/maps``) through ``ctypes.PyDLL``, on the stream torch says is current. Events sit in a
ring of ``RING`` slots per device, reused round robin and never freed: a mark is a sequence number,
and a mark whose slot a later lap has recorded again reads as ``"unreadable"``. No per-request state
holds an event, and nothing leaks. A failed call clears CUDA's last-error state (as torch does after
``cudaErrorNotReady``), so SGLang's next launch check never sees the plugin's error. Where no
shared CUDA runtime is loaded, or CUDA is not in use in the process, there are no marks and the
stages are host-timed.

Each CUDA call costs CPU time inside a serving process, several times its price in a loop (its
code is cold there), and a naive mark on the request's path makes three of them:
``cudaStreamIsCapturing``, a first-lap ``cudaEventCreate``, ``cudaEventRecord``. So a mark asks
CUDA whether its stream is capturing a graph only while torch is capturing one in this process
(``CaptureWatch``: ``torch.cuda.CUDAGraph.capture_begin``/``capture_end``, through which
``torch.cuda.graph``, ``make_graphed_callables``, SGLang's graph runners and inductor capture), the
ring's events are all created by the process's first mark (``CREATE_AHEAD``), and the callers take
as few marks as their stages need (``scheduler/state.Clock``). A stage's start is then a host time
where the device has a recent ``Reference`` (a mark whose host time is known): its end mark, placed
on the host timeline by its GPU offset from that reference, is the stage's only mark. See
docs/design/hot-path.md.
"""

from __future__ import annotations

import ctypes
import logging
from collections.abc import Callable
from typing import Any

logger = logging.getLogger("sglang_mmtrace")

RING = 4096
"""Events per device. A mark stays readable for RING later marks: the API reads its marks when the
request has finished, after ~4 marks per image request started meanwhile."""
CREATE_AHEAD = RING
"""Events created at once when a mark reaches an empty slot: the whole ring, at the process's first
mark (a scheduler's is SGLang's warm-up request at start-up; the API's, its first image processed on
the GPU, which also pays for CUDA's start in that process), so that no later request creates one."""
NOT_READY = 600  # cudaErrorNotReady


class Runtime:
    """The few CUDA runtime calls the marks need, made with the GIL held."""

    def __init__(self, lib: Any) -> None:
        c_int, vp = ctypes.c_int, ctypes.c_void_p
        for name, argtypes in (
            ("cudaEventCreateWithFlags", [ctypes.POINTER(vp), ctypes.c_uint]),
            ("cudaEventRecord", [vp, vp]),
            ("cudaEventElapsedTime", [ctypes.POINTER(ctypes.c_float), vp, vp]),
            ("cudaStreamIsCapturing", [vp, ctypes.POINTER(c_int)]),
            ("cudaGetDevice", [ctypes.POINTER(c_int)]),
            ("cudaSetDevice", [c_int]),
            ("cudaGetLastError", []),
        ):
            fn = getattr(lib, name)
            fn.argtypes, fn.restype = argtypes, c_int
        self.lib = lib
        self._record = lib.cudaEventRecord  # a mark's one CUDA call: looked up once, not per mark
        import torch  # loaded: its libcudart is this one

        self.stream: Callable[[int], int] = torch._C._cuda_getCurrentRawStream
        """The raw handle of a device's current stream, asked once per mark: torch's own binding,
        called with no frame of ours around it."""

    def _ok(self, rc: int) -> bool:
        if rc:
            self.lib.cudaGetLastError()  # leave no error behind for SGLang's launch checks
        return rc == 0

    def ready(self) -> bool | None:
        """CUDA is in use in this process (True), not yet (False), or never will be: no device (None).

        Never initializes CUDA."""
        import torch

        if not torch.cuda.is_available():
            return None
        return torch.cuda.is_initialized()

    def current_device(self) -> int:
        import torch

        return torch.cuda.current_device()

    def capturing(self, stream: int) -> bool:
        status = ctypes.c_int(0)
        return not self._ok(self.lib.cudaStreamIsCapturing(stream, ctypes.byref(status))) or status.value != 0

    def create(self, device: int) -> int | None:
        lib, prev, ev = self.lib, ctypes.c_int(-1), ctypes.c_void_p()
        if not self._ok(lib.cudaGetDevice(ctypes.byref(prev))):
            return None
        if prev.value != device and not self._ok(lib.cudaSetDevice(device)):
            return None
        try:
            return ev.value if self._ok(lib.cudaEventCreateWithFlags(ctypes.byref(ev), 0)) else None
        finally:
            if prev.value != device:
                self._ok(lib.cudaSetDevice(prev.value))

    def record(self, event: int, stream: int) -> bool:
        rc = self._record(event, stream)
        return rc == 0 or self._ok(rc)

    def elapsed_ms(self, start: int, end: int) -> float | str:
        ms = ctypes.c_float()
        rc = self.lib.cudaEventElapsedTime(ctypes.byref(ms), start, end)
        if self._ok(rc):
            return ms.value
        return "pending" if rc == NOT_READY else "unreadable"


REF_TTL_S = 0.5
"""How long a reference mark serves the marks after it (``Marks.reference``). Bounded because a
reference places marks on the host timeline by their GPU-clock offset from it, and the GPU's clock and
``perf_counter`` may drift apart; at 0.5 s, the GPU work of requests that come more often than twice a
second (and all of it under load) starts on host time, with no mark."""


class Reference:
    """A mark whose host time is known: read right after it was recorded (taken where the GPU is idle
    when the server is, at the start of a request's GPU work), moved later when a mark is found to
    have run before it was recorded (``host``). ``taken``: the host time it was recorded at, from
    which its age counts."""

    __slots__ = ("marks", "seq", "t", "taken")

    def __init__(self, marks: Marks, seq: int, t: float) -> None:
        self.marks = marks
        self.seq = seq
        self.t = self.taken = t

    def host(self, mark: int, not_before: float) -> float | str:
        """``mark`` on the host timeline (the reference's host time plus the mark's GPU offset from it),
        or why not (``Marks.elapsed_s``). ``not_before``: a host time before the mark was recorded, so
        before it ran on the GPU. Where the reference places the mark earlier, the reference was
        recorded behind queued GPU work, or the clocks drifted: it moves later by the difference, for
        this mark and every later read."""
        s = 0.0 if mark == self.seq else self.marks.elapsed_s(self.seq, mark)
        if isinstance(s, str):
            return s
        t = self.t + s
        if t < not_before:
            self.t += not_before - t
            t = not_before
        return t


class Marks:
    """One device's ring of events, and its latest reference mark."""

    def __init__(self, rt: Any, device: int) -> None:
        self.rt = rt
        self.device = device
        self.events: list[int | None] = [None] * RING
        self.seq_of = [-1] * RING
        self.taken = 0
        """Marks taken so far: the next mark's sequence number (how far a held mark is from being lapped)."""
        self.ref: Reference | None = None

    def reference(self, t: float) -> Reference | None:
        """The latest reference, if at host time ``t`` it is younger than ``REF_TTL_S`` and not about
        to be lapped in the ring; None when a new one is needed (``mark_reference``)."""
        ref = self.ref
        if ref is not None and t - ref.taken < REF_TTL_S and self.taken - ref.seq < RING // 2:
            return ref
        return None

    def mark_reference(self, clock: Callable[[], float]) -> Reference | None:
        """A new mark, made the latest reference with ``clock()`` read right after it; None if the
        mark failed."""
        m = self.mark()
        if m is None:
            return None
        ref = self.ref = Reference(self, m, clock())
        return ref

    def mark(self) -> int | None:
        """Record an event on the device's current stream now; None under graph capture or on failure."""
        rt = self.rt
        stream = rt.stream(self.device)
        if (watch.capturing or not watch.on) and rt.capturing(stream):
            return None
        seq = self.taken
        self.taken = seq + 1
        slot = seq % RING
        ev = self.events[slot]
        if ev is None and (ev := self._create(slot)) is None:
            return None
        if not rt.record(ev, stream):
            return None
        self.seq_of[slot] = seq
        return seq

    def _create(self, slot: int) -> int | None:
        """The events of ``slot`` and up to ``CREATE_AHEAD - 1`` following empty slots (the first mark
        creates the ring; a slot stays empty only after a failed create, and is tried again)."""
        events = self.events
        for i in range(slot, min(slot + CREATE_AHEAD, RING)):
            if events[i] is None:
                ev = self.rt.create(self.device)
                if ev is None:
                    break
                events[i] = ev
        return events[slot]

    def elapsed_s(self, start: int, end: int) -> float | str:
        """Seconds from mark ``start`` to mark ``end``, or why not: ``"pending"`` (the GPU has not got
        there yet: never waited for) or ``"unreadable"`` (a later lap took a slot, or CUDA said no)."""
        a, b = start % RING, end % RING
        if self.seq_of[a] != start or self.seq_of[b] != end:
            return "unreadable"
        ms = self.rt.elapsed_ms(self.events[a], self.events[b])
        return ms / 1000.0 if isinstance(ms, float) else ms


class CaptureWatch:
    """Which torch CUDA graphs of this process are capturing now, kept by wrapping
    ``torch.cuda.CUDAGraph.capture_begin``/``capture_end`` (each wrapped call made once, its result
    and exceptions passed on). While ``on`` and nothing is capturing, a mark skips
    ``cudaStreamIsCapturing``; while not ``on`` (not installed, or torch without those methods) every
    mark asks. Started with the CUDA runtime (the first GPU-timed stage, after SGLang's start-up
    captures); ``stop()`` (the plugin's ``uninstall()``) puts torch's methods back, and marks taken
    after a later ``install()`` in the same process ask CUDA every time."""

    def __init__(self) -> None:
        self.on = False
        self.graphs: set[int] = set()
        self.capturing = False
        self._saved: tuple[Any, Any, Any] | None = None

    def start(self) -> None:
        if self.on:
            return
        try:
            from torch.cuda.graphs import CUDAGraph

            begin, end = CUDAGraph.__dict__["capture_begin"], CUDAGraph.__dict__["capture_end"]
        except Exception:  # an older or newer torch: every mark asks CUDA
            return
        watch = self

        def capture_begin(graph: Any, *args: Any, **kwargs: Any) -> Any:
            watch.graphs.add(id(graph))
            watch.capturing = True
            try:
                return begin(graph, *args, **kwargs)
            except BaseException:
                watch._ended(graph)
                raise

        def capture_end(graph: Any, *args: Any, **kwargs: Any) -> Any:
            try:
                return end(graph, *args, **kwargs)
            finally:
                watch._ended(graph)

        self._saved = (CUDAGraph, begin, end)
        CUDAGraph.capture_begin, CUDAGraph.capture_end = capture_begin, capture_end  # type: ignore[method-assign]
        self.on = True

    def _ended(self, graph: Any) -> None:
        self.graphs.discard(id(graph))
        self.capturing = bool(self.graphs)

    def stop(self) -> None:
        if self._saved is not None:
            cls, begin, end = self._saved
            cls.capture_begin, cls.capture_end = begin, end
            self._saved = None
        self.on = False


watch = CaptureWatch()
_runtime: Runtime | None = None
_loaded = False
_ready = False
_rings: dict[int, Marks] = {}
_default: Marks | None = None
"""The marks of the device that was current when first asked without one (a scheduler's: it never
changes device), so a forward does not ask torch each time."""


def runtime() -> Runtime | None:
    """The process's shared CUDA runtime, loaded once (and the capture watch started); None when it has none."""
    global _runtime, _loaded
    if not _loaded:
        _loaded = True
        try:
            with open("/proc/self/maps") as maps:
                path = next((line.split()[-1] for line in maps if "/libcudart.so" in line), None)
            _runtime = Runtime(ctypes.PyDLL(path)) if path else None
        except Exception as exc:
            logger.info("sglang-mmtrace: no CUDA runtime for GPU marks (%s): GPU stages are host-timed", exc)
            _runtime = None
        if _runtime is not None:
            watch.start()
    return _runtime


def absent() -> bool:
    """Whether the runtime was looked for and none is usable: ``device_marks`` answers None for the
    process's life (no CUDA runtime, or a CUDA build of torch without a GPU)."""
    return _loaded and _runtime is None


def device_marks(device: int | None = None) -> Marks | None:
    """The marks of ``device`` (default: the current one), or None while CUDA is not in use here."""
    global _ready, _runtime, _default
    if not _ready:
        rt = runtime()
        if rt is None:
            return None
        ready = rt.ready()
        if ready is None:  # a CUDA build of torch on a machine without a GPU (the CPU server): none appears later
            _runtime = None
        if not ready:
            return None
        _ready = True  # CUDA stays initialized for the process's life
    rt = _runtime
    assert rt is not None
    if device is None:
        if _default is None:
            _default = _ring(rt, rt.current_device())
        return _default
    return _ring(rt, device)


def _ring(rt: Any, device: int) -> Marks:
    m = _rings.get(device)
    return m if m is not None else _rings.setdefault(device, Marks(rt, device))
