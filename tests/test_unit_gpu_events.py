"""CUDA-event timing of GPU stages, on a stand-in for the CUDA runtime (no GPU, no SGLang).

Why a stand-in: CI has no GPU, so the runtime behind ``hooks.cuda_marks`` (``Runtime``: the
process's ``libcudart`` through ``ctypes.PyDLL``) is replaced by ``FakeCuda`` below. The real path
is checked on a GPU against torch's events and against the kernels Nsight Systems sees
(``tests/test_unit_nsys.py`` reads a committed profile; figures in docs/performance.md); these tests
pin the bookkeeping around the marks.

The stand-in logs every ``record`` into a list shared with the wrapped SGLang functions (so the
bracket order is visible), keeps a fake GPU clock that the wrapped functions advance (so a read
returns a known number of ms), answers reads ``"pending"`` until a test flips ``completed``, and
makes every host sync (``torch.cuda.synchronize``, ``Stream.synchronize``) raise. Plugin code runs
under ``guarded``, which would swallow that raise, so each sync is also logged in ``syncs`` and every
test asserts that list stays empty.

Hooks are built as SGLang gets them: ``HOOKS[id].make(kind)`` gives a wrapt-style wrapper
``(wrapped, instance, args, kwargs)``. Host time is a fake ``perf_counter`` that advances 10 ms a
call, so host and GPU durations differ and can be told apart.
"""

from __future__ import annotations

import asyncio
import contextvars
from collections.abc import Callable, Iterator
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
import torch

from sglang_mmtrace import config, runtime, telemetry
from sglang_mmtrace.hooks import base, cuda_marks
from sglang_mmtrace.hooks.api import mm_processor_generic as mpl
from sglang_mmtrace.hooks.scheduler import batch_result, mm_embedding, mm_embedding_legacy, model_runner, scheduler
from sglang_mmtrace.hooks.scheduler import state as ss
from sglang_mmtrace.join.collector import Collector
from sglang_mmtrace.join.context import ApiTrace, current_trace
from sglang_mmtrace.join.record import StageEvent
from sglang_mmtrace.sinks import nvtx

HOST_STEP_S = 0.010
"""Each call of the fake ``perf_counter`` advances host time by this much."""


# -- the stand-in for the CUDA runtime ---------------------------------------------------------


class HostSync(AssertionError):
    """A host sync was attempted: the plugin must never add one."""


class FakeStream:
    def __init__(self, cuda: FakeCuda, index: int) -> None:
        self.cuda = cuda
        self.index = index


class FakeEvent:
    """A created event: records a timestamp of the fake GPU clock and the stream it was recorded on."""

    def __init__(self, cuda: FakeCuda, device: int) -> None:
        self.cuda = cuda
        self.device = device
        self.name = f"ev{len(cuda.events)}"
        self.stamp_ms: float | None = None
        self.stream: Any = None
        cuda.events.append(self)


class FakeCuda:
    """``cuda_marks.Runtime``'s stand-in. A test controls availability, capture, the GPU clock, when
    the GPU has caught up, and failures of event creation and reads."""

    def __init__(self, log: list[str]) -> None:
        self.log = log
        self.available = True
        self.initialized = True
        self.capturing_now = False
        self.completed = False
        self.gpu_ms = 0.0
        self.elapsed_error = False
        self.create_fails = False
        self.device = 0
        self.events: list[FakeEvent] = []
        self.streams: dict[int, FakeStream] = {}
        self.reads = 0
        self.ready_asked = 0
        self.device_asked = 0
        self.capture_asked = 0
        self.syncs: list[str] = []
        self.host: HostClock | None = None
        """Set to ``clock`` for a GPU on the host's timeline (``_catch_up``)."""
        self.clock: HostClock | None = None
        """The fake ``perf_counter`` the hooks read (set by the fixture)."""

    def gpu_work(self, ms: float) -> None:
        """Kernels launched by a wrapped function: the GPU clock moves, the host does not wait."""
        self._catch_up()
        self.gpu_ms += ms

    def _catch_up(self) -> None:
        """With ``host`` set (a ``HostClock``), an idle GPU waits for the host: work launched, or an event
        recorded, after the GPU ran out of work starts at the host's time. Without it the two clocks are
        unrelated and only GPU durations mean something."""
        if self.host is not None:
            self.gpu_ms = max(self.gpu_ms, self.host.peek() * 1000.0)

    def sync(self, what: str) -> None:
        self.syncs.append(what)
        raise HostSync(what)

    # -- the Runtime interface
    def ready(self) -> bool | None:
        self.ready_asked += 1
        return None if not self.available else self.initialized

    def stream(self, device: int) -> FakeStream:
        return self.streams.setdefault(device, FakeStream(self, device))

    def current_device(self) -> int:
        self.device_asked += 1
        return self.device

    def capturing(self, stream: Any) -> bool:
        self.capture_asked += 1
        return self.capturing_now

    def create(self, device: int) -> FakeEvent | None:
        return None if self.create_fails else FakeEvent(self, device)

    def record(self, event: FakeEvent, stream: FakeStream) -> bool:
        self._catch_up()
        event.stamp_ms, event.stream = self.gpu_ms, stream
        self.log.append(f"record {event.name}")
        return True

    def elapsed_ms(self, start: FakeEvent, end: FakeEvent) -> float | str:
        self.reads += 1
        if self.elapsed_error:
            return "unreadable"
        if not self.completed:
            return "pending"
        return end.stamp_ms - start.stamp_ms


class HostClock:
    """The fake ``perf_counter``: each call returns the host time and advances it by ``HOST_STEP_S``."""

    def __init__(self) -> None:
        self.t = 100.0

    def __call__(self) -> float:
        t = self.t
        self.t += HOST_STEP_S
        return t

    def peek(self) -> float:
        """Now, between calls: the time the next call returns."""
        return self.t


@pytest.fixture
def log() -> list[str]:
    """Shared order log: fake events append ``record evN``, wrapped functions append their name."""
    return []


@pytest.fixture
def cuda(monkeypatch: pytest.MonkeyPatch, log: list[str]) -> Iterator[FakeCuda]:
    fake = FakeCuda(log)
    monkeypatch.setattr(cuda_marks, "_runtime", fake)
    monkeypatch.setattr(cuda_marks, "_loaded", True)
    monkeypatch.setattr(cuda_marks, "_ready", False)
    monkeypatch.setattr(cuda_marks, "_rings", {})  # each test's fake CUDA starts with no ring
    monkeypatch.setattr(cuda_marks, "_default", None)
    monkeypatch.setattr(cuda_marks, "CREATE_AHEAD", 1)  # one event per first-lap mark: the tests name them
    monkeypatch.setattr(cuda_marks, "watch", cuda_marks.CaptureWatch())  # not started: every mark asks
    tc = torch.cuda
    monkeypatch.setattr(tc, "synchronize", lambda device=None: fake.sync("torch.cuda.synchronize"))
    monkeypatch.setattr(tc.Stream, "synchronize", lambda self: fake.sync("torch.cuda.Stream.synchronize"))
    monkeypatch.setattr(tc.Event, "synchronize", lambda self: fake.sync("torch.cuda.Event.synchronize"))
    monkeypatch.setenv("SGLANG_MMTRACE_GPU_TIMING", "all")  # the API's marks too (the default: the scheduler's)
    monkeypatch.delenv("SGLANG_MMTRACE_TEST_RAISE", raising=False)
    config.reset()
    # a fake perf_counter: 10 ms a call (base.interval, the scheduler state)
    host = HostClock()
    monkeypatch.setattr(base, "now", host)
    monkeypatch.setattr(ss, "now", host)
    # the API's reference reads the host time where the call's own timestamp will (a real clock read
    # takes microseconds, not a 10 ms step): the call starts at its reference's host time
    monkeypatch.setattr(mpl, "now", host.peek)
    monkeypatch.setattr(nvtx, "domain", None)
    fake.clock = host
    errors_before = dict(telemetry.errors)
    yield fake
    config.reset()
    assert fake.syncs == [], "plugin code attempted a host sync"
    assert dict(telemetry.errors) == errors_before, "plugin code failed (contained)"


def gpu_timing(monkeypatch: pytest.MonkeyPatch, level: str) -> None:
    monkeypatch.setenv("SGLANG_MMTRACE_GPU_TIMING", level)
    config.reset()


def gpu_timing_off(monkeypatch: pytest.MonkeyPatch) -> None:
    gpu_timing(monkeypatch, "0")


# -- API process: the 0.5.17 resize and cuda_ipc hooks -------------------------------------------


def hook(hook_id: str, kind: str = "sync") -> Callable[..., Any]:
    return mpl.HOOKS[hook_id].make(kind)


RESIZE = "mm_processor_generic.resize_normalize"
IPC = "mm_processor_generic.cuda_ipc"
COMBINE = "mm_processor_generic.combine"
REQUEST = "mm_processor_generic.request"


def processor(gpu_id: int = 0) -> SimpleNamespace:
    """The ``BaseMultimodalProcessor`` instance: the hooks read only ``server_args.base_gpu_id``."""
    return SimpleNamespace(server_args=SimpleNamespace(base_gpu_id=gpu_id))


def in_trace(trace: ApiTrace | None, fn: Callable[[], Any]) -> Any:
    """Run ``fn`` in a fresh context where ``trace`` is the current request (as the TM sets it)."""

    def run() -> Any:
        current_trace.set(trace)
        return fn()

    return contextvars.copy_context().run(run)


def stages(trace: ApiTrace, name: str) -> list[StageEvent]:
    """The API trace's ``name`` events (kept as wire tuples there), as the collector will see them."""
    return [StageEvent(*e) for e in trace.events if e[0] == name]


class Wrapped:
    """A stand-in SGLang function: logs its call, launches ``gpu_ms`` of GPU work, returns or raises."""

    def __init__(self, name: str, cuda: FakeCuda, gpu_ms: float = 0.0, result: Any = None, exc: Any = None) -> None:
        self.name, self.cuda, self.gpu_ms, self.result, self.exc = name, cuda, gpu_ms, result, exc
        self.calls: list[tuple[tuple, dict]] = []

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        self.calls.append((args, kwargs))
        self.cuda.log.append(self.name)
        self.cuda.gpu_work(self.gpu_ms)
        if self.exc is not None:
            raise self.exc
        return self.result


class CudaTensor:
    """A feature tensor on the GPU, as ``_wrap_tensor_for_cuda_ipc`` sees it (``is_cuda``, ``nbytes``)."""

    is_cuda = True

    def __init__(self, nbytes: int) -> None:
        self.nbytes = nbytes


class IpcProxy:
    """What the pool path returns (``CudaIpcTensorTransportProxy``): not a ``Tensor``."""


def image_item(offsets: list[tuple[int, int]]) -> SimpleNamespace:
    return SimpleNamespace(modality=SimpleNamespace(name="IMAGE"), offsets=offsets)


def test_resize_events_bracket_the_call_once_and_the_result_passes_through(cuda: FakeCuda, log: list[str]) -> None:
    trace = ApiTrace("r1", None, "m", 0.0)
    out = object()
    fn = Wrapped("process_mm_data", cuda, gpu_ms=5.0, result=out)
    images = ["img"]
    got = in_trace(trace, lambda: hook(RESIZE)(fn, processor(gpu_id=1), ("text", images), {"extra": 1}))
    assert got is out
    assert len(fn.calls) == 1 and fn.calls[0] == (("text", images), {"extra": 1})
    assert log == ["record ev0", "process_mm_data", "record ev1"]
    ev0, ev1 = cuda.events
    # created on the processor's GPU, recorded on its current stream
    assert ev0.device == ev1.device == 1
    assert ev0.stream is cuda.streams[1] and ev1.stream is cuda.streams[1]
    assert ev1.stamp_ms - ev0.stamp_ms == 5.0


def test_resize_nvtx_range_sits_inside_the_events(
    cuda: FakeCuda, log: list[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """Enter: event, then push; exit: pop, then event (as the pre-cdbd963 ``gpu_timed`` did)."""

    class Domain:
        def push_range(self, message: str, color: int, category: int, payload: int | None) -> None:
            log.append(f"push {message} {payload == nvtx.request_key('r1')}")

        def pop_range(self) -> None:
            log.append("pop")

    monkeypatch.setattr(nvtx, "domain", Domain())
    trace = ApiTrace("r1", None, "m", 0.0)
    fn = Wrapped("process_mm_data", cuda)
    in_trace(trace, lambda: hook(RESIZE)(fn, processor(), ("text", ["img"]), {}))
    assert log == ["record ev0", "push mm.resize_normalize True", "process_mm_data", "pop", "record ev1"]


def test_resize_exception_passes_through_and_the_stage_is_still_filed(cuda: FakeCuda, log: list[str]) -> None:
    """On an exception the stage is filed as on success, when the failed request is handed over."""
    trace = ApiTrace("r1", None, "m", 0.0)
    err = ValueError("bad image")
    fn = Wrapped("process_mm_data", cuda, gpu_ms=5.0, exc=err)

    def request() -> None:
        mpl.current_mm.set(mpl._MmReq(trace))  # inside a request scope: still not deferred
        hook(RESIZE)(fn, processor(), ("text", ["a", "b"]), {})

    with pytest.raises(ValueError) as info:
        in_trace(trace, request)
    assert info.value is err
    assert len(fn.calls) == 1
    assert log == ["record ev0", "process_mm_data", "record ev1"]
    assert stages(trace, "mm.resize_normalize") == [] and cuda.reads == 0
    trace.resolve_gpu()  # the GPU still lags: host-timed
    (st,) = stages(trace, "mm.resize_normalize")
    assert st.clock == "host" and st.t1 - st.t0 == pytest.approx(HOST_STEP_S)
    assert st.attrs == {"images": 2, "gpu": "pending"}
    assert cuda.reads == 1


def run_request(
    trace: ApiTrace, cuda: FakeCuda, during: Callable[[mpl._MmReq], None], gpu_ms: float, images: int = 1
) -> Any:
    """One 0.5.17 request: ``process_mm_data_async`` -> ``process_and_combine_mm_data`` -> ``process_mm_data``.

    ``during(req)`` runs after the combine returned and before the request scope ends.
    """
    result = ([image_item([(3, 6)])], [1, 2, 3], {})
    resize = Wrapped("process_mm_data", cuda, gpu_ms=gpu_ms)

    def combine(base_output: Any) -> Any:
        cuda.log.append("combine")
        hook(RESIZE)(resize, processor(), ("text", ["img"] * images), {})
        return result

    async def process_mm_data_async(image_data: Any, text: str) -> Any:
        hook(COMBINE)(combine, processor(), (SimpleNamespace(images=[]),), {})
        during(mpl.current_mm.get())
        return result

    out = in_trace(
        trace, lambda: asyncio.run(hook(REQUEST, "async")(process_mm_data_async, processor(), (["u"], "t"), {}))
    )
    assert out is result
    trace.resolve_gpu()  # what the API's hand-over to the collector does when the request has finished
    return resize


def test_mm_expand_is_one_stage_per_request_with_the_proc_part_as_an_attribute(cuda: FakeCuda) -> None:
    """0.5.17 expands in two parts (offsets + split on PROC, padded ids + M-RoPE on EL, the cuda_ipc
    copies between them): one ``mm.expand`` per request, so metrics count each request once."""
    trace = ApiTrace("r1", None, "m", 0.0)
    tail_start: list[float] = []

    def during(req: mpl._MmReq) -> None:
        assert req.split is not None and stages(trace, "mm.expand") == []  # filed at the request's end
        req.t_combined = base.now()  # process_and_combine_mm_data_async returned on the EL
        tail_start.append(req.t_combined)
        cuda.completed = True

    run_request(trace, cuda, during, gpu_ms=1.0)
    (st,) = stages(trace, "mm.expand")
    assert st.attrs["images"] == 1 and st.attrs["visual_tokens"] == 4
    assert st.t0 == tail_start[0] and st.t1 > st.t0  # the EL tail is the interval
    assert st.attrs["split_s"] >= 0 and "part" not in st.attrs


def test_a_zero_byte_handoff_after_the_cuda_ipc_copies_is_not_a_second_transport_stage() -> None:
    """0.5.17 with cuda_ipc: ``wrap_shm_features`` still runs in dispatch but moves nothing."""
    from sglang_mmtrace.hooks.api import transport
    from sglang_mmtrace.join.context import LIVE

    trace = ApiTrace("r1", None, "m", 0.0)
    trace.add("transport.prepare", 1.0, 1.2, {"mode": "cuda_ipc", "bytes": 4096, "tensors": 1})
    trace.transport_mode, trace.transport_bytes = "cuda_ipc", 4096
    obj = SimpleNamespace(rid="r1", mm_inputs={"mm_items": [SimpleNamespace(feature=IpcProxy())]})
    LIVE["r1"] = trace
    try:
        out = transport.HOOKS["transport.wrap_shm_features"].make("sync")(lambda o: o, None, (obj,), {})
    finally:
        LIVE.pop("r1", None)
    assert out is obj
    (st,) = stages(trace, "transport.prepare")
    assert st.attrs["bytes"] == 4096 and trace.transport_bytes == 4096 and trace.transport_mode == "cuda_ipc"


def test_resize_is_deferred_to_the_request_end_and_timed_by_cuda_events(cuda: FakeCuda) -> None:
    """GPU 250 ms vs host 10 ms: the stage lasts the events' 250 ms; nothing is read before the end."""
    trace = ApiTrace("r1", None, "m", 0.0)

    def during(req: mpl._MmReq) -> None:
        assert stages(trace, "mm.resize_normalize") == []  # not filed yet
        assert [p[0] for p in trace.gpu_pending] == ["mm.resize_normalize"]
        assert cuda.reads == 0  # not even polled
        cuda.completed = True  # later work has hidden the GPU's lag

    run_request(trace, cuda, during, gpu_ms=250.0, images=2)
    (st,) = stages(trace, "mm.resize_normalize")
    assert st.clock == "cuda"
    assert st.t1 - st.t0 == pytest.approx(0.250)
    assert st.attrs == {"images": 2, "gpu_s": 0.25, "host_s": pytest.approx(HOST_STEP_S)}
    assert cuda.reads == 1


def test_resize_gpu_shorter_than_the_host_call_keeps_the_host_interval(cuda: FakeCuda) -> None:
    """The stage never ends before the host call returned: end = max(t1, t0 + gpu_s); gpu_s is kept."""
    trace = ApiTrace("r1", None, "m", 0.0)
    run_request(trace, cuda, lambda req: setattr(cuda, "completed", True), gpu_ms=2.0)
    (st,) = stages(trace, "mm.resize_normalize")
    assert st.clock == "cuda"
    assert st.t1 - st.t0 == pytest.approx(HOST_STEP_S)
    assert st.attrs["gpu_s"] == 0.002 and st.attrs["host_s"] == pytest.approx(HOST_STEP_S)


def test_a_later_image_request_adopts_the_reference_and_marks_only_the_end(
    cuda: FakeCuda, log: list[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """Within ``REF_TTL_S`` of the device's reference, the resize's start is its host time (no mark)
    and its end mark is placed by its GPU offset from the reference; here on a GPU that idles on the
    host's timeline, so the stage ends where the GPU finished: 250 ms of work launched one (fake) host
    step after the call started."""
    monkeypatch.setattr(cuda_marks, "REF_TTL_S", 60.0)  # the fake host clock steps 10 ms a call
    cuda.host = cuda.clock
    first, second = ApiTrace("r1", None, "m", 0.0), ApiTrace("r2", None, "m", 0.0)
    run_request(first, cuda, lambda req: None, gpu_ms=1.0)
    assert log.count("record ev0") == 1 and records(log) == 2  # its reference, its end
    cuda.completed = False
    log.clear()
    run_request(second, cuda, lambda req: setattr(cuda, "completed", True), gpu_ms=250.0)
    assert log == ["combine", "process_mm_data", "record ev2"]
    (st,) = stages(second, "mm.resize_normalize")
    assert st.clock == "cuda"
    assert st.t1 - st.t0 == pytest.approx(HOST_STEP_S + 0.250)
    assert st.attrs["gpu_s"] == pytest.approx(HOST_STEP_S + 0.250)


def test_unfinished_events_are_never_waited_for_and_fall_back_to_host(cuda: FakeCuda) -> None:
    """The GPU not there yet at the request end: host-timed, ``gpu: pending``; one read, no sync."""
    trace = ApiTrace("r1", None, "m", 0.0)
    run_request(trace, cuda, lambda req: None, gpu_ms=250.0)
    (st,) = stages(trace, "mm.resize_normalize")
    assert st.clock == "host"
    assert st.t1 - st.t0 == pytest.approx(HOST_STEP_S)
    assert st.attrs == {"images": 1, "gpu": "pending"}
    assert cuda.reads == 1


def test_unreadable_events_fall_back_to_host(cuda: FakeCuda) -> None:
    trace = ApiTrace("r1", None, "m", 0.0)
    cuda.completed = True
    cuda.elapsed_error = True  # e.g. events on different devices
    run_request(trace, cuda, lambda req: None, gpu_ms=250.0)
    (st,) = stages(trace, "mm.resize_normalize")
    assert st.clock == "host" and st.attrs == {"images": 1, "gpu": "unreadable"}


def test_resize_outside_a_request_scope_is_filed_on_the_tms_trace(cuda: FakeCuda) -> None:
    """No ``process_mm_data_async`` scope (only the TM's trace): read when that trace is handed over."""
    trace = ApiTrace("r1", None, "m", 0.0)
    fn = Wrapped("process_mm_data", cuda, gpu_ms=40.0)
    fn.result = "out"
    cuda.completed = True
    in_trace(trace, lambda: hook(RESIZE)(fn, processor(), ("text", ["img"]), {}))
    assert cuda.reads == 0
    trace.resolve_gpu()
    (st,) = stages(trace, "mm.resize_normalize")
    assert st.clock == "cuda" and st.t1 - st.t0 == pytest.approx(0.040)


@pytest.mark.parametrize("why", ["gpu_timing_off", "default_level", "capturing", "not_initialized", "not_available"])
def test_no_events_means_a_host_timed_stage(
    why: str, cuda: FakeCuda, log: list[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """``default_level``: ``SGLANG_MMTRACE_GPU_TIMING=1`` (unset) marks the scheduler's GPU stages, not the API's."""
    if why in ("gpu_timing_off", "default_level"):
        gpu_timing(monkeypatch, "0" if why == "gpu_timing_off" else "1")
    cuda.capturing_now = why == "capturing"
    cuda.initialized = why != "not_initialized"
    cuda.available = why != "not_available"
    cuda.completed = True
    trace = ApiTrace("r1", None, "m", 0.0)
    out = object()
    fn = Wrapped("process_mm_data", cuda, gpu_ms=250.0, result=out)
    assert in_trace(trace, lambda: hook(RESIZE)(fn, processor(), ("text", ["img"]), {})) is out
    assert len(fn.calls) == 1
    assert cuda.events == [] and log == ["process_mm_data"]
    (st,) = stages(trace, "mm.resize_normalize")
    assert st.clock == "host" and st.attrs == {"images": 1}
    assert st.t1 - st.t0 == pytest.approx(HOST_STEP_S)


def test_no_trace_means_no_events_and_no_stage(cuda: FakeCuda, log: list[str]) -> None:
    out = object()
    fn = Wrapped("process_mm_data", cuda, result=out)
    assert in_trace(None, lambda: hook(RESIZE)(fn, processor(), ("text", ["img"]), {})) is out
    assert cuda.events == [] and log == ["process_mm_data"]


def run_combine(trace: ApiTrace, cuda: FakeCuda, calls: list[tuple[Any, Wrapped]]) -> Any:
    """``process_and_combine_mm_data`` wrapping ``_wrap_tensor_for_cuda_ipc`` for each ``(tensor, fn)``."""
    result = ([], [1, 2], {})

    def combine(base_output: Any) -> Any:
        for tensor, fn in calls:
            assert hook(IPC)(fn, processor(), (tensor,), {}) is fn.result
        return result

    assert in_trace(trace, lambda: hook(COMBINE)(combine, processor(), (SimpleNamespace(images=[]),), {})) is result


def test_cuda_ipc_leaves_cpu_tensors_untouched(cuda: FakeCuda, log: list[str]) -> None:
    trace = ApiTrace("r1", None, "m", 0.0)
    tensor = torch.arange(6, dtype=torch.float32)
    fn = Wrapped("_wrap_tensor_for_cuda_ipc", cuda, result=tensor)  # 0.5.17 returns CPU tensors as is
    run_combine(trace, cuda, [(tensor, fn)])
    assert fn.calls[0][0][0] is tensor
    assert torch.equal(tensor, torch.arange(6, dtype=torch.float32))
    assert cuda.events == [] and log == ["_wrap_tensor_for_cuda_ipc"]
    assert stages(trace, "transport.prepare") == []
    assert trace.transport_bytes == 0 and trace.transport_mode is None


@pytest.mark.parametrize(
    ("fallback", "mode"), [(False, "cuda_ipc"), (True, "cuda_ipc+cpu_fallback")], ids=["pool", "pool_full"]
)
def test_cuda_ipc_outcome_bytes_and_gpu_span(fallback: bool, mode: str, cuda: FakeCuda, log: list[str]) -> None:
    """Two GPU features: one stage from the first tensor's start (its mark, the device's reference) to
    the last tensor's end mark; the second tensor's start adopts the reference (no mark).

    A full pool makes SGLang return ``tensor.cpu()`` (a ``Tensor``): that is the ``cpu_fallback`` outcome.
    """
    trace = ApiTrace("r1", None, "m", 0.0)
    cuda.completed = True
    a, b = CudaTensor(4096), CudaTensor(1000)
    fa = Wrapped("ipc a", cuda, gpu_ms=100.0, result=IpcProxy())
    fb = Wrapped("ipc b", cuda, gpu_ms=100.0, result=torch.zeros(2) if fallback else IpcProxy())
    run_combine(trace, cuda, [(a, fa), (b, fb)])
    assert log == ["record ev0", "ipc a", "record ev1", "ipc b", "record ev2"]
    assert fa.calls[0][0][0] is a and fb.calls[0][0][0] is b
    trace.resolve_gpu()
    (st,) = stages(trace, "transport.prepare")
    assert st.attrs["mode"] == mode and st.attrs["bytes"] == 5096 and st.attrs["tensors"] == 2
    assert st.clock == "cuda"
    assert st.attrs["gpu_s"] == 0.2  # ev0 -> ev2 on the GPU clock
    assert st.t1 - st.t0 == pytest.approx(0.200)  # three host ticks (30 ms) are shorter
    assert trace.transport_bytes == 5096 and trace.transport_mode == "cuda_ipc"


def test_cuda_ipc_without_gpu_timing_still_files_outcome_and_bytes(
    cuda: FakeCuda, log: list[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    gpu_timing_off(monkeypatch)
    trace = ApiTrace("r1", None, "m", 0.0)
    fn = Wrapped("ipc", cuda, gpu_ms=100.0, result=torch.zeros(1))
    run_combine(trace, cuda, [(CudaTensor(64), fn)])
    assert cuda.events == [] and log == ["ipc"]
    (st,) = stages(trace, "transport.prepare")
    assert st.clock == "host" and st.t1 - st.t0 == pytest.approx(HOST_STEP_S)
    assert st.attrs == {"mode": "cuda_ipc+cpu_fallback", "bytes": 64, "tensors": 1}


def test_cuda_ipc_exception_passes_through_and_files_nothing(cuda: FakeCuda) -> None:
    trace = ApiTrace("r1", None, "m", 0.0)
    err = MemoryError("pool")
    fn = Wrapped("ipc", cuda, exc=err)

    def combine(base_output: Any) -> Any:
        with pytest.raises(MemoryError) as info:
            hook(IPC)(fn, processor(), (CudaTensor(64),), {})
        assert info.value is err
        return ([], [], {})

    in_trace(trace, lambda: hook(COMBINE)(combine, processor(), (None,), {}))
    assert len(fn.calls) == 1
    assert stages(trace, "transport.prepare") == [] and trace.transport_bytes == 0


# -- scheduler process: model.* stages of a prefill batch ----------------------------------------


def test_clock_records_on_the_current_stream_and_maps_to_host_time(cuda: FakeCuda) -> None:
    """The first mark is the reference, taken with the host time after it; later marks are placed by
    their GPU offset from it, each read once."""
    cuda.gpu_ms = 1000.0
    cuda.device = 2
    clock = ss.Clock(0.0)
    assert clock.marks is not None and clock.name == "cuda" and cuda.events == []  # no mark until one is asked
    first = clock.mark()
    assert isinstance(first, int) and cuda.events[-1].stream is cuda.streams[2]  # the current device's stream
    assert clock.ref.seq == first and len(cuda.events) == 1
    cuda.gpu_work(7.5)
    mark = clock.mark()
    assert cuda.reads == 0  # marking reads nothing
    cuda.completed = True
    t_ref = clock.ref.t
    assert clock.host(first) == t_ref and cuda.reads == 0  # the reference needs no read
    assert clock.host(mark) == pytest.approx(t_ref + 0.0075)
    assert clock.host(mark) == pytest.approx(t_ref + 0.0075) and cuda.reads == 1  # read once
    assert clock.host(123.0) == 123.0  # host marks pass as they are


@pytest.mark.parametrize("level", ["1", "all"])
def test_the_scheduler_marks_at_every_level_but_0(level: str, cuda: FakeCuda, monkeypatch: pytest.MonkeyPatch) -> None:
    gpu_timing(monkeypatch, level)
    clock = ss.Clock(0.0)
    assert clock.marks is not None and isinstance(clock.mark(), int) and len(cuda.events) == 1


def test_clock_mark_on_shares_the_last_mark_until_the_forward_returns(cuda: FakeCuda) -> None:
    clock = ss.Clock(0.0)
    a = clock.mark()
    b = clock.mark()
    n = len(cuda.log)
    assert clock.mark_on(b) is b and len(cuda.log) == n  # nothing marked since b: no CUDA call
    c = clock.mark_on(a)  # a is not the last mark any more
    assert c not in (a, b) and len(cuda.log) == n + 1
    clock.last = None  # run_batch returned (scheduler.py): a delayed sampling marks anew
    assert clock.mark_on(c) not in (a, b, c)
    assert clock.mark_on(None) is clock.last


def test_clock_under_graph_capture_marks_host_time(cuda: FakeCuda) -> None:
    clock = ss.Clock(0.0)
    cuda.capturing_now = True
    n = len(cuda.events)
    mark = clock.mark()
    assert isinstance(mark, float) and len(cuda.events) == n


@pytest.mark.parametrize("why", ["gpu_timing_off", "not_initialized", "not_available"])
def test_clock_without_cuda_is_host(why: str, cuda: FakeCuda, monkeypatch: pytest.MonkeyPatch) -> None:
    if why == "gpu_timing_off":
        gpu_timing_off(monkeypatch)
    cuda.initialized = why != "not_initialized"
    cuda.available = why != "not_available"
    clock = ss.Clock(0.0)
    assert clock.marks is None and clock.name == "host"
    assert isinstance(clock.mark(), float) and cuda.events == []


def test_a_forward_adopts_a_recent_reference_and_starts_on_host_time(cuda: FakeCuda) -> None:
    """Within ``REF_TTL_S`` of a reference, a forward's start is the host time at its launch (no mark),
    and its marks are placed by their GPU offset from the earlier forward's reference."""
    cuda.host = cuda.clock  # a GPU on the host's timeline: it idles until work is launched
    first = ss.Clock(cuda.clock.peek())
    a = first.start()
    assert (
        isinstance(a, int) and first.ref is first.marks.ref and first.marks.ref.seq == a
    )  # its first mark: the reference
    assert first.marks.ref.t == cuda.events[-1].stamp_ms / 1000  # read right after the mark, on an idle GPU
    cuda.gpu_work(3.0)
    first.mark()
    n = len(cuda.events)

    cuda.clock.t += 0.2  # the scheduler idles
    second = ss.Clock(cuda.clock.peek())
    assert second.ref is first.marks.ref and second.name == "cuda"
    start = second.start()
    assert isinstance(start, float) and len(cuda.events) == n and second.t_start == start  # no CUDA call
    cuda.gpu_work(3.0)
    end = second.mark()
    assert second.first == end and first.marks.ref.seq == a  # the reference stays the first forward's
    cuda.completed = True
    assert second.host(start) == start
    # the GPU ran the forward from its launch (the fake host clock steps 10 ms past the launch's read)
    assert second.host(end) == pytest.approx(start + HOST_STEP_S + 0.003)
    assert first.marks.ref.t == cuda.events[0].stamp_ms / 1000  # nothing to correct


def test_an_adopted_reference_found_early_moves_later(cuda: FakeCuda) -> None:
    """A reference recorded behind queued GPU work places a later forward's first mark before that
    forward was launched: the reference moves later by the difference (the least it can be late by),
    for this forward and the next."""
    cuda.host = cuda.clock
    cuda.gpu_work(40.0)  # queued work: the reference is recorded while the GPU is 40 ms behind the host
    first = ss.Clock(cuda.clock.peek())
    first.start()
    t_ref = first.marks.ref.t
    assert cuda.events[0].stamp_ms / 1000 == pytest.approx(t_ref + 0.040)
    cuda.clock.t += 0.2
    second = ss.Clock(cuda.clock.peek())
    start = second.start()
    cuda.gpu_work(3.0)  # from the host's next step: ends 13 ms after the launch
    end = second.mark()
    cuda.completed = True
    assert second.host(end) == start  # the reference would place it 27 ms before the launch
    assert first.marks.ref.t == pytest.approx(t_ref + 0.027) and first.marks.ref.taken == t_ref

    third = ss.Clock(cuda.clock.peek())
    start = third.start()
    cuda.gpu_work(3.0)
    end = third.mark()
    assert third.host(end) == pytest.approx(start)  # 13 ms early still: no later launch shows more
    assert first.marks.ref.t == pytest.approx(t_ref + 0.027)


@pytest.mark.parametrize("why", ["expired", "lapped", "other_device", "gpu_timing_off"])
def test_a_forward_takes_its_own_reference(why: str, cuda: FakeCuda, monkeypatch: pytest.MonkeyPatch) -> None:
    """An old reference (drift), one about to be lapped in the ring, another device's, or none to be
    had (no GPU timing): the forward's first mark is its own reference, or it is host-timed."""
    monkeypatch.setattr(cuda_marks, "RING", 8)
    first = ss.Clock(100.0)
    first.start()
    t_launch = first.ref.t + 0.01
    if why == "expired":
        t_launch = first.ref.taken + cuda_marks.REF_TTL_S
    elif why == "lapped":
        for _ in range(3):
            first.mark()  # the reference is 4 marks old: half the ring
    elif why == "other_device":
        monkeypatch.setattr(cuda_marks, "_default", cuda_marks.device_marks(1))
    else:
        gpu_timing_off(monkeypatch)
    before = first.marks.ref
    second = ss.Clock(t_launch)
    assert second.ref is None
    n = len(cuda.log)
    start = second.start()
    if why == "gpu_timing_off":
        assert isinstance(start, float) and len(cuda.log) == n and first.marks.ref is before
    else:
        assert isinstance(start, int) and len(cuda.log) == n + 1
        assert second.marks.ref is second.ref is not before and second.ref.seq == start  # its device's now
        assert (second.marks is first.marks) == (why != "other_device")


def test_an_adopted_forward_under_graph_capture_is_host_timed(cuda: FakeCuda) -> None:
    first = ss.Clock(100.0)
    first.start()
    second = ss.Clock(first.ref.t + 0.01)
    assert isinstance(second.start(), float)
    cuda.capturing_now = True
    assert isinstance(second.mark(), float)
    assert second.name == "host" and second.ref is None
    assert first.marks.ref is first.ref  # still there for the next forward


@pytest.mark.parametrize("delayed", [False, True])
def test_a_text_forward_after_another_records_two_events(
    delayed: bool, cuda: FakeCuda, log: list[str], outbox: Outbox, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The second of two text forwards in a row adopts the first one's reference: its end and its
    sampling's end (and a delayed sampling's start) are its only CUDA events; its prefill starts at its
    host launch and ends at its end mark's time on the GPU."""
    monkeypatch.setattr(cuda_marks, "REF_TTL_S", 60.0)  # the fake host clock steps 10 ms a call
    cuda.host = cuda.clock
    run_text_forward(cuda, log, outbox, delayed=False, rid="A")
    log.clear()
    cuda.completed = False
    n = len(cuda.events)
    prefill, sampled = run_text_forward(cuda, log, outbox, delayed=delayed, rid="B")
    assert records(log) == (3 if delayed else 2)
    ends = cuda.events[n:] if len(cuda.events) > n else cuda.events  # CREATE_AHEAD=1: new events, no lap
    assert prefill[4] == sampled[4] == "cuda"
    assert prefill[2] < prefill[3] == pytest.approx(ends[0].stamp_ms / 1000)
    assert sampled[3] == pytest.approx(ends[-1].stamp_ms / 1000)
    assert sampled[2] == pytest.approx(ends[1].stamp_ms / 1000 if delayed else prefill[3])


def test_no_device_is_asked_once_and_not_yet_initialized_is_asked_again(cuda: FakeCuda) -> None:
    """A CUDA build of torch without a GPU (the CPU server) cannot get one later: after the first
    answer no forward asks again. CUDA not yet initialized (an API process before its first GPU
    resize) is asked again, and marks start once it is."""
    cuda.initialized = False
    assert cuda_marks.device_marks() is None and cuda_marks.device_marks() is None
    assert cuda.ready_asked == 2
    cuda.initialized = True
    assert cuda_marks.device_marks() is not None and cuda.ready_asked == 3
    assert cuda_marks.device_marks() is not None and cuda.ready_asked == 3, "ready for the process's life"
    assert cuda.device_asked == 1, "a scheduler's device is asked once"
    assert cuda_marks.device_marks(0) is cuda_marks.device_marks()


def test_no_device_is_never_asked_again(cuda: FakeCuda) -> None:
    cuda.available = False
    assert cuda_marks.device_marks() is None and cuda.ready_asked == 1
    assert cuda_marks.device_marks() is None and cuda_marks.device_marks(0) is None
    assert cuda.ready_asked == 1 and cuda_marks.runtime() is None


def test_marks_ring_reuses_its_events_and_a_lapped_mark_reads_unreadable(
    cuda: FakeCuda, monkeypatch: pytest.MonkeyPatch
) -> None:
    """No event per request: the ring's events are created once and recorded again lap after lap."""
    monkeypatch.setattr(cuda_marks, "RING", 4)
    marks = cuda_marks.Marks(cuda, 0)
    cuda.completed = True
    seqs = []
    for _ in range(6):
        cuda.gpu_work(1.0)
        seqs.append(marks.mark())
    assert seqs == [0, 1, 2, 3, 4, 5] and len(cuda.events) == 4
    assert marks.elapsed_s(seqs[3], seqs[5]) == pytest.approx(0.002)
    assert marks.elapsed_s(seqs[0], seqs[5]) == "unreadable"  # slot 0 now holds mark 4
    cuda.completed = False
    assert marks.elapsed_s(seqs[4], seqs[5]) == "pending"


def test_the_first_lap_creates_events_ahead_and_keeps_them(cuda: FakeCuda, monkeypatch: pytest.MonkeyPatch) -> None:
    """A first-lap mark creates its slot's event and the next CREATE_AHEAD - 1; later marks only record."""
    monkeypatch.setattr(cuda_marks, "RING", 6)
    monkeypatch.setattr(cuda_marks, "CREATE_AHEAD", 4)
    marks = cuda_marks.Marks(cuda, 0)
    created = []
    for _ in range(8):
        marks.mark()
        created.append(len(cuda.events))
    assert created == [4, 4, 4, 4, 6, 6, 6, 6]  # the second burst stops at the ring's end; lap 2 reuses
    assert marks.events == [e for e in cuda.events]
    cuda.create_fails = True
    fresh = cuda_marks.Marks(cuda, 0)
    assert fresh.mark() is None and fresh.events == [None] * 6
    cuda.create_fails = False
    assert fresh.mark() == 1 and fresh.events[0] is None and all(e is not None for e in fresh.events[1:5])


class FakeGraph:
    """``torch.cuda.CUDAGraph``'s capture methods as the watch finds them (CI has no GPU to capture on)."""

    def __init__(self, log: list[str], fail: bool = False) -> None:
        self.log = log
        self.fail = fail

    def capture_begin(self, pool: Any = None, capture_error_mode: str = "global") -> str:
        self.log.append(f"begin {capture_error_mode}")
        if self.fail:
            raise RuntimeError("capture failed")
        return "began"

    def capture_end(self) -> str:
        self.log.append("end")
        return "ended"


def test_marks_ask_cuda_about_capture_only_while_torch_captures(
    cuda: FakeCuda, log: list[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """The watch wraps ``CUDAGraph.capture_begin``/``capture_end`` (each called once, results and errors
    passed on): outside a capture a mark skips ``cudaStreamIsCapturing``; inside one it asks, and
    records nothing on a capturing stream. ``stop()`` puts torch's methods back."""
    from torch.cuda.graphs import CUDAGraph

    begin, end = CUDAGraph.__dict__["capture_begin"], CUDAGraph.__dict__["capture_end"]
    monkeypatch.setattr(CUDAGraph, "capture_begin", FakeGraph.capture_begin)
    monkeypatch.setattr(CUDAGraph, "capture_end", FakeGraph.capture_end)
    watch = cuda_marks.CaptureWatch()
    monkeypatch.setattr(cuda_marks, "watch", watch)
    marks = cuda_marks.Marks(cuda, 0)
    assert marks.mark() == 0 and cuda.capture_asked == 1, "not started: every mark asks"
    watch.start()
    watch.start()  # idempotent
    assert marks.mark() == 1 and cuda.capture_asked == 1, "started, nothing capturing: no CUDA call"

    graph = FakeGraph(log)
    assert CUDAGraph.capture_begin(graph, capture_error_mode="relaxed") == "began"
    cuda.capturing_now = True
    assert watch.capturing and marks.mark() is None and cuda.capture_asked == 2
    assert CUDAGraph.capture_end(graph) == "ended"
    assert not watch.capturing and marks.mark() == 2 and cuda.capture_asked == 2
    assert log[-3:] == ["begin relaxed", "end", "record ev2"]

    failing = FakeGraph(log, fail=True)
    with pytest.raises(RuntimeError, match="capture failed"):
        CUDAGraph.capture_begin(failing)
    assert not watch.capturing and log.count("begin global") == 1

    watch.stop()
    assert CUDAGraph.__dict__["capture_begin"] is FakeGraph.capture_begin
    assert CUDAGraph.__dict__["capture_end"] is FakeGraph.capture_end
    assert not watch.on and marks.mark() is None and cuda.capture_asked == 3, "stopped: every mark asks"
    assert begin is not FakeGraph.capture_begin and end is not FakeGraph.capture_end  # monkeypatch restores


def test_api_gpu_stages_are_read_when_the_request_is_handed_over(cuda: FakeCuda, tmp_path: Path) -> None:
    """The collector client resolves a finished request's GPU stages before it ships the request, on
    a real ZMQ socket; until then nothing is read (the request's path to its first token pays no read)."""
    import pickle

    import zmq

    from sglang_mmtrace.join import ipc
    from sglang_mmtrace.join.client import CollectorClient
    from sglang_mmtrace.join.context import from_wire

    addresses = ipc.addresses(str(tmp_path))
    pull = zmq.Context.instance().socket(zmq.PULL)
    pull.setsockopt(zmq.LINGER, 0)
    pull.bind(addresses[0])
    client = CollectorClient.attach(*addresses)
    try:
        trace = ApiTrace("r1", None, "m", 0.0)
        marks = cuda_marks.device_marks(0)
        assert marks is not None
        ref = marks.mark_reference(lambda: 1.0)  # read at host time 1.0
        assert ref is not None
        cuda.gpu_work(30.0)
        m1 = marks.mark()
        trace.add_gpu("mm.resize_normalize", 1.0, 1.01, {"images": 1}, ref, m1)
        reads = cuda.reads
        cuda.completed = True
        client.finish(trace)
        assert cuda.reads == reads + 1 and trace.gpu_pending == []
        assert pull.poll(5000), "nothing shipped"
        kind, _process, _pid, (wires, _health) = pickle.loads(pull.recv())
        assert kind == "api"
        (shipped,) = [from_wire(w) for w in wires]
        (st,) = [e for e in shipped.events if e.name == "mm.resize_normalize"]
        assert st.clock == "cuda" and st.attrs["gpu_s"] == pytest.approx(0.030) and st.t1 == pytest.approx(1.03)
    finally:
        client.close()
        pull.close()


def test_marks_without_an_event_or_under_capture_are_none(cuda: FakeCuda) -> None:
    marks = cuda_marks.Marks(cuda, 0)
    cuda.create_fails = True
    assert marks.mark() is None
    cuda.create_fails, cuda.capturing_now = False, True
    assert marks.mark() is None and cuda.events == []


class FakeCudart:
    """A stand-in for ``libcudart`` with ctypes-style out-parameters: what ``Runtime`` sends it."""

    def __init__(self, rc: dict[str, int]) -> None:
        self.rc = rc
        self.calls: list[str] = []
        for name in ("cudaEventCreateWithFlags", "cudaEventRecord", "cudaEventElapsedTime",
                     "cudaStreamIsCapturing", "cudaGetDevice", "cudaSetDevice", "cudaGetLastError"):  # fmt: skip
            setattr(self, name, self._fn(name))

    def _fn(self, name: str) -> Any:
        def call(*args: Any) -> int:
            self.calls.append(name)
            out = args[0] if name in ("cudaEventCreateWithFlags", "cudaEventElapsedTime", "cudaGetDevice") else None
            if name == "cudaStreamIsCapturing":
                out = args[1]
            if out is not None:
                out._obj.value = {"cudaEventCreateWithFlags": 77, "cudaEventElapsedTime": 2.5}.get(name, 0)
            return self.rc.get(name, 0)

        return call


def test_runtime_reads_and_clears_cuda_errors_it_caused() -> None:
    """A failed call leaves no last error behind (SGLang's next launch check would raise on it)."""
    lib = FakeCudart({})
    rt = cuda_marks.Runtime(lib)
    assert rt.create(0) == 77 and not rt.capturing(1) and rt.record(77, 1)
    assert rt.elapsed_ms(77, 78) == 2.5 and "cudaGetLastError" not in lib.calls
    lib.rc = {"cudaEventElapsedTime": cuda_marks.NOT_READY, "cudaEventRecord": 400}
    assert rt.elapsed_ms(77, 78) == "pending" and lib.calls[-1] == "cudaGetLastError"
    assert rt.record(77, 1) is False and lib.calls[-1] == "cudaGetLastError"
    lib.rc = {"cudaEventElapsedTime": 1}
    assert rt.elapsed_ms(77, 78) == "unreadable"


def test_runtime_creates_an_event_on_the_asked_device_and_restores_the_current_one() -> None:
    lib = FakeCudart({})
    assert cuda_marks.Runtime(lib).create(3) == 77  # the fake's current device is 0
    assert lib.calls == ["cudaGetDevice", "cudaSetDevice", "cudaEventCreateWithFlags", "cudaSetDevice"]


class Outbox:
    """``runtime.outbox``: what the scheduler ships to the collector."""

    def __init__(self) -> None:
        self.sent: list[tuple[Any, str, float, float, str, dict[str, Any]]] = []

    def add(self, rids: Any, stage: str, t0: float, t1: float, clock: str = "host", attrs: Any = None) -> None:
        self.sent.append((rids, stage, t0, t1, clock, attrs or {}))

    def one(self, stage: str) -> tuple[Any, str, float, float, str, dict[str, Any]]:
        (ev,) = [e for e in self.sent if e[1] == stage]
        return ev


class Req:
    def __init__(self, rid: str, traced: bool = True) -> None:
        self.rid = rid
        self.output_ids: list[int] = []
        self.origin_input_ids = list(range(12))  # read at admission (``scheduler.run_batch``)
        if traced:
            self._mmtrace = ss.ReqTrace(1.0, 2.0, rid)

    def finished(self) -> bool:
        return False


def extend_mode() -> SimpleNamespace:
    return SimpleNamespace(is_extend=lambda: True, is_decode=lambda: False, is_target_verify=lambda: False)


def run_prefill_batch(cuda: FakeCuda, log: list[str]) -> tuple[Any, Any, list[Req]]:
    """One 0.5.17 prefill of a 3-request batch (A and B traced with one image each, C untraced).

    GPU work: 0.2 ms before the embedding, vision encoder 4 ms, rest of the embedding 1 ms, LM 3 ms,
    sampling 0.5 ms. Events are completed (SGLang's ``copy_done`` sync) before the result is processed.
    """
    reqs = [Req("A"), Req("B"), Req("C", traced=False)]
    items = [SimpleNamespace(hash=11, offsets=[(2, 9)]), SimpleNamespace(hash=22, offsets=[(2, 9)])]
    # the ScheduleBatch's per-request lists, read at the forward's launch (schedule_batch.scan_images)
    batch = SimpleNamespace(
        reqs=reqs,
        forward_mode=extend_mode(),
        multimodal_inputs=[SimpleNamespace(mm_items=[items[0]]), SimpleNamespace(mm_items=[items[1]]), None],
        prefix_lens=[0, 0, 0],
        extend_lens=[20, 20, 5],
    )
    forward_batch = SimpleNamespace(forward_mode=extend_mode())
    vit = Wrapped("get_image_feature", cuda, gpu_ms=4.0, result="features")
    sample = Wrapped("sample", cuda, gpu_ms=0.5, result="next_ids")

    def embed_mm_inputs(*args: Any) -> str:
        mm_embedding.HOOKS["mm_embedding.vision_encoder"].make("sync")(vit, None, (items,), {})
        cuda.gpu_work(1.0)
        return "embeds"

    def routine(input_ids: Any, fb: Any) -> str:
        cuda.gpu_work(0.2)
        mm_embedding_legacy.HOOKS["mm_embedding_legacy.embed"].make("sync")(embed_mm_inputs, None, (), {})
        cuda.gpu_work(3.0)
        return "logits"

    def forward(fb: Any) -> str:
        log.append("forward")
        return routine([0], fb)  # general_mm_embed_routine: no hook

    def run_batch(b: Any) -> str:
        model_runner.HOOKS["model_runner.forward"].make("sync")(forward, None, (forward_batch,), {})
        model_runner.HOOKS["model_runner.sample"].make("sync")(sample, None, ("logits", forward_batch), {})
        return "batch_result"

    out = scheduler.HOOKS["scheduler.run_batch"].make("sync")(run_batch, None, (batch,), {})
    assert out == "batch_result" and len(vit.calls) == 1 and len(sample.calls) == 1
    return out, batch, reqs


@pytest.fixture
def outbox(monkeypatch: pytest.MonkeyPatch) -> Outbox:
    box = Outbox()
    monkeypatch.setattr(runtime, "outbox", box)
    monkeypatch.setattr(ss, "current", None)
    monkeypatch.setattr(ss, "last_stream_end", 0.0)
    return box


def process_result(batch: Any, reqs: list[Req]) -> None:
    for r in reqs:
        r.output_ids = [7]
    result = object()
    calls: list[Any] = []

    def process_batch_result_prefill(b: Any, res: Any) -> Any:
        calls.append(b)
        return res

    hook_fn = batch_result.HOOKS["batch_result.prefill"].make("sync")
    assert hook_fn(process_batch_result_prefill, None, (batch, result), {}) is result
    assert calls == [batch]


def test_batch_gpu_stages_are_cuda_timed_and_reported_on_each_request(
    cuda: FakeCuda, log: list[str], outbox: Outbox
) -> None:
    _, batch, reqs = run_prefill_batch(cuda, log)
    # recorded during the forward, never read there: no read, no sync, and no event built before the hand-off
    assert cuda.reads == 0
    assert outbox.sent == []

    cuda.completed = True
    process_result(batch, reqs)
    assert cuda.reads > 0  # read after SGLang's copy_done sync
    model_forward = outbox.one("model.forward")
    assert model_forward[0] == ("A", "B") and model_forward[4] == "host" and model_forward[5] == {"batch_size": 3}

    durations = {"model.vision_encoder": 0.004, "model.embed": 0.001, "model.prefill": 0.003, "model.sample": 0.0005}
    for stage, dur in durations.items():
        evs = [e for e in outbox.sent if e[1] == stage]
        assert evs, stage
        for _, _, t0, t1, clock, attrs in evs:
            assert clock == "cuda", stage
            assert t1 - t0 == pytest.approx(dur, abs=1e-9), stage
            assert attrs["batch_size"] == 3, stage
    vit = outbox.one("model.vision_encoder")
    assert vit[0] == ("A", "B")
    assert vit[5] == {
        "batch_size": 3,
        "images": 2,
        "requests": 2,
        "modality": "image",
        "embedding_cache": "miss",
        "skipped": False,
    }
    embeds = sorted(e for e in outbox.sent if e[1] == "model.embed")
    assert [e[0] for e in embeds] == ["A", "B"] and all(e[5]["embedding_cache"] == "miss" for e in embeds)
    prefill, sample = outbox.one("model.prefill"), outbox.one("model.sample")
    assert prefill[0] == ("A", "B") and sample[0] == ("A", "B")
    # nested stages line up on the GPU timeline: embed starts where the encoder ended, prefill where embed did
    assert embeds[0][2] == pytest.approx(vit[3]) and prefill[2] == pytest.approx(embeds[0][3])
    assert sample[2] == pytest.approx(prefill[3])
    assert outbox.one("scheduler.output")[0] == ("A", "B")

    # the collector files a batch stage on every request of the batch, with the same interval
    col = Collector(config.Config(), [], "0.5.17")
    col._on_message(("ev", "scheduler", 1, outbox.sent))
    for rid in ("A", "B"):
        (ev,) = [e for e in col._remote[rid] if e.name == "model.prefill"]
        assert (ev.t0, ev.t1, ev.clock, ev.attrs) == (prefill[2], prefill[3], "cuda", {"batch_size": 3})
    assert "C" not in col._remote
    assert ss.current is None and all(r._mmtrace.fwd is None for r in reqs[:2])


def records(log: list[str]) -> int:
    return sum(1 for line in log if line.startswith("record "))


def test_a_new_image_forward_records_one_event_per_stage_boundary(
    cuda: FakeCuda, log: list[str], outbox: Outbox
) -> None:
    """Forward start (also the reference), embedding start, encoder start and end, embedding end,
    forward end (also sampling's start), sampling end: 7 CUDA events, none for the reference alone."""
    _, batch, reqs = run_prefill_batch(cuda, log)
    assert records(log) == 7 and len(cuda.events) == 7


def run_text_forward(
    cuda: FakeCuda, log: list[str], outbox: Outbox, delayed: bool, rid: str = "A"
) -> tuple[tuple[Any, ...], tuple[Any, ...]]:
    """One prefill of a request whose image is all in the radix prefix (to the model, a text request):
    the embedding call names no request, so it is not marked. ``delayed``: SGLang samples after
    ``run_batch`` returned (overlap with a grammar). GPU work: LM 3.1 ms, sampling 0.5 ms. Returns its
    ``model.prefill`` and ``model.sample`` events."""
    reqs = [Req(rid)]
    batch = SimpleNamespace(
        reqs=reqs,
        forward_mode=extend_mode(),
        multimodal_inputs=[SimpleNamespace(mm_items=[SimpleNamespace(hash=11, offsets=[(2, 9)])])],
        prefix_lens=[12],  # the image's tokens (2-9) are in the prefix
        extend_lens=[3],
    )
    forward_batch = SimpleNamespace(forward_mode=extend_mode())
    embed = Wrapped("embed_mm_inputs", cuda, gpu_ms=0.1, result="embeds")
    sample = Wrapped("sample", cuda, gpu_ms=0.5, result="next_ids")
    hooked = {k: v.make("sync") for k, v in {**model_runner.HOOKS, **mm_embedding_legacy.HOOKS}.items()}

    def routine(input_ids: Any, fb: Any) -> str:
        hooked["mm_embedding_legacy.embed"](embed, None, (), {})
        cuda.gpu_work(3.0)
        return "logits"

    def forward(fb: Any) -> str:
        return routine([0], fb)

    def run_batch(b: Any) -> str:
        hooked["model_runner.forward"](forward, None, (forward_batch,), {})
        if not delayed:
            hooked["model_runner.sample"](sample, None, ("logits", forward_batch), {})
        return "batch_result"

    scheduler.HOOKS["scheduler.run_batch"].make("sync")(run_batch, None, (batch,), {})
    if delayed:
        hooked["model_runner.sample"](sample, None, ("logits", forward_batch), {})
    assert len(embed.calls) == 1 and len(sample.calls) == 1
    cuda.completed = True
    process_result(batch, reqs)
    mine = [e for e in outbox.sent if rid in (e[0] if isinstance(e[0], tuple) else (e[0],))]
    assert [e for e in mine if e[1] == "model.embed"] == []
    (prefill,) = [e for e in mine if e[1] == "model.prefill"]
    (sampled,) = [e for e in mine if e[1] == "model.sample"]
    return prefill, sampled


def test_a_new_image_forward_after_another_records_six_events(
    cuda: FakeCuda, log: list[str], outbox: Outbox, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The next forward adopts the first one's reference: its start is a host time, so only the
    embedding's, the encoder's and the forward's boundaries and sampling's end are marked."""
    monkeypatch.setattr(cuda_marks, "REF_TTL_S", 60.0)  # the fake host clock steps 10 ms a call
    _, batch, reqs = run_prefill_batch(cuda, log)
    cuda.completed = True
    process_result(batch, reqs)
    log.clear()
    cuda.completed = False
    _, batch, reqs = run_prefill_batch(cuda, log)
    assert records(log) == 6


@pytest.mark.parametrize("delayed", [False, True])
def test_a_forward_without_images_to_embed_records_three_events(
    delayed: bool, cuda: FakeCuda, log: list[str], outbox: Outbox
) -> None:
    """The first forward (no reference to adopt): its start, its end, sampling's end. Sampling starts
    on the forward's end mark unless SGLang delays it past ``run_batch``, when it takes its own."""
    prefill, sampled = run_text_forward(cuda, log, outbox, delayed)
    assert records(log) == (4 if delayed else 3)
    assert prefill[4] == sampled[4] == "cuda"
    assert prefill[3] - prefill[2] == pytest.approx(0.0031)
    assert sampled[3] - sampled[2] == pytest.approx(0.0005)
    assert sampled[2] == pytest.approx(prefill[3])  # no GPU work between them either way


def test_batch_stages_without_gpu_timing_are_host_timed(
    cuda: FakeCuda, log: list[str], outbox: Outbox, monkeypatch: pytest.MonkeyPatch
) -> None:
    gpu_timing_off(monkeypatch)
    _, batch, reqs = run_prefill_batch(cuda, log)
    process_result(batch, reqs)
    assert cuda.events == []
    for stage in ("model.vision_encoder", "model.prefill", "model.sample"):
        rids, _, t0, t1, clock, attrs = outbox.one(stage)
        assert rids == ("A", "B") and clock == "host" and attrs["batch_size"] == 3 and t1 >= t0
