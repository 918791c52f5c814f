"""Generate the Grafana dashboard from the code: the stage catalogue and the metric table.

``python tools/generate_grafana_dashboards.py`` rewrites ``dashboards/sglang-mmtrace.json``;
``--check`` exits non-zero when the file is stale. A small generator over the catalogue (rather
than a dashboards-as-code SDK) because the stacked panels *are* the catalogue: one target per
top-level stage, in catalogue order, so the stack reads top to bottom like the request does.

Tests check that every metric a panel queries is one the plugin defines (or one of the SGLang
metrics listed in ``SGLANG_METRICS``), that every metric family the plugin exports is on a panel
(or in ``NOT_ON_A_PANEL`` with the reason), that every panel has a unit and plain descriptions, and
run every query against a real Prometheus that scraped the real CPU server
(``tests/test_server_dashboards.py``).
"""

from __future__ import annotations

import argparse
import json
import sys
import urllib.parse
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from sglang_mmtrace.sinks import genai  # noqa: E402
from sglang_mmtrace.sinks.prometheus import PREFIX  # noqa: E402
from sglang_mmtrace.stages import MM_DOWNLOAD, STAGES  # noqa: E402
from sglang_mmtrace.stages import ROOT as ROOT_STAGE  # noqa: E402

OUT = ROOT / "dashboards" / "sglang-mmtrace.json"
RANGE = "$__rate_interval"
SEL = 'model_name=~"$model", instance=~"$instance"'
"""Selector of the metrics that carry the served model: the plugin's label is SGLang's own
(``model_name``), so the same selector filters SGLang's metrics."""
SEL_INSTANCE = 'instance=~"$instance"'
"""Selector of the metrics without one (caches, transport, plugin health)."""
GENAI_SEL = f'{genai.prometheus_label("gen_ai.request.model")}=~"$model", instance=~"$instance"'
"""Selector of the GenAI server metrics: the conventions' attribute carries the same served model name."""
SUCCESS = 'error_type=""'
"""The GenAI request duration of successful requests (``error.type`` is set only on failures)."""
SGLANG_METRICS = ("num_queue_reqs", "num_running_reqs")
"""SGLang's own metrics the dashboard reads (``sglang:<name>``, checked on the demo server's ``/metrics``)."""
TRACE_SERVICE = "sglang"
"""``service.name`` of the plugin's OTLP spans where ``OTEL_SERVICE_NAME`` names none (``otlp.SERVICE_NAME``):
the default of the dashboard's ``service`` variable, which a deployment with its own service name sets."""
PROM_DS = {"type": "prometheus", "uid": "${datasource}"}
TRACES_DS = {"type": "jaeger", "uid": "${traces}"}
QUANTILES = (0.5, 0.95, 0.99)
NOT_ON_A_PANEL: dict[str, str] = {}
"""Exported metric family -> why no panel shows it. The only place a family may be left off the
dashboard (the unit test fails on any other exported family that no query reads)."""
COUNT = "short"
"""Grafana's unit for a plain count (requests, tokens, entries)."""
PER_SECOND = "ops"
"""Grafana's unit for events per second other than requests (errors, drops, evictions)."""
CACHED = 'kind="cached"'
IMAGE = 'modality="image"'
GENAI_PREFIX = "gen_ai_"


def sglang_metric(name: str) -> str:
    """A selector for SGLang's ``sglang:<name>``, whichever way the scrape spelled it.

    prometheus_client writes ``sglang:<name>`` in the text format but ``sglang_<name>`` in
    OpenMetrics, which Prometheus negotiates by default; the regex matches both.
    """
    assert name in SGLANG_METRICS, name
    return f'{{__name__=~"sglang[:_]{name}", {SEL}}}'


def top_level_stages() -> list[str]:
    """Stages directly under the root, in catalogue order: they do not nest, so their stack adds up."""
    return [s.name for s in STAGES.values() if s.parent == ROOT_STAGE]


def nested_stages() -> list[str]:
    """Stages inside a top-level one (image work inside ``tokenize``, the encoder inside ``model.forward``)."""
    return [s.name for s in STAGES.values() if s.parent not in (None, ROOT_STAGE)]


def regex(names: list[str]) -> str:
    """A PromQL regex matching exactly these stage names (dots escaped)."""
    return "|".join(n.replace(".", "\\\\.") for n in names)


def rate(metric: str, sel: str = SEL, extra: str = "") -> str:
    """``metric`` is without the plugin's prefix, or a GenAI metric's full name (``genai_metric``)."""
    labels = f"{sel}, {extra}" if extra else sel
    name = metric if metric.startswith(GENAI_PREFIX) else PREFIX + metric
    return f"rate({name}{{{labels}}}[{RANGE}])"


def genai_metric(name: str) -> str:
    """A GenAI server metric's Prometheus name (``gen_ai.server.request.duration`` -> ``gen_ai_server_...``)."""
    return genai.prometheus_name(name)


def gauge(metric: str) -> str:
    return f"{PREFIX}{metric}{{{SEL_INSTANCE}}}"


def quantile(q: float, metric: str, by: str = "", sel: str = SEL, extra: str = "") -> str:
    group = f"le, {by}" if by else "le"
    return f"histogram_quantile({q}, sum by ({group}) ({rate(metric + '_bucket', sel, extra)}))"


def mean(metric: str, by: str = "", sel: str = SEL, extra: str = "") -> str:
    """Mean per observation: rate of the sum over rate of the count."""
    agg = f"sum by ({by})" if by else "sum"
    return f"{agg} ({rate(metric + '_sum', sel, extra)}) / {agg} ({rate(metric + '_count', sel, extra)})"


def traces_link(title: str) -> dict[str, Any]:
    """A data link to Grafana Explore: traces of requests whose TTFT is at least the clicked value.

    Works without exemplars (SGLang's multiprocess ``/metrics`` cannot carry them): the link
    searches the trace backend for ``request`` spans at least as slow as the point clicked, in the
    panel's time range.
    """
    placeholders = {
        "@@MIN@@": "${__value.raw}s",
        "@@FROM@@": "${__from}",
        "@@TO@@": "${__to}",
        "@@DS@@": "${traces}",
        "@@SERVICE@@": "${service}",
    }
    pane = {
        "slow": {
            "datasource": "@@DS@@",
            "queries": [
                {
                    "refId": "A",
                    "datasource": {"type": "jaeger", "uid": "@@DS@@"},
                    "queryType": "search",
                    "service": "@@SERVICE@@",
                    "operation": ROOT_STAGE,
                    "minDuration": "@@MIN@@",
                    "limit": 20,
                }
            ],
            "range": {"from": "@@FROM@@", "to": "@@TO@@"},
        }
    }
    url = "/explore?schemaVersion=1&panes=" + urllib.parse.quote(json.dumps(pane, separators=(",", ":")), safe="")
    for key, value in placeholders.items():
        url = url.replace(urllib.parse.quote(key, safe=""), value)  # Grafana interpolates these raw
    return {"title": title, "url": url, "targetBlank": False}


class Layout:
    """Hands out panel ids and grid positions, row by row (24 columns)."""

    def __init__(self) -> None:
        self.panels: list[dict[str, Any]] = []
        self.y = 0
        self.x = 0
        self.row_h = 0

    def _next_id(self) -> int:
        return len(self.panels) + 1

    def row(self, title: str) -> None:
        self._newline()
        self.panels.append(
            {
                "id": self._next_id(),
                "type": "row",
                "title": title,
                "collapsed": False,
                "gridPos": {"x": 0, "y": self.y, "w": 24, "h": 1},
                "panels": [],
            }
        )
        self.y += 1

    def _newline(self) -> None:
        if self.x:
            self.y += self.row_h
            self.x, self.row_h = 0, 0

    def add(self, panel: dict[str, Any], w: int = 12, h: int = 8) -> None:
        if self.x + w > 24:
            self._newline()
        panel["id"] = self._next_id()
        panel["gridPos"] = {"x": self.x, "y": self.y, "w": w, "h": h}
        self.panels.append(panel)
        self.x += w
        self.row_h = max(self.row_h, h)


def panel(
    title: str,
    targets: list[tuple[str, str]],
    description: str,
    unit: str = "s",
    stack: bool = False,
    total_ref: str | None = None,
    links: list[dict[str, Any]] | None = None,
    exemplars: bool = False,
    units: dict[str, str] | None = None,
) -> dict[str, Any]:
    """A Prometheus time-series panel in ``unit``; ``stack`` stacks every target except ``total_ref``.

    ``total_ref`` is drawn as a dashed line over the others. ``units``: refId -> the unit of a target that differs from the
    panel's (a rate beside counts). ``exemplars``: the targets ask for the histogram's exemplars,
    which Grafana draws as points that open the trace (``trace_id``, through the Prometheus
    datasource's ``exemplarTraceIdDestinations``).
    """
    defaults: dict[str, Any] = {"unit": unit}
    if stack:
        defaults["custom"] = {"stacking": {"mode": "normal", "group": "A"}, "fillOpacity": 60, "lineWidth": 1}
    if links:
        defaults["links"] = links
    overrides = [
        {"matcher": {"id": "byFrameRefID", "options": ref}, "properties": [{"id": "unit", "value": u}]}
        for ref, u in (units or {}).items()
    ]
    if total_ref is not None:
        overrides.append(
            {
                "matcher": {"id": "byFrameRefID", "options": total_ref},
                "properties": [
                    {"id": "custom.stacking", "value": {"mode": "none", "group": "A"}},
                    {"id": "custom.fillOpacity", "value": 0},
                    {"id": "custom.lineStyle", "value": {"fill": "dash", "dash": [10, 10]}},
                    {"id": "custom.lineWidth", "value": 2},
                    {"id": "color", "value": {"mode": "fixed", "fixedColor": "text"}},
                ],
            }
        )
    return {
        "type": "timeseries",
        "title": title,
        "description": description,
        "datasource": PROM_DS,
        "fieldConfig": {"defaults": defaults, "overrides": overrides},
        "options": {"legend": {"displayMode": "table", "placement": "right", "calcs": ["lastNotNull", "mean"]}},
        "targets": [
            {"refId": ref_id(i), "datasource": PROM_DS, "expr": expr, "legendFormat": legend}
            | ({"exemplar": True} if exemplars else {})
            for i, (expr, legend) in enumerate(targets)
        ],
    }


def ref_id(i: int) -> str:
    """A, B, ... Z, AA, AB ...: Grafana's target ids."""
    return chr(65 + i) if i < 26 else chr(64 + i // 26) + chr(65 + i % 26)


def per_request(metric: str, extra: str = "") -> str:
    """Seconds per request: the metric's sum over the TTFT count, 0 where it never happened.

    Dividing every part by the same request count is what makes the parts add up to mean TTFT.
    """
    return f"(sum ({rate(metric + '_sum', extra=extra)}) or vector(0)) / sum ({rate('ttft_seconds_count')})"


def stage_quantile(q: float, stage: str) -> str:
    """The q-quantile of a stage's seconds per request, counting requests without it as 0 s.

    A stage that does not happen for a request is absent from its histogram; adding the requests
    without it (TTFT count minus stage count) to every cumulative bucket counts them as zeros, so
    the quantile is over the same requests as TTFT's.
    """
    extra = f'stage="{stage}"'
    buckets = f"sum by (le) ({rate('stage_seconds_bucket', extra=extra)})"
    missing = f"(sum ({rate('ttft_seconds_count')}) - sum ({rate('stage_seconds_count', extra=extra)}))"
    return f"histogram_quantile({q}, {buckets} + on () group_left () {missing}) or vector(0)"


def breakdown(title: str, how: str) -> dict[str, Any]:
    """The top-level stages (catalogue order), the unattributed rest, and TTFT as a dashed line.

    Every part is per request over the same requests (0 s where a stage did not happen). ``how`` is
    ``mean``: stacked, for means add up exactly to the TTFT mean; or a quantile such as ``0.95``:
    one line per stage, not stacked, for a percentile of parts does not add up to the percentile
    of the whole (every stage histogram has TTFT's bucket layout, so the lines are comparable).
    """
    targets: list[tuple[str, str]] = []
    for stage in top_level_stages():
        expr = per_request("stage_seconds", f'stage="{stage}"') if how == "mean" else stage_quantile(float(how), stage)
        targets.append((expr, stage))
    parts = (
        "Per-request seconds in each top-level stage, plus the part of TTFT no stage explains (0 s for a"
        " request without the stage); the dashed line is TTFT itself."
    )
    if how == "mean":
        targets.append((per_request("ttft_unattributed_seconds"), "unattributed"))
        targets.append((per_request("ttft_seconds"), "TTFT (mean)"))
        about = " Means, stacked in catalogue order: they add up exactly to the mean TTFT."
    else:
        pct = f"p{round(float(how) * 100)}"
        targets.append((quantile(float(how), "ttft_unattributed_seconds"), "unattributed"))
        targets.append((quantile(float(how), "ttft_seconds"), f"TTFT ({pct})"))
        about = (
            f" Each line is that stage's own {pct} over the same requests, not stacked: percentiles of the parts"
            f" do not add up to the {pct} of TTFT (the mean breakdown above does)."
        )
    return panel(title, targets, parts + about, stack=how == "mean", total_ref=ref_id(len(targets) - 1))


def heatmap(title: str, metric: str, description: str) -> dict[str, Any]:
    """A Grafana heatmap of a histogram in seconds: requests per bucket per interval, buckets as Prometheus
    stored them (``format: heatmap``, no re-bucketing by Grafana), with the histogram's exemplars."""
    expr = f"sum by (le) (increase({PREFIX}{metric}_bucket{{{SEL}}}[{RANGE}]))"
    return {
        "type": "heatmap",
        "title": title,
        "description": description,
        "datasource": PROM_DS,
        "fieldConfig": {"defaults": {"unit": COUNT}, "overrides": []},
        "options": {
            "calculate": False,
            "yAxis": {"unit": "s", "axisPlacement": "left"},
            "rowsFrame": {"layout": "le"},
            "cellValues": {"unit": COUNT},
            "color": {"mode": "scheme", "scheme": "Oranges", "scale": "exponential", "exponent": 0.5, "steps": 64},
            "exemplars": {"color": "rgba(255,0,255,0.7)"},
            "tooltip": {"mode": "single", "yHistogram": True},
            "legend": {"show": True},
        },
        "targets": [
            {
                "refId": "A",
                "datasource": PROM_DS,
                "expr": expr,
                "format": "heatmap",
                "legendFormat": "{{le}}",
                "exemplar": True,
            }
        ],
    }


def hit_ratio(cache: str) -> str:
    """Hits over lookups of one cache; 0 when there were lookups and no hit, no data without lookups."""
    which = f'cache="{cache}"'
    hits = "sum(" + rate("cache_lookups_total", SEL_INSTANCE, which + ', result="hit"') + ")"
    lookups = "sum(" + rate("cache_lookups_total", SEL_INSTANCE, which) + ")"
    return f"({hits} or vector(0)) / {lookups}"


def slow_traces_panel() -> dict[str, Any]:
    """A table of the slowest recent requests straight from the trace backend (click a trace id)."""
    return {
        "type": "table",
        "title": "Slow requests: traces with TTFT >= $slow (click a trace)",
        "description": "The `request` spans (each trace's TTFT: the child of its `chat <model>` root that ends at "
        "the first chunk) of service `$service` from the trace backend whose duration is at least `$slow`, "
        "newest first. Each row links to the full stage-by-stage trace.",
        "datasource": TRACES_DS,
        "targets": [
            {
                "refId": "A",
                "datasource": TRACES_DS,
                "queryType": "search",
                "service": "$service",
                "operation": ROOT_STAGE,
                "minDuration": "$slow",
                "limit": 20,
            }
        ],
        "fieldConfig": {"defaults": {}, "overrides": []},
        "options": {"showHeader": True},
    }


def dashboard() -> dict[str, Any]:
    lay = Layout()
    slow_link = [traces_link("Traces of requests at least this slow")]

    lay.row("Time to first token")
    for by, what in (("modality", "modality (image, text)"), ("prefix", "prefix-cache outcome (hit, partial, miss)")):
        lay.add(
            panel(
                f"TTFT p50 / p95 / p99 by {by}",
                [(quantile(q, "ttft_seconds", by), f"p{round(q * 100)} {{{{{by}}}}}") for q in QUANTILES],
                f"Server-side TTFT (request bytes in -> first chunk written) by {what}. "
                "Click a point to open the traces of requests at least that slow; exemplars (the latest "
                "request of each bucket, with SGLANG_MMTRACE_EXEMPLARS=1 or SGLang's metrics off) open "
                "that request's trace.",
                links=slow_link,
                exemplars=True,
            )
        )
    lay.add(
        panel(
            "Requests/s by status",
            [
                (f"sum by (status) ({rate('requests_total')})", "{{status}}"),
                # without windows the gauge is absent and tracing always on: 1
                (f"max by (schedule) ({gauge('window_active')}) or on() vector(1)", "tracing on {{schedule}}"),
            ],
            "Finished requests per second (ok, error, abort). With tracing windows (SGLANG_MMTRACE_WINDOW; "
            "the second series is 1 while tracing is on, 0 between windows), this and every other plugin panel count only "
            "the requests served in a window: a sample of the traffic (times period/window for the server's).",
            unit="reqps",
            units={"B": COUNT},
        ),
        w=8,
    )
    lay.add(
        panel(
            "Unattributed share of TTFT",
            [(f"sum ({rate('ttft_unattributed_seconds_sum')}) / sum ({rate('ttft_seconds_sum')})", "unattributed")],
            "Part of TTFT that no stage explains, over all requests: 1 - coverage. Low is good; a rise "
            "means time is going somewhere the plugin does not measure.",
            unit="percentunit",
        ),
        w=8,
    )
    lay.add(slow_traces_panel(), w=8)
    lay.add(
        heatmap(
            "TTFT heatmap",
            "ttft_seconds",
            "Requests per TTFT bucket over time (the TTFT histogram's own buckets): the whole distribution, "
            "where the percentile lines above show three points of it. A second band is a second population "
            "(image vs text, prefix hits vs misses). Exemplars (with SGLANG_MMTRACE_EXEMPLARS=1 or SGLang's "
            "metrics off) open the latest request of a bucket.",
        ),
        w=24,
    )

    lay.row("Request latency (OpenTelemetry GenAI server metrics)")
    lay.add(
        panel(
            "End-to-end latency and TTFT p50 / p95 / p99 (successful requests)",
            [
                (
                    quantile(q, genai_metric(genai.DURATION), sel=GENAI_SEL, extra=SUCCESS),
                    f"end-to-end p{round(q * 100)}",
                )
                for q in QUANTILES
            ]
            + [(quantile(q, genai_metric(genai.TTFT), sel=GENAI_SEL), f"TTFT p{round(q * 100)}") for q in QUANTILES],
            "gen_ai.server.request.duration (request bytes in -> last response byte out) and "
            "gen_ai.server.time_to_first_token of successful requests, in the GenAI conventions' buckets. "
            "The gap between the two is the decode: output length times the time per output token.",
        )
    )
    lay.add(
        panel(
            "Time per output token p50 / p95 / p99",
            [(quantile(q, genai_metric(genai.TPOT), sel=GENAI_SEL), f"p{round(q * 100)}") for q in QUANTILES],
            "gen_ai.server.time_per_output_token: (end-to-end - TTFT) / (output tokens - 1), per successful "
            "request with more than one output token. The decode speed a streaming client sees.",
        )
    )

    lay.row("Where TTFT goes (the stacked means add up to TTFT; percentiles are lines)")
    lay.add(breakdown("TTFT breakdown: mean seconds per request by stage", "mean"), w=24, h=10)
    lay.add(breakdown("TTFT breakdown: p50 per stage (lines, not additive)", "0.5"), w=12, h=10)
    lay.add(breakdown("TTFT breakdown: p95 per stage (lines, not additive)", "0.95"), w=12, h=10)
    lay.add(
        panel(
            "Nested stages (inside tokenize, dispatch, model.forward): p50",
            [(quantile(0.5, "stage_seconds", "stage", extra=f'stage=~"{regex(nested_stages())}"'), "{{stage}}")],
            "Image work inside `tokenize` (load, preprocessing cache, decode, resize/normalize, expand), the "
            "feature hand-off, and the vision encoder / embedding / prefill / sampling inside `model.forward`.",
        ),
        w=24,
    )

    lay.row("Caches, transport, visual tokens")
    lay.add(
        panel(
            "Cache hit ratios",
            [
                (hit_ratio("preprocess"), "preprocess cache"),
                (hit_ratio("embedding"), "embedding cache"),
                (hit_ratio("prefix_image"), "image prefix (radix)"),
            ],
            "Preprocessing-artifact cache, multimodal embedding cache (a hit skips the vision encoder) and "
            "image requests whose image tokens came from the radix prefix cache.",
            unit="percentunit",
        )
    )
    lay.add(
        panel(
            "Prompt tokens served from the prefix cache",
            [
                (
                    f"sum ({rate('prefix_tokens_total', SEL_INSTANCE, CACHED)}) / "
                    f"sum ({rate('prefix_tokens_total', SEL_INSTANCE)})",
                    "cached share",
                )
            ],
            "Share of prompt tokens (text and visual) that the radix cache served instead of computing.",
            unit="percentunit",
        )
    )
    lay.add(
        panel(
            "Feature transport bytes/s by mode",
            [(f"sum by (mode) ({rate('transport_bytes_total', SEL_INSTANCE)})", "{{mode}}")],
            "Image feature bytes handed from the API process to the scheduler, by hand-off mode "
            "(shared memory on CPU, CUDA IPC handles on a GPU).",
            unit="Bps",
        )
    )
    lay.add(
        panel(
            "Visual tokens per image request",
            [
                (
                    f"sum ({rate('visual_tokens_sum')}) / sum ({rate('ttft_seconds_count', extra=IMAGE)})",
                    "mean per image request",
                ),
                (quantile(0.5, "visual_tokens"), "p50 per image"),
                (quantile(0.95, "visual_tokens"), "p95 per image"),
            ],
            "Visual tokens an image turns into (after placeholder expansion): drives encoder and prefill time.",
            unit=COUNT,
        )
    )

    lay.row("Media fetch and failures")
    download = f'stage="{MM_DOWNLOAD}"'
    lay.add(
        panel(
            "Media download time (mm.download) p50 / p95 / p99",
            [(quantile(q, "stage_seconds", extra=download), f"p{round(q * 100)}") for q in QUANTILES]
            + [(f"sum ({rate('stage_seconds_count', extra=download)})", "downloads/s")],
            "SGLang's HTTP(S) download of each image, video or audio clip sent by URL, apart from base64 "
            "decoding (inside mm.load). A slow download is the network's or the media host's time, not the "
            "processor's. No data without URL inputs.",
            units={ref_id(len(QUANTILES)): PER_SECOND},
        ),
        w=8,
    )
    lay.add(
        panel(
            "Stage failures/s by stage, modality and error",
            [
                (
                    f"sum by (stage, modality, error_type) ({rate('stage_failures_total', SEL_INSTANCE)})",
                    "{{stage}} {{modality}} {{error_type}}",
                )
            ],
            "Multimodal stage calls that raised (a download that failed, an image that did not decode, the HF "
            "processor), per stage, modality and exception class (never its message). Such a request fails "
            "with an error: see Requests/s by status.",
            unit=PER_SECOND,
        ),
        w=8,
    )
    lay.add(
        panel(
            "Media bytes per item by modality: p50 / p95",
            [
                (quantile(q, "media_bytes", "modality", sel=SEL_INSTANCE), f"p{round(q * 100)} {{{{modality}}}}")
                for q in (0.5, 0.95)
            ],
            "Encoded size of each media item: every image (data URL or fetched), and video and audio clips "
            "fetched by URL (a base64 video or clip has no seam that holds its size). Bigger inputs take longer "
            "to fetch, decode and preprocess.",
            unit="bytes",
        ),
        w=8,
    )

    lay.row("Occupancy: what the caches and the feature transport hold")
    lay.add(
        panel(
            "Cache bytes used / capacity",
            [
                (
                    f"sum by (cache) ({gauge('cache_used_bytes')}) / sum by (cache) ({gauge('cache_capacity_bytes')})",
                    "{{cache}}",
                )
            ],
            "How full the multimodal embedding cache (schedulers) and the preprocessing cache (API process) "
            "are. A full cache evicts: hit ratios fall when the working set outgrows it.",
            unit="percentunit",
        )
    )
    lay.add(
        panel(
            "Cache entries and evictions/s",
            [
                (f"sum by (cache) ({gauge('cache_entries')})", "{{cache}} entries"),
                (f"sum by (cache) ({rate('cache_evictions_total', SEL_INSTANCE)})", "{{cache}} evictions/s"),
            ],
            "Entries each cache holds, and how fast it evicts them to make room.",
            unit=COUNT,
            units={"B": PER_SECOND},
        )
    )
    lay.add(
        panel(
            "Feature transport: bytes in flight",
            [
                (f"sum ({gauge('shm_bytes')})", "shared memory (cpu transport)"),
                (f"sum ({gauge('cuda_ipc_pool_used_bytes')})", "cuda_ipc pool in use"),
                (f"sum ({gauge('cuda_ipc_pool_reserved_bytes')})", "cuda_ipc pool reserved"),
            ],
            "Image features handed to the scheduler and not yet taken: shared-memory segments (cpu "
            "transport), and the slices of the GPU buffer the cuda_ipc transport reserves (GPU memory the "
            "scheduler cannot use).",
            unit="bytes",
        )
    )
    lay.add(
        panel(
            "Shared-memory segments in flight; cuda_ipc fallbacks/s",
            [
                (f"sum ({gauge('shm_segments')})", "shared-memory segments"),
                (f"sum ({rate('cuda_ipc_pool_fallbacks_total', SEL_INSTANCE)})", "cuda_ipc fallbacks/s"),
            ],
            "Segments of the cpu transport waiting for a scheduler; features that found no room in the "
            "cuda_ipc pool and went by CPU instead.",
            unit=COUNT,
            units={"B": PER_SECOND},
        )
    )

    lay.row("Queue")
    queue = 'stage="scheduler.queue"'
    lay.add(
        panel(
            "Queue time (scheduler.queue) p50 / p95 / p99",
            [(quantile(q, "stage_seconds", extra=queue), f"p{round(q * 100)}") for q in QUANTILES],
            "Time from arriving in the scheduler's waiting queue to admission into a prefill batch.",
        )
    )
    lay.add(
        panel(
            "Requests waiting and running (SGLang)",
            [
                (f"sum ({sglang_metric('num_queue_reqs')})", "waiting"),
                (f"sum ({sglang_metric('num_running_reqs')})", "running"),
            ],
            "SGLang's own gauges: requests in the waiting queue and in the running batch.",
            unit=COUNT,
        )
    )

    lay.row("Plugin health")
    lay.add(
        panel(
            "Contained plugin errors/s by component",
            [(f"sum by (component) ({rate('errors_total', SEL_INSTANCE)})", "{{component}}")],
            "Failures of plugin hooks or sinks that were contained (serving went on). Any is a bug to report.",
            unit=PER_SECOND,
        )
    )
    lay.add(
        panel(
            "Unobserved stages/s by stage",
            [(f"sum by (stage) ({rate('unobserved_stages_total')})", "{{stage}}")],
            "Stages a finished request should have had (its images, its encoder) that the plugin did not see:"
            " the model takes a path no hook covers. Their time is inside the enclosing stage; the records'"
            " unobserved list and sglang-mmtrace doctor name them.",
            unit=PER_SECOND,
        )
    )
    lay.add(
        panel(
            "Dropped records/spans/events per second by sink",
            [(f"sum by (sink) ({rate('dropped_total', SEL_INSTANCE)})", "{{sink}}")],
            "Data dropped under back-pressure (e.g. spans when the OTLP collector is slow or absent).",
            unit=PER_SECOND,
        )
    )

    return {
        "uid": "sglang-mmtrace",
        "title": "SGLang multimodal TTFT breakdown (sglang-mmtrace)",
        "description": "Generated by tools/generate_grafana_dashboards.py from the stage catalogue; do not edit by hand.",
        "tags": ["sglang", "sglang-mmtrace", "ttft"],
        "schemaVersion": 39,
        "version": 1,
        "editable": True,
        "refresh": "10s",
        "time": {"from": "now-1h", "to": "now"},
        "templating": {"list": template_variables()},
        "links": [],
        "panels": lay.panels,
    }


def template_variables() -> list[dict[str, Any]]:
    def query_var(name: str, query: str) -> dict[str, Any]:
        return {
            "name": name,
            "label": name,
            "type": "query",
            "datasource": PROM_DS,
            "definition": query,
            "query": {"query": query, "refId": f"{name}-var"},
            "refresh": 2,
            "includeAll": True,
            "allValue": ".*",
            "multi": True,
            "sort": 1,
            "current": {"selected": True, "text": ["All"], "value": ["$__all"]},
        }

    return [
        {"name": "datasource", "label": "metrics", "type": "datasource", "query": "prometheus"},
        {"name": "traces", "label": "traces", "type": "datasource", "query": "jaeger"},
        query_var("model", f"label_values({PREFIX}requests_total, model_name)"),
        query_var("instance", f'label_values({PREFIX}requests_total{{model_name=~"$model"}}, instance)'),
        {
            "name": "service",
            "label": "trace service",
            "type": "textbox",
            "query": TRACE_SERVICE,
            "current": {"selected": False, "text": TRACE_SERVICE, "value": TRACE_SERVICE},
        },
        {
            "name": "slow",
            "label": "slow TTFT >=",
            "type": "custom",
            "query": "250ms,500ms,1s,2s,5s,10s",
            "current": {"selected": True, "text": "1s", "value": "1s"},
            "options": [
                {"selected": v == "1s", "text": v, "value": v} for v in ("250ms", "500ms", "1s", "2s", "5s", "10s")
            ],
        },
    ]


def prometheus_targets(board: dict[str, Any]) -> list[tuple[str, str, str]]:
    """(panel title, refId, PromQL) of every Prometheus target of a dashboard, rows included."""
    out = []
    for p in board["panels"]:
        for sub in [p, *p.get("panels", [])]:
            if sub.get("datasource", {}).get("type") != "prometheus":
                continue
            out.extend((sub["title"], t["refId"], t["expr"]) for t in sub.get("targets", []))
    return out


def variable_queries(board: dict[str, Any]) -> dict[str, str]:
    """Template variable name -> its Prometheus query (``label_values(...)``)."""
    return {
        v["name"]: v["query"]["query"]
        for v in board["templating"]["list"]
        if v["type"] == "query" and v["datasource"]["type"] == "prometheus"
    }


def substitute(expr: str, rate_interval: str) -> str:
    """The query Grafana sends with every variable at "All" (regex ``.*``) and a given rate window."""
    for name in ("model", "instance"):
        expr = expr.replace(f"${name}", ".*").replace(f"${{{name}}}", ".*")
    return expr.replace(RANGE, rate_interval)


def render() -> str:
    return json.dumps(dashboard(), indent=2) + "\n"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--check", action="store_true")
    args = parser.parse_args()
    text = render()
    if args.check:
        ok = OUT.exists() and OUT.read_text() == text
        print("dashboard up to date" if ok else f"{OUT} is stale: run python {Path(__file__).name}")
        return 0 if ok else 1
    OUT.write_text(text)
    print(f"wrote {OUT}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
