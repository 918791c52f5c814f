"""Media fetch and failures (issue 50 item 6): ``mm.download`` built by the hooks, the record's
``failures``, and the Prometheus sink's ``stage_failures_total`` and ``media_bytes``.

The hooks are built as SGLang gets them (``HOOKS[id].make(kind)``, wrapt's convention) around
stand-ins for SGLang's functions that call each other as the real ones do: ``_load_single_item`` ->
``get_image_bytes`` -> ``download_remote_media`` (0.5.18+), or ``get_image_bytes`` alone on a URL
(0.5.17). No SGLang, no server: ``tests/test_server_records.py`` serves a PNG over HTTP to the real one.
"""

from __future__ import annotations

import contextvars
import io
import json
from collections.abc import Callable
from types import SimpleNamespace
from typing import Any

import pytest
from PIL import Image
from prometheus_client import CollectorRegistry

from sglang_mmtrace.hooks.api import mm_processor
from sglang_mmtrace.hooks.api import mm_processor_generic as mpl
from sglang_mmtrace.join.collector import build_record
from sglang_mmtrace.join.context import ApiTrace, current_trace, from_wire, to_wire
from sglang_mmtrace.join.record import StageEvent
from sglang_mmtrace.patch import Direct
from sglang_mmtrace.sinks.prometheus import MEDIA_BYTE_BUCKETS, PrometheusSink
from sglang_mmtrace.stages import MM_DECODE, MM_DOWNLOAD, MM_LOAD, MM_RESIZE_NORMALIZE, STAGES

URL = "http://media.example.test/secret-path/cat.png?token=hunter2"
SECRETS = ("media.example.test", "secret-path", "cat.png", "hunter2")


class ConnectionError(OSError):  # noqa: A001 (named as requests' is: the class name is the label)
    """What ``requests`` raises for a refused connection (``requests.exceptions.ConnectionError``)."""


def png(width: int = 8, height: int = 6) -> bytes:
    buf = io.BytesIO()
    Image.new("RGB", (width, height), (200, 30, 40)).save(buf, "PNG")
    return buf.getvalue()


def hooked(hook_id: str, fn: Callable[..., Any], instance: Any = None) -> Callable[..., Any]:
    """``fn`` with the hook around it, called as SGLang's code calls the target."""
    wrapper = mpl.HOOKS[hook_id].make("sync")
    assert isinstance(wrapper, Direct)
    return lambda *args, **kwargs: wrapper(fn, instance, args, kwargs)


def in_trace(trace: ApiTrace, fn: Callable[[], Any]) -> Any:
    def run() -> Any:
        current_trace.set(trace)
        return fn()

    return contextvars.copy_context().run(run)


def events(trace: ApiTrace, name: str) -> list[StageEvent]:
    return [StageEvent(*e) for e in trace.events if e[0] == name]


class Sglang:
    """Stand-ins for SGLang's loaders, each calling the next through its hook (as the patched module
    globals do). ``download`` False: a 0.5.17 layout, where get_image_bytes fetches a URL itself."""

    def __init__(self, body: bytes = b"", fail: BaseException | None = None, download: bool = True) -> None:
        self.body, self.fail, self.urls = body, fail, []
        self.download = hooked("mm_processor_generic.download", self._download_remote_media) if download else None
        self.get_image_bytes = hooked("mm_processor_generic.fetch", self._get_image_bytes)
        self.load_single_item = hooked("mm_processor_generic.load_decode", self._load_single_item, instance=object)

    def _fetch(self, url: str) -> bytes:
        self.urls.append(url)
        if self.fail is not None:
            raise self.fail
        return self.body

    def _download_remote_media(self, url: str, timeout: float) -> bytes:
        return self._fetch(url)

    def _get_image_bytes(self, image_file: str) -> bytes:
        if image_file.startswith(("http://", "https://")):
            return self.download(image_file, timeout=3) if self.download else self._fetch(image_file)
        return image_file.encode()  # stands for the base64 decode

    def _load_single_item(self, data: str, modality: Any) -> Any:
        try:
            if modality.name == "IMAGE":
                raw = self.get_image_bytes(data)
                try:
                    return Image.open(io.BytesIO(raw)).convert("RGB")
                except OSError as e:
                    raise ValueError("Could not decode image") from e
            if modality.name == "VIDEO":
                return SimpleNamespace(source=self.download(data, timeout=10))
            if modality.name == "AUDIO":
                source = self.download(data, timeout=5)
                if not source.startswith(b"RIFF"):
                    raise ValueError("Could not decode audio")
                return SimpleNamespace(shape=(len(source),))
        except (ValueError, OSError) as e:  # SGLang re-wraps what its loaders raise
            raise ValueError(f"Error while loading data {data[:100]}: {e}") from e


def modality(name: str) -> SimpleNamespace:
    return SimpleNamespace(name=name)


def test_the_download_is_its_own_stage_inside_mm_load_with_its_bytes() -> None:
    body = png()
    sg = Sglang(body)
    trace = ApiTrace("r1", None, "m", 0.0)
    img = in_trace(trace, lambda: sg.load_single_item(URL, modality("IMAGE")))
    assert img.size == (8, 6) and sg.urls == [URL]
    (dl,) = events(trace, MM_DOWNLOAD)
    (load,) = events(trace, MM_LOAD)
    assert dl.attrs == {"bytes": len(body), "modality": "image"}
    assert load.attrs == {"bytes": len(body)}
    assert load.t0 <= dl.t0 <= dl.t1 <= load.t1
    assert STAGES[MM_DOWNLOAD].parent == MM_LOAD and STAGES[MM_DOWNLOAD].per_image
    assert trace.failures == []


def test_base64_input_has_no_download() -> None:
    sg = Sglang()
    trace = ApiTrace("r1", None, "m", 0.0)
    body = png()
    sg._get_image_bytes = lambda image_file: body  # noqa: SLF001 (the base64 branch)
    sg.get_image_bytes = hooked("mm_processor_generic.fetch", sg._get_image_bytes)
    in_trace(trace, lambda: sg.load_single_item("iVBORw0KGgo...", modality("IMAGE")))
    assert events(trace, MM_DOWNLOAD) == [] and len(events(trace, MM_LOAD)) == 1 and sg.urls == []


def test_without_download_remote_media_the_url_fetch_is_the_download() -> None:
    """0.5.17: get_image_bytes fetches a URL itself; its hook files mm.download for that call."""
    body = png()
    sg = Sglang(body, download=False)
    trace = ApiTrace("r1", None, "m", 0.0)
    in_trace(trace, lambda: sg.load_single_item(URL, modality("IMAGE")))
    (dl,) = events(trace, MM_DOWNLOAD)
    assert dl.attrs == {"bytes": len(body), "modality": "image"}


def test_qwen_vl_artifact_path_downloads_outside_the_generic_load() -> None:
    """Qwen-VL's artifact snapshot calls get_image_bytes outside _load_single_item: still an image."""
    body = png()
    sg = Sglang(body)
    trace = ApiTrace("r1", None, "m", 0.0)
    assert in_trace(trace, lambda: sg.get_image_bytes(URL)) == body
    (dl,) = events(trace, MM_DOWNLOAD)
    assert dl.attrs == {"bytes": len(body), "modality": "image"}
    assert getattr(mpl._tls, "media", None) is None  # noqa: SLF001 (nothing left on the thread)


@pytest.mark.parametrize(
    ("kind", "body"), [("VIDEO", b"\x00\x00\x00\x18ftypmp42" * 40), ("AUDIO", b"RIFF" + b"\0" * 96)]
)
def test_video_and_audio_downloads_carry_their_modality(kind: str, body: bytes) -> None:
    sg = Sglang(body)
    trace = ApiTrace("r1", None, "m", 0.0)
    in_trace(trace, lambda: sg.load_single_item("https://media.example.test/clip", modality(kind)))
    (dl,) = events(trace, MM_DOWNLOAD)
    assert dl.attrs == {"bytes": len(body), "modality": kind.lower()}


def test_a_failed_download_is_one_failure_with_its_own_class() -> None:
    """The download raised ConnectionError; get_image_bytes and _load_single_item re-raise it (the
    latter as ValueError): one failure, at the stage that raised, with the class it raised."""
    sg = Sglang(fail=ConnectionError("Max retries exceeded with url: " + URL))
    trace = ApiTrace("r1", None, "m", 0.0)
    with pytest.raises(ValueError):
        in_trace(trace, lambda: sg.load_single_item(URL, modality("IMAGE")))
    assert trace.failures == [{"stage": MM_DOWNLOAD, "modality": "image", "error_type": "ConnectionError"}]
    assert events(trace, MM_DOWNLOAD) == []


def test_a_failed_url_fetch_on_0_5_17_is_a_download_failure() -> None:
    sg = Sglang(fail=ConnectionError("refused"), download=False)
    trace = ApiTrace("r1", None, "m", 0.0)
    with pytest.raises(ValueError):
        in_trace(trace, lambda: sg.load_single_item(URL, modality("IMAGE")))
    assert trace.failures == [{"stage": MM_DOWNLOAD, "modality": "image", "error_type": "ConnectionError"}]


def test_an_image_that_does_not_decode_is_a_decode_failure() -> None:
    sg = Sglang(b"%PDF-1.4 not an image")
    trace = ApiTrace("r1", None, "m", 0.0)
    with pytest.raises(ValueError):
        in_trace(trace, lambda: sg.load_single_item(URL, modality("IMAGE")))
    assert len(events(trace, MM_DOWNLOAD)) == 1  # the download itself worked
    assert trace.failures == [{"stage": MM_DECODE, "modality": "image", "error_type": "ValueError"}]


def test_an_audio_clip_that_does_not_decode_is_a_decode_failure() -> None:
    sg = Sglang(b"not a wav")
    trace = ApiTrace("r1", None, "m", 0.0)
    with pytest.raises(ValueError):
        in_trace(trace, lambda: sg.load_single_item("https://media.example.test/a.wav", modality("AUDIO")))
    assert trace.failures == [{"stage": MM_DECODE, "modality": "audio", "error_type": "ValueError"}]


def test_a_failing_hf_processor_is_counted_per_modality() -> None:
    def process_mm_data(text: str, images: list, videos: list, audios: list) -> Any:
        raise RuntimeError("processor failed")

    fn = hooked("mm_processor_generic.resize_normalize", process_mm_data, instance=SimpleNamespace())
    trace = ApiTrace("r1", None, "m", 0.0)
    with pytest.raises(RuntimeError):
        in_trace(trace, lambda: fn("text", ["img"], ["vid"], []))
    assert trace.failures == [
        {"stage": MM_RESIZE_NORMALIZE, "modality": "image", "error_type": "RuntimeError"},
        {"stage": MM_RESIZE_NORMALIZE, "modality": "video", "error_type": "RuntimeError"},
    ]


def test_artifact_path_decode_failure_is_counted() -> None:
    def decode_media_snapshot(snapshot: Any) -> Any:
        raise ValueError("Could not decode image")

    wrapper = mm_processor.HOOKS["mm_processor.decode"].make("sync")
    trace = ApiTrace("r1", None, "m", 0.0)
    with pytest.raises(ValueError):
        in_trace(trace, lambda: wrapper(decode_media_snapshot, None, (SimpleNamespace(),), {}))
    assert trace.failures == [{"stage": MM_DECODE, "modality": "image", "error_type": "ValueError"}]


def test_the_record_carries_failures_and_no_url() -> None:
    ok, bad = ApiTrace("r-ok", None, "m", 0.0), ApiTrace("r-bad", None, "m", 0.0)
    in_trace(ok, lambda: Sglang(png()).load_single_item(URL, modality("IMAGE")))
    with pytest.raises(ValueError):
        in_trace(bad, lambda: Sglang(fail=ConnectionError(URL)).load_single_item(URL, modality("IMAGE")))
    bad.error_class = "ValueError"
    # as the collector gets them: shipped from the API process (failures cross with the trace)
    rec_ok, rec_bad = (build_record(from_wire(to_wire(t)), [], "0.5.23", 0.0) for t in (ok, bad))
    for rec in (rec_ok, rec_bad):
        text = json.dumps(rec)
        assert not [s for s in SECRETS if s in text], text
    assert rec_ok["failures"] == []
    assert [s["name"] for s in rec_ok["stages"] if s["name"] == MM_DOWNLOAD] == [MM_DOWNLOAD]
    assert rec_bad["failures"] == [{"stage": MM_DOWNLOAD, "modality": "image", "error_type": "ConnectionError"}]


def _record(**fields: Any) -> dict[str, Any]:
    base = {
        "rid": "r",
        "model": "m",
        "status": "ok",
        "ttft_s": None,
        "images": [],
        "cache": {"preprocess": "off", "embedding": "off", "image_prefix_hit": False},
        "stages": [],
        "failures": [],
        "prompt_tokens": 0,
    }
    return base | fields


def test_failures_are_counted_from_records_in_a_real_registry() -> None:
    reg = CollectorRegistry()
    sink = PrometheusSink(registry=reg)
    failure = {"stage": MM_DOWNLOAD, "modality": "image", "error_type": "ConnectionError"}
    sink.emit(_record(status="error", failures=[failure]))
    sink.emit(_record(status="error", failures=[failure]))
    sink.emit(_record(status="error", failures=[{**failure, "stage": MM_DECODE, "error_type": "ValueError"}]))
    sink.emit(_record(status="error", failures=[failure], warmup=True))  # warm-ups are never counted

    def count(stage: str, error_type: str) -> float | None:
        labels = {"stage": stage, "modality": "image", "error_type": error_type}
        return reg.get_sample_value("sglang_mmtrace_stage_failures_total", labels)

    assert count(MM_DOWNLOAD, "ConnectionError") == 2
    assert count(MM_DECODE, "ValueError") == 1
    text = "\n".join(str(m) for m in reg.collect())
    assert "Max retries" not in text and "example" not in text


def test_media_bytes_by_modality_from_images_and_downloads() -> None:
    reg = CollectorRegistry()
    sink = PrometheusSink(registry=reg)
    image = {"width": 8, "height": 6, "visual_tokens": 4, "bytes": 5000, "content_hash": ""}
    stages = [
        {
            "name": MM_DOWNLOAD,
            "dur_s": 0.01,
            "attrs": {"bytes": 5000, "modality": "image"},
        },  # counted once, from images
        {"name": MM_DOWNLOAD, "dur_s": 0.2, "attrs": {"bytes": 2_000_000, "modality": "video"}},
        {"name": MM_DOWNLOAD, "dur_s": 0.03, "attrs": {"bytes": 300_000, "modality": "audio"}},
    ]
    rec = _record(images=[image, {**image, "bytes": 0}], stages=stages)  # 0: not measured (InternVL)
    rec["cache"]["embedding"] = "miss"
    sink.emit(rec)

    def got(modality: str, what: str) -> float | None:
        return reg.get_sample_value(f"sglang_mmtrace_media_bytes_{what}", {"modality": modality})

    assert (got("image", "count"), got("image", "sum")) == (1, 5000)
    assert (got("video", "count"), got("video", "sum")) == (1, 2_000_000)
    assert (got("audio", "count"), got("audio", "sum")) == (1, 300_000)
    assert MEDIA_BYTE_BUCKETS[0] == 1024 and MEDIA_BYTE_BUCKETS[-1] == 256 * 1024**2
