"""Prometheus sink: the contract's ``sglang_mmtrace_*`` metrics, observed from finished records.

Records are joined in the collector process, so every metric is observed there, scheduler and
detokenizer stages included. With ``--enable-metrics`` SGLang runs prometheus_client in
multiprocess mode and serves ``/metrics``: the API process passes SGLang's
``PROMETHEUS_MULTIPROC_DIR`` to the collector, which sets it before it first imports
prometheus_client, so the metrics land in that directory and on SGLang's endpoint. Otherwise (or
with ``SGLANG_MMTRACE_EXEMPLARS=1``, which keeps them out of SGLang's ``/metrics``) the collector
serves its own registry on ``SGLANG_MMTRACE_METRICS_PORT``.

Exemplars: the TTFT and stage histograms carry the record's ``trace_id`` (the OTLP spans' trace) as
an exemplar on every observation. prometheus_client keeps the latest exemplar of each bucket, so a
slow bucket links to the latest request that was that slow. Only the collector's own registry
serves them (in OpenMetrics, when the scraper asks for it); multiprocess mode drops them
(prometheus_client issue #826).
"""

from __future__ import annotations

from collections import defaultdict
from typing import Any

from ..join.record import EmitContext, stage_totals
from ..occupancy import LABELS as WHERE
from ..occupancy import Sample, Where
from ..stages import MM_DOWNLOAD, MM_PREPROCESS_CACHE, STAGES
from . import genai

PREFIX = "sglang_mmtrace_"
STAGE_BUCKETS = (
    0.0001,
    0.00025,
    0.0005,
    0.001,
    0.0025,
    0.005,
    0.01,
    0.025,
    0.05,
    0.1,
    0.25,
    0.5,
    1.0,
    2.5,
    5.0,
    10.0,
    30.0,
)
"""One layout for every stage histogram (and TTFT), so stacked panels add up."""
VISUAL_TOKEN_BUCKETS = (16, 64, 256, 576, 1024, 2304, 4096, 8192, 16384, 65536)
MEDIA_BYTE_BUCKETS = tuple(1024 * 4**k for k in range(10))
"""1 KiB to 256 MiB, x4: a thumbnail to a long video."""
MEDIA_MODALITIES = ("image", "video", "audio")

METRICS: dict[str, tuple[str, tuple[str, ...], str]] = {
    "stage_seconds": ("histogram", ("stage", "model_name"), "Duration of each TTFT stage per request"),
    "ttft_seconds": ("histogram", ("model_name", "modality", "prefix"), "Server-side time to first token"),
    "ttft_unattributed_seconds": ("histogram", ("model_name",), "Part of TTFT no stage explains"),
    "cache_lookups_total": ("counter", ("cache", "result"), "Preprocess, embedding and image-prefix cache lookups"),
    "prefix_tokens_total": ("counter", ("kind",), "Prompt tokens served from the radix cache or computed"),
    "visual_tokens": ("histogram", ("model_name",), "Visual tokens per image"),
    "transport_bytes_total": ("counter", ("mode",), "Feature bytes handed to the scheduler"),
    "requests_total": ("counter", ("model_name", "status"), "Finished requests"),
    "unobserved_stages_total": (
        "counter",
        ("model_name", "stage"),
        "Stages a finished request should have had and the plugin did not observe (the record's unobserved)",
    ),
    "stage_failures_total": (
        "counter",
        ("stage", "modality", "error_type"),
        "Multimodal stage calls that raised (download, load, decode, HF processor), by exception class (the record's"
        " failures)",
    ),
    "media_bytes": ("histogram", ("modality",), "Encoded bytes of each media item (images; fetched video and audio)"),
    "errors_total": ("counter", ("component",), "Plugin hook or sink failures that were contained"),
    "dropped_total": ("counter", ("sink",), "Records, spans or events dropped under back-pressure"),
    "cache_used_bytes": ("gauge", ("cache", *WHERE), "Bytes held by the embedding or preprocessing cache"),
    "cache_capacity_bytes": ("gauge", ("cache", *WHERE), "The cache's capacity in bytes"),
    "cache_entries": ("gauge", ("cache", *WHERE), "Entries held by the cache"),
    "cache_evictions_total": ("counter", ("cache", *WHERE), "Entries the cache evicted to make room"),
    "cuda_ipc_pool_reserved_bytes": ("gauge", WHERE, "GPU bytes the cuda_ipc feature pool reserves"),
    "cuda_ipc_pool_used_bytes": ("gauge", WHERE, "Bytes of the cuda_ipc pool leased to features in flight"),
    "cuda_ipc_pool_fallbacks_total": ("counter", WHERE, "Features that found no room in the cuda_ipc pool"),
    "shm_segments": ("gauge", WHERE, "Shared-memory feature segments of the cpu transport in flight"),
    "shm_bytes": ("gauge", WHERE, "Bytes of the shared-memory feature segments in flight"),
    "window_active": (
        "gauge",
        ("schedule",),
        "1 while a tracing window is open, 0 between windows (SGLANG_MMTRACE_WINDOW; absent without windows): "
        "while windows run, the other metrics count only requests served in a window",
    ),
}
"""The contract's metric table (name without prefix -> type, labels, help): dashboards read it too.

The served model is ``model_name``, as SGLang's and vLLM's own metrics label it, so a query joins
them. The occupancy metrics (``cache_*``, ``cuda_ipc_pool_*``, ``shm_*``) carry where what they
measure is held (``occupancy.LABELS``: the process's role, a scheduler's ranks), names that survive a
restart."""

OCCUPANCY: dict[str, dict[str, str]] = {
    **{
        cache: {
            "used_bytes": "cache_used_bytes",
            "capacity_bytes": "cache_capacity_bytes",
            "entries": "cache_entries",
            "evictions": "cache_evictions_total",
        }
        for cache in ("embedding", "preprocess")
    },
    "cuda_ipc_pool": {
        "reserved_bytes": "cuda_ipc_pool_reserved_bytes",
        "used_bytes": "cuda_ipc_pool_used_bytes",
        "fallbacks": "cuda_ipc_pool_fallbacks_total",
    },
    "shm": {"segments": "shm_segments", "used_bytes": "shm_bytes"},
}
"""Occupancy sample (``occupancy.Sample``): part -> field -> metric. Counters get the sample's increase."""


def prefix_label(rec: dict[str, Any]) -> str:
    """hit / partial / miss: for image requests, whether the image itself came from the prefix cache."""
    cached, prompt = rec.get("cached_tokens", 0), rec.get("prompt_tokens", 0)
    if rec.get("images"):
        return "hit" if rec["cache"]["image_prefix_hit"] else ("partial" if cached > 0 else "miss")
    return "hit" if prompt and cached >= prompt - 1 else ("partial" if cached > 0 else "miss")


class PrometheusSink:
    PART = "prometheus"  # the switch part that gates this sink

    def __init__(self, registry: Any = None, port: int | None = None) -> None:
        import prometheus_client as pc

        kinds = {"histogram": pc.Histogram, "counter": pc.Counter, "gauge": pc.Gauge}
        self.m: dict[str, Any] = {}
        reg: dict[str, Any] = {"registry": registry} if registry is not None else {}
        for name, (kind, labels, doc) in METRICS.items():
            kw = dict(reg)
            if kind == "histogram":
                kw["buckets"] = {"visual_tokens": VISUAL_TOKEN_BUCKETS, "media_bytes": MEDIA_BYTE_BUCKETS}.get(
                    name, STAGE_BUCKETS
                )
            elif kind == "gauge":
                kw["multiprocess_mode"] = "mostrecent"  # only the collector sets them; no pid label added
            # prometheus_client appends _total to counters itself.
            metric_name = PREFIX + (name[: -len("_total")] if kind == "counter" else name)
            self.m[name] = kinds[kind](metric_name, doc, labels, **kw)
        labels = tuple(genai.prometheus_label(a) for a in genai.ATTRIBUTES)
        self.genai = {
            name: pc.Histogram(genai.prometheus_name(name), doc, labels, buckets=bounds, **reg)
            for name, (doc, bounds) in genai.METRICS.items()
        }
        self._health: dict[str, dict[str, float]] = {"errors": {}, "dropped": {}}
        self._occupancy_seen: dict[tuple[str, str, Where], float] = {}
        if port is not None:
            pc.start_http_server(port, addr="0.0.0.0", registry=registry or pc.REGISTRY)

    def emit(self, rec: dict[str, Any], ctx: EmitContext | None = None) -> None:
        if rec.get("warmup"):
            return  # start-up and client warm-ups (JIT, first loads) would skew every histogram
        for name, value, attrs in genai.observations(rec):
            self.genai[name].labels(*(attrs.get(a, "") for a in genai.ATTRIBUTES)).observe(value)
        m, model = self.m, rec.get("model") or ""
        m["requests_total"].labels(model, rec["status"]).inc()
        for stage in rec.get("unobserved") or ():
            m["unobserved_stages_total"].labels(model, stage).inc()
        for f in rec.get("failures") or ():
            m["stage_failures_total"].labels(f.get("stage", ""), f.get("modality", ""), f.get("error_type", "")).inc()
        ttft = rec.get("ttft_s")
        # Only the trace id: set by the OTLP sink (which runs first) or taken from the request's traceparent.
        exemplar = {"trace_id": rec["trace_id"]} if rec.get("trace_id") else None
        if ttft:
            modality = "image" if rec.get("images") else "text"
            m["ttft_seconds"].labels(model, modality, prefix_label(rec)).observe(ttft, exemplar)
            unattributed = max(0.0, ttft - rec.get("attributed_s", 0.0))
            m["ttft_unattributed_seconds"].labels(model).observe(unattributed, exemplar)
        for stage, dur in stage_totals(rec).items():
            if stage in STAGES:
                m["stage_seconds"].labels(stage, model).observe(dur, exemplar)
        for s in rec.get("stages", ()):
            if s["name"] == MM_PREPROCESS_CACHE and s["attrs"].get("result") in ("hit", "miss"):
                m["cache_lookups_total"].labels("preprocess", s["attrs"]["result"]).inc()
            elif (
                s["name"] == MM_DOWNLOAD
                and s["attrs"].get("modality") in ("video", "audio")
                and s["attrs"].get("bytes")
            ):
                # images are counted from the record's images (any source, fetched or not)
                m["media_bytes"].labels(s["attrs"]["modality"]).observe(s["attrs"]["bytes"])
        if rec.get("images"):
            if rec["cache"]["embedding"] in ("hit", "miss"):
                m["cache_lookups_total"].labels("embedding", rec["cache"]["embedding"]).inc()
            if rec["status"] == "ok" or rec.get("ttft_s"):
                m["cache_lookups_total"].labels(
                    "prefix_image", "hit" if rec["cache"]["image_prefix_hit"] else "miss"
                ).inc()
            for image in rec["images"]:
                m["visual_tokens"].labels(model).observe(image["visual_tokens"])
                if image.get("bytes"):
                    m["media_bytes"].labels("image").observe(image["bytes"])
        if rec.get("prompt_tokens"):
            cached = rec.get("cached_tokens", 0)
            m["prefix_tokens_total"].labels("cached").inc(cached)
            m["prefix_tokens_total"].labels("computed").inc(max(0, rec["prompt_tokens"] - cached))
        transport = rec.get("transport") or {}
        if transport.get("bytes") and transport.get("mode") not in (None, "none"):
            m["transport_bytes_total"].labels(transport["mode"]).inc(transport["bytes"])

    def sync_health(self, totals: dict[str, dict[str, float]]) -> None:
        """Turn cumulative per-component counts (all processes) into counter increments."""
        for kind, metric, label in (("errors", "errors_total", "component"), ("dropped", "dropped_total", "sink")):
            seen = self._health[kind]
            for key, value in totals.get(kind, {}).items():
                if delta := _advance(seen, key, value):
                    self.m[metric].labels(**{label: key}).inc(delta)

    def sync_window(self, window: tuple[str, bool] | None) -> None:
        """``(schedule, open)`` while tracing windows drive the switch, else None (the series goes)."""
        gauge = self.m["window_active"]
        gauge.clear()
        if window is not None:
            gauge.labels(window[0]).set(1 if window[1] else 0)

    def sync_occupancy(self, samples: dict[Where, Sample]) -> None:
        """Where -> the latest occupancy sample there: gauges set, cumulative counts turned into increments."""
        for where, sample in samples.items():
            for part, fields in sample.items():
                for field, value in fields.items():
                    name = OCCUPANCY.get(part, {}).get(field)
                    if name is None:
                        continue
                    labels = {
                        **dict(zip(WHERE, where, strict=True)),
                        **({"cache": part} if "cache" in METRICS[name][1] else {}),
                    }
                    metric = self.m[name].labels(**labels)
                    if METRICS[name][0] == "gauge":
                        metric.set(value)
                        continue
                    if delta := _advance(self._occupancy_seen, (name, part, where), value):
                        metric.inc(delta)


def _advance(seen: dict[Any, float], key: Any, value: float) -> float:
    """What the cumulative count ``value`` adds to the highest one seen for ``key`` (0 if nothing): the
    counter's increment. A lower reading (a process's count missing from a sum for a while) adds
    nothing, and the count's return to its old level is not counted twice."""
    delta = value - seen.get(key, 0)
    if delta <= 0:
        return 0
    seen[key] = value
    return delta


def health_totals(api: dict[str, Any], peers: dict[str, dict[str, Any]]) -> dict[str, dict[str, float]]:
    totals: dict[str, dict[str, float]] = {"errors": defaultdict(float), "dropped": defaultdict(float)}
    for source in (api, *peers.values()):
        for kind in ("errors", "dropped"):
            for key, value in (source.get(kind) or {}).items():
                totals[kind][key] += value
    return {k: dict(v) for k, v in totals.items()}
