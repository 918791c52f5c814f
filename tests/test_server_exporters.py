"""OpenTelemetry and Prometheus exporters against real peers, on the real SGLang server (CPU).

- OTLP: an in-test receiver speaking the real protocol (``peers/otlp_receiver.py``): protobuf
  ``ExportTraceServiceRequest`` over HTTP (``POST /v1/traces``) and over gRPC
  (``TraceService/Export``, grpcio). Server A (here) exports over http/protobuf; server B
  (``test_server_exporters_grpc.py``, its own module so the two servers never run at once) over
  gRPC, and then loses its receiver.
- Prometheus: a real ``prometheus`` (Debian package) scrapes server A's ``/metrics`` every second;
  the tests compare PromQL answers with what the JSONL records say, and lint the exposition with
  ``promtool check metrics``.

Every comparison is between two independent views of the same requests: the JSONL record (the
plugin's join) and what the peer received over the wire.
"""

from __future__ import annotations

import http.client
import json
import re
import secrets
import time
from collections import Counter, defaultdict
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import pytest
from conftest import read_records, records, server_context, start_server, state
from peers.otlp_receiver import OtlpReceiver, Span
from peers.prometheus import PrometheusServer, promtool_check_metrics, require_tools
from prometheus_client.parser import text_string_to_metric_families

from sglang_mmtrace.harness import CpuServer, chat_request, data_url, image_message, make_image
from sglang_mmtrace.sinks import genai
from sglang_mmtrace.sinks.prometheus import METRICS, PREFIX
from sglang_mmtrace.stages import ROOT, STAGES

pytestmark = pytest.mark.server

RECORD_TIMEOUT_S = 120.0
SPAN_TIMEOUT_S = 90.0
KIND_SERVER = 2  # opentelemetry.proto Span.SpanKind
RESPONSE_ID = "gen_ai.response.id"  # the root span's rid
DUR_TOL_S = 1e-3  # span duration / start vs record: within 1 ms (the spans are built from the record)
QUESTION = "Exporter test: what is in this image?"
TEXT = "Exporter test: say something short about the sea."


# -- a streaming chat client that can send extra headers (traceparent) ------------------------


@dataclass
class Exchange:
    label: str
    status: int
    rid: str
    usage: dict[str, Any] | None
    chunks: list[dict[str, Any]]
    headers: dict[str, str] = field(default_factory=dict)
    images: int = 0
    record: dict[str, Any] | None = None


def chat(
    server: CpuServer,
    label: str,
    messages: Sequence[Mapping[str, Any]],
    headers: Mapping[str, str] | None = None,
    images: int = 0,
    max_tokens: int = 4,
) -> Exchange:
    """POST a streamed, greedy /v1/chat/completions; the rid is the SSE chunk ``id``."""
    body = json.dumps(chat_request(messages, max_tokens)).encode()
    conn = http.client.HTTPConnection("127.0.0.1", server.port, timeout=600)
    try:
        conn.request(
            "POST",
            "/v1/chat/completions",
            body=body,
            headers={"Content-Type": "application/json", "Accept": "text/event-stream", **(headers or {})},
        )
        resp = conn.getresponse()
        raw = resp.read()
    finally:
        conn.close()
    assert resp.status == 200, f"{label}: HTTP {resp.status}: {raw[:2000]!r}" + server_context(server)
    chunks, usage = [], None
    for event in raw.replace(b"\r\n", b"\n").split(b"\n\n"):
        data = b"\n".join(line[5:].lstrip() for line in event.split(b"\n") if line.startswith(b"data:"))
        if not data or data.strip() == b"[DONE]":
            continue
        chunk = json.loads(data)
        assert "error" not in chunk, f"{label}: error event {chunk}" + server_context(server)
        chunks.append(chunk)
        usage = chunk.get("usage") or usage
    assert chunks, f"{label}: empty stream: {raw[:2000]!r}"
    rids = {c["id"] for c in chunks}
    assert len(rids) == 1, f"{label}: chunk ids differ: {rids}"
    return Exchange(label, resp.status, rids.pop(), usage, chunks, dict(headers or {}), images)


def image(seed: int, size: int = 512) -> str:
    return data_url(make_image(size, size, seed=seed))


def send_plan(server: CpuServer, plan: Sequence[tuple[str, Any, dict[str, str] | None, int]]) -> dict[str, Exchange]:
    out = {}
    for label, messages, headers, n_images in plan:
        out[label] = chat(server, label, messages, headers, n_images)
    found = records(server, [ex.rid for ex in out.values()], timeout=RECORD_TIMEOUT_S)
    for ex in out.values():
        ex.record = found[ex.rid]
        assert ex.record["status"] == "ok", f"{ex.label}: {ex.record}" + server_context(server)
    return out


def peer_pids(server: CpuServer) -> dict[str, set[int]]:
    """Process kind -> pids, from the plugin's own state (peers report ``<process>:<pid>``)."""
    out: dict[str, set[int]] = defaultdict(set)
    for key in state(server).get("peers", {}):
        process, _, pid = key.partition(":")
        out[process].add(int(pid))
    return out


def metric_samples(text: str, name: str) -> list[tuple[dict[str, str], float]]:
    """Samples of one sample name (e.g. ``sglang_mmtrace_dropped_total``) in exposition text."""
    out = []
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if sample.name == name:
                out.append((dict(sample.labels), float(sample.value)))
    return out


def get_text(server: CpuServer, path: str) -> str:
    conn = http.client.HTTPConnection("127.0.0.1", server.port, timeout=60)
    try:
        conn.request("GET", path)
        resp = conn.getresponse()
        body = resp.read()
    finally:
        conn.close()
    assert resp.status == 200, f"GET {path} -> HTTP {resp.status}" + server_context(server)
    return body.decode()


# -- spans ---------------------------------------------------------------------------------------


def spans_of(receiver: OtlpReceiver, trace_id: str) -> list[Span]:
    return [s for s in receiver.snapshot() if s.trace_id == trace_id]


def wait_spans(receiver: OtlpReceiver, rec: dict[str, Any], server: CpuServer) -> list[Span]:
    """Poll the receiver until the record's trace holds its root and one span per record stage (or
    time out)."""
    assert rec.get("trace_id"), f"record has no trace_id: {json.dumps(rec)[:3000]}"
    want = len(rec["stages"]) + 1
    deadline = time.monotonic() + SPAN_TIMEOUT_S
    polls = 0
    while True:
        spans = spans_of(receiver, rec["trace_id"])
        if len(spans) >= want:
            return spans
        polls += 1
        if polls % 10 == 0:  # fail fast, with the reason, when the sink itself reports failures
            errors = otlp_sink_errors(server)
            if errors:
                raise AssertionError(
                    f"rid {rec['rid']}: {len(spans)} of {want} spans arrived and the OTLP sink reports contained "
                    f"failures {errors}; plugin warnings in the log:\n{plugin_warnings(server)}"
                )
        if time.monotonic() > deadline:
            by_rid = Counter(s.trace_id for s in receiver.snapshot() if s.attrs.get(RESPONSE_ID) == rec["rid"])
            raise AssertionError(
                f"rid {rec['rid']}: {len(spans)} spans of trace {rec['trace_id']} after {SPAN_TIMEOUT_S:.0f} s, "
                f"want {want} (the root and the record's stages); root spans of this rid by trace id: {dict(by_rid)}; "
                f"receiver requests {receiver.requests}, bad {receiver.bad_requests[:3]}" + server_context(server)
            )
        time.sleep(0.2)


def otlp_sink_errors(server: CpuServer) -> dict[str, float]:
    """Contained failures of the OTLP sink and its exporter, from ``/mmtrace/state``."""
    errors = state(server)["api"].get("errors", {})
    return {k: v for k, v in errors.items() if k.lower().startswith(("sink.otlp", "sink.otlpsink"))}


def plugin_warnings(server: CpuServer) -> str:
    text = server.log_path.read_text(errors="replace") if server.log_path else ""
    return "\n".join(line for line in text.splitlines() if "sglang-mmtrace:" in line)[-3000:]


def describe_spans(spans: Sequence[Span]) -> str:
    return "\n".join(
        f"  {s.name:24s} {s.span_id} parent={s.parent_span_id} proc={s.resource.get('sglang.process')} "
        f"pid={s.resource.get('process.pid')} dur={s.duration_s:.6f}"
        for s in sorted(spans, key=lambda s: s.start_ns)
    )


def server_root(spans: Sequence[Span]) -> Span:
    """The request's root: the GenAI operation's SERVER span (``chat <model>``)."""
    (root,) = [s for s in spans if s.kind == KIND_SERVER]
    return root


def span_problems(rec: dict[str, Any], spans: Sequence[Span], pids: Mapping[str, set[int]], api_pid: int) -> list[str]:
    """Everything a request's trace must satisfy, against its record."""
    problems: list[str] = []
    trace_ids = {s.trace_id for s in spans}
    if trace_ids != {rec["trace_id"]}:
        problems.append(f"trace ids {trace_ids} != record trace_id {rec['trace_id']}")
    foreign = {s.attrs[RESPONSE_ID] for s in spans if RESPONSE_ID in s.attrs} - {rec["rid"]}
    if foreign:
        problems.append(f"root spans of other rids in this trace: {foreign}")
    ids = Counter(s.span_id for s in spans)
    if any(n > 1 for n in ids.values()):
        problems.append(f"duplicate span ids: {[k for k, n in ids.items() if n > 1]}")
    by_id = {s.span_id: s for s in spans}

    servers = [s for s in spans if s.kind == KIND_SERVER]
    ttfts = [s for s in spans if s.name == ROOT]
    if len(servers) != 1 or len(ttfts) != 1:
        problems.append(f"{len(servers)} SERVER spans and {len(ttfts)} '{ROOT}' spans, want one each")
        return problems
    root, ttft = servers[0], ttfts[0]
    if root.name != f"chat {rec['model']}":
        problems.append(f"root span named {root.name!r}, want 'chat {rec['model']}'")
    if ttft.parent_span_id != root.span_id:
        problems.append(f"'{ROOT}' span's parent is {ttft.parent_span_id}, not the root {root.span_id}")

    # every parent exists in the same trace (the root's parent is the caller's, checked elsewhere)
    for s in spans:
        if s is not root and s.parent_span_id not in by_id:
            problems.append(f"{s.name}: parent {s.parent_span_id} is not a span of this trace")

    # stage spans parented by the nearest catalogue ancestor present in the record
    present = {st["name"] for st in rec["stages"]}
    for s in spans:
        if s is root or s is ttft or s.parent_span_id not in by_id:
            continue
        stage = STAGES.get(s.name)
        want = stage.parent if stage else ROOT
        while want is not None and want not in present:
            want = STAGES[want].parent
        got = by_id[s.parent_span_id].name
        if got != (want or ROOT):
            problems.append(f"{s.name}: parent span is {got}, catalogue ancestor present is {want or ROOT}")

    # every record stage is a span: same count per name, durations and starts within 1 ms
    base_ns = root.start_ns
    if abs(base_ns / 1e9 - rec["arrival_unix_s"]) > DUR_TOL_S:
        problems.append(f"root start {base_ns / 1e9:.6f} != arrival_unix_s {rec['arrival_unix_s']}")
    rec_by_name: dict[str, list[dict[str, Any]]] = defaultdict(list)
    for st in rec["stages"]:
        rec_by_name[st["name"]].append(st)
    span_by_name: dict[str, list[Span]] = defaultdict(list)
    for s in spans:
        if s is not root:
            span_by_name[s.name].append(s)
    for name in sorted(set(rec_by_name) | set(span_by_name)):
        rs = sorted(rec_by_name.get(name, []), key=lambda st: st["start_s"])
        ss = sorted(span_by_name.get(name, []), key=lambda s: s.start_ns)
        if len(rs) != len(ss):
            problems.append(f"stage {name}: {len(rs)} in the record, {len(ss)} spans")
            continue
        for st, sp in zip(rs, ss, strict=True):
            if abs(sp.duration_s - st["dur_s"]) > DUR_TOL_S:
                problems.append(f"stage {name}: span duration {sp.duration_s:.6f} != record dur_s {st['dur_s']:.6f}")
            if abs((sp.start_ns - base_ns) / 1e9 - st["start_s"]) > DUR_TOL_S:
                problems.append(
                    f"stage {name}: span start +{(sp.start_ns - base_ns) / 1e9:.6f} != record start_s {st['start_s']:.6f}"
                )
            if sp.resource.get("sglang.process") != st["process"]:
                problems.append(
                    f"stage {name}: resource sglang.process {sp.resource.get('sglang.process')} != {st['process']}"
                )
    if abs(ttft.duration_s - rec["ttft_s"]) > DUR_TOL_S:
        problems.append(f"'{ROOT}' span duration {ttft.duration_s:.6f} != ttft_s {rec['ttft_s']}")
    if abs(root.duration_s - rec["e2e_s"]) > DUR_TOL_S:
        problems.append(f"root duration {root.duration_s:.6f} != e2e_s {rec['e2e_s']} (arrival to the last byte)")

    # resources: the process kind and the pid of the SGLang process that did the work
    for s in spans:
        proc, pid = s.resource.get("sglang.process"), s.resource.get("process.pid")
        if proc == "api" and pid != api_pid:
            problems.append(f"{s.name}: api span with process.pid {pid}, the server's api process is {api_pid}")
        elif proc in ("scheduler", "detokenizer") and pid not in pids.get(proc, set()):
            problems.append(f"{s.name}: {proc} span with process.pid {pid}, the {proc} pids are {pids.get(proc)}")
    procs = {s.resource.get("sglang.process") for s in spans}
    want_procs = {"api", "scheduler"} | ({"detokenizer"} if "detokenize" in present else set())
    if not want_procs <= procs:
        problems.append(f"spans come from processes {procs}, expected at least {want_procs}")

    # GenAI and HTTP server attributes on the root (the conventions' table: test_unit_genai_spans.py)
    want_attrs = {
        "gen_ai.operation.name": "chat",
        "gen_ai.provider.name": "sglang",
        "gen_ai.request.model": rec["model"],
        "gen_ai.request.stream": True,
        RESPONSE_ID: rec["rid"],
        "gen_ai.usage.input_tokens": rec["prompt_tokens"],
        "gen_ai.usage.cache_read.input_tokens": rec["cached_tokens"],
        "gen_ai.usage.output_tokens": rec["output_tokens"],
        "http.request.method": "POST",
        "http.route": "/v1/chat/completions",
        "http.response.status_code": 200,
        "url.path": "/v1/chat/completions",
        "url.scheme": "http",
    }
    for key, value in want_attrs.items():
        if root.attrs.get(key) != value:
            problems.append(f"root attribute {key} = {root.attrs.get(key)!r}, expected {value!r}")
    return problems


# -- server A: OTLP over http/protobuf, scraped by Prometheus ---------------------------------


@pytest.fixture(scope="module")
def http_receiver():
    receiver = OtlpReceiver()
    receiver.start_http()
    try:
        yield receiver
    finally:
        receiver.stop()


@pytest.fixture(scope="module")
def server_a(tmp_path_factory, http_receiver):
    env = {
        "SGLANG_MMTRACE_OTLP_ENDPOINT": f"http://127.0.0.1:{http_receiver.http_port}",
        "SGLANG_MMTRACE_OTLP_PROTOCOL": "http/protobuf",
        "SGLANG_MMTRACE_SAMPLE": "1.0",
        "SGLANG_MMTRACE_OTLP_METRICS": "1",
        "OTEL_METRIC_EXPORT_INTERVAL": "500",  # ms; the SDK's default is 60 s
    }
    with start_server(tmp_path_factory, "exporters-a", env=env) as srv:
        yield srv


TRACEPARENT_TRACE = "4bf92f3577b34da6a3ce929d0e0e4736"


@pytest.fixture(scope="module")
def otlp_exchanges(server_a) -> dict[str, Exchange]:
    a = image(8101)
    parent_span = secrets.token_hex(8)
    plan = [
        ("new_image", [image_message(QUESTION, [a])], None, 1),
        ("same_image_again", [image_message(QUESTION, [a])], None, 1),
        ("text_only", [{"role": "user", "content": TEXT}], None, 0),
        (
            "traceparent",
            [image_message(QUESTION, [image(8102)])],
            {"traceparent": f"00-{TRACEPARENT_TRACE}-{parent_span}-01"},
            1,
        ),
    ]
    return send_plan(server_a, plan)


OTLP_LABELS = ("new_image", "same_image_again", "text_only", "traceparent")


@pytest.mark.parametrize("label", OTLP_LABELS)
def test_otlp_http_trace_matches_record(otlp_exchanges, http_receiver, server_a, label):
    """One trace per request, equal to the record's trace_id; every record stage is a span with the
    record's duration (1 ms); parents exist and follow the catalogue; api and scheduler (and
    detokenizer) resources with their real pids; GenAI attributes on the root."""
    ex = otlp_exchanges[label]
    rec = ex.record
    spans = wait_spans(http_receiver, rec, server_a)
    problems = span_problems(rec, spans, peer_pids(server_a), server_a.process.pid)
    if label != "traceparent":
        root = server_root(spans)
        if root.parent_span_id is not None:
            problems.append(f"root has parent {root.parent_span_id} though the request carried no traceparent")
    if ex.usage is not None and ex.usage.get("prompt_tokens") != rec["prompt_tokens"]:
        problems.append(f"usage.prompt_tokens {ex.usage.get('prompt_tokens')} != record {rec['prompt_tokens']}")
    assert not problems, "\n".join(problems) + f"\nrid {rec['rid']} spans:\n{describe_spans(spans)}"
    assert {s.transport for s in spans} == {"http"}
    assert not http_receiver.bad_requests, http_receiver.bad_requests[:5]


def test_otlp_sink_reports_no_failures(otlp_exchanges, server_a):
    """Exporting the requests' spans raised nothing inside the sink (``/mmtrace/state`` errors)."""
    errors = otlp_sink_errors(server_a)
    assert not errors, f"contained OTLP sink failures {errors}:\n{plugin_warnings(server_a)}"


def test_otlp_one_distinct_trace_per_request(otlp_exchanges, http_receiver, server_a):
    trace_ids = {label: ex.record["trace_id"] for label, ex in otlp_exchanges.items()}
    assert all(isinstance(t, str) and re.fullmatch(r"[0-9a-f]{32}", t) for t in trace_ids.values()), trace_ids
    assert len(set(trace_ids.values())) == len(trace_ids), trace_ids
    for ex in otlp_exchanges.values():
        wait_spans(http_receiver, ex.record, server_a)
    # every root span that names one of these rids is in that rid's trace
    by_rid = {ex.rid: ex.record["trace_id"] for ex in otlp_exchanges.values()}
    stray = [
        (s.name, s.attrs[RESPONSE_ID], s.trace_id)
        for s in http_receiver.snapshot()
        if s.attrs.get(RESPONSE_ID) in by_rid and s.trace_id != by_rid[s.attrs[RESPONSE_ID]]
    ]
    assert not stray, f"spans outside their request's trace: {stray[:10]}"


def test_otlp_traceparent_is_continued(otlp_exchanges, http_receiver, server_a):
    ex = otlp_exchanges["traceparent"]
    _, trace_id, parent_span, _ = ex.headers["traceparent"].split("-")
    assert ex.record["trace_id"] == trace_id == TRACEPARENT_TRACE, ex.record
    spans = wait_spans(http_receiver, ex.record, server_a)
    assert {s.trace_id for s in spans} == {trace_id}
    root = server_root(spans)
    assert root.parent_span_id == parent_span, describe_spans(spans)
    assert all(s.parent_span_id != parent_span for s in spans if s is not root), describe_spans(spans)


# -- Prometheus ---------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def prometheus(server_a, tmp_path_factory):
    require_tools()
    with PrometheusServer(f"127.0.0.1:{server_a.port}", tmp_path_factory.mktemp("prometheus")) as prom:
        yield prom


@dataclass
class Scraped:
    records: list[dict[str, Any]]
    at: float  # unix time of a scrape that saw every record
    text: str  # /metrics text fetched after the records were counted


def mmtrace_requests_on_metrics(text: str) -> float:
    return sum(v for _, v in metric_samples(text, PREFIX + "requests_total"))


@pytest.fixture(scope="module")
def scraped(server_a, prometheus) -> Scraped:
    b, c = image(8301), image(8302)
    send_plan(
        server_a,
        [
            ("prom_new_image", [image_message(QUESTION, [b])], None, 1),
            ("prom_same_image", [image_message(QUESTION, [b])], None, 1),
            ("prom_other_image_question_first", [image_message(QUESTION, [c], image_first=False)], None, 1),
            ("prom_text", [{"role": "user", "content": TEXT + " Briefly."}], None, 0),
        ],
    )
    # SGLang's start-up request is a warm-up record: in the JSONL, never in the metrics
    recs = [r for r in read_records(server_a.jsonl_path) if not r.get("warmup")]
    assert any(r.get("warmup") for r in read_records(server_a.jsonl_path)), "the start-up request's record"
    # The metrics are observed right after the record is written (same collector pass): wait until
    # /metrics counts every record, then for a Prometheus scrape that started after that.
    # A record's observations (requests_total first, histograms after) land in different
    # prometheus_client files: wait until /metrics counts every record AND the plugin's families read
    # the same twice, half a second apart (no request is in flight, so nothing else changes them).
    deadline = time.monotonic() + 60
    previous = None
    while True:
        text = get_text(server_a, "/metrics")
        ours = _mmtrace_families(text)
        settled = ours == previous and mmtrace_requests_on_metrics(text) >= len(recs)
        if settled or time.monotonic() > deadline:
            break
        previous = ours
        time.sleep(0.5)
    assert mmtrace_requests_on_metrics(text) == len(recs), (
        f"/metrics counts {mmtrace_requests_on_metrics(text)} requests, the JSONL has {len(recs)} records"
    )
    t_counted = time.time()
    scrape_ts = prometheus.wait_scrape_after(t_counted)
    # Evaluate every query half a millisecond after that scrape: the sample at exactly the scrape's
    # timestamp is then inside the lookback window whatever way the float time is rounded to
    # milliseconds, and the next scrape (1 s later) is not; a later failed scrape (stale markers)
    # cannot hide it either.
    at = scrape_ts + 0.0005
    assert sum(1 for r in read_records(server_a.jsonl_path) if not r.get("warmup")) == len(recs), (
        "records were added while scraping"
    )
    return Scraped(recs, at, text)


def test_prometheus_requests_total(prometheus, scraped):
    ok = sum(1 for r in scraped.records if r["status"] == "ok")
    assert ok >= 4
    got = prometheus.scalar('sum(sglang_mmtrace_requests_total{status="ok"})', scraped.at)
    assert got == ok, (
        f"requests_total{{status=ok}} = {got}, records with status ok = {ok}; series at {scraped.at}: "
        f"{prometheus.query('sglang_mmtrace_requests_total', scraped.at)}; "
        f"/metrics text had {mmtrace_requests_on_metrics(scraped.text)}"
    )
    models = {r["model"] for r in scraped.records}
    series = prometheus.query("sglang_mmtrace_requests_total", scraped.at)
    assert {s["metric"]["model_name"] for s in series} == models, series
    by_status = Counter(r["status"] for r in scraped.records)
    for s in series:
        assert s["value"] == by_status[s["metric"]["status"]], (s, by_status)


def test_prometheus_cache_lookups_match_records(prometheus, scraped):
    images = [r for r in scraped.records if r["images"] and r["status"] == "ok"]
    expected: Counter[tuple[str, str]] = Counter()
    for r in scraped.records:
        for st in r["stages"]:
            if st["name"] == "mm.preprocess_cache" and st["attrs"].get("result") in ("hit", "miss"):
                expected["preprocess", st["attrs"]["result"]] += 1
    for r in images:
        if r["cache"]["embedding"] in ("hit", "miss"):
            expected["embedding", r["cache"]["embedding"]] += 1
        expected["prefix_image", "hit" if r["cache"]["image_prefix_hit"] else "miss"] += 1
    # the requests make every kind of outcome happen at least once, so the comparison means something
    for key in [("prefix_image", "hit"), ("prefix_image", "miss"), ("preprocess", "hit"), ("preprocess", "miss"),
                ("embedding", "miss")]:  # fmt: skip
        assert expected[key] > 0, f"the records show no {key} outcome: {dict(expected)}"
    got = {
        (s["metric"]["cache"], s["metric"]["result"]): s["value"]
        for s in prometheus.query("sglang_mmtrace_cache_lookups_total", scraped.at)
    }
    for cache in ("preprocess", "embedding", "prefix_image"):
        for result in ("hit", "miss"):
            assert got.get((cache, result), 0.0) == expected[cache, result], (
                f'cache_lookups_total{{cache="{cache}",result="{result}"}} = {got.get((cache, result))}, '
                f"records say {expected[cache, result]}; all: {got}"
            )
    assert set(got) <= {(c, r) for c in ("preprocess", "embedding", "prefix_image") for r in ("hit", "miss")}, got


STAGES_CHECKED = (
    "request",
    "tokenize",
    "mm.process",
    "mm.preprocess_cache",
    "mm.decode",
    "model.vision_encoder",
    "model.prefill",
    "scheduler.prefix_match",
    "detokenize",
)


@pytest.mark.parametrize("stage", STAGES_CHECKED)
def test_prometheus_stage_histogram_matches_records(prometheus, scraped, stage):
    """``stage_seconds_count`` = records in which the stage ran (a ``skipped`` encoder marker is no
    observation); ``_sum`` = their summed durations."""
    with_stage = [
        r for r in scraped.records if any(s["name"] == stage and not s["attrs"].get("skipped") for s in r["stages"])
    ]
    if stage in ("model.vision_encoder", "mm.decode"):
        assert 0 < len(with_stage) < len(scraped.records), f"{stage}: present in {len(with_stage)} records"
    count = prometheus.scalar(f'sum(sglang_mmtrace_stage_seconds_count{{stage="{stage}"}})', scraped.at)
    assert count == len(with_stage), (
        f"stage_seconds_count{{stage={stage}}} = {count}, records with it: {len(with_stage)}"
    )
    total = sum(s["dur_s"] for r in with_stage for s in r["stages"] if s["name"] == stage)
    got = prometheus.scalar(f'sum(sglang_mmtrace_stage_seconds_sum{{stage="{stage}"}})', scraped.at)
    assert got == pytest.approx(total, rel=1e-6, abs=1e-6), (
        f"stage_seconds_sum{{stage={stage}}} = {got}, records {total}"
    )


def test_prometheus_ttft_tokens_and_transport_match_records(prometheus, scraped):
    ok = [r for r in scraped.records if r["status"] == "ok" and r["ttft_s"]]
    by_modality = Counter("image" if r["images"] else "text" for r in ok)
    got = {
        s["metric"]["modality"]: s["value"]
        for s in prometheus.query("sum by (modality) (sglang_mmtrace_ttft_seconds_count)", scraped.at)
    }
    assert got == dict(by_modality), (got, by_modality)
    ttft_sum = prometheus.scalar("sum(sglang_mmtrace_ttft_seconds_sum)", scraped.at)
    assert ttft_sum == pytest.approx(sum(r["ttft_s"] for r in ok), rel=1e-6)

    cached = sum(r["cached_tokens"] for r in scraped.records if r["prompt_tokens"])
    computed = sum(r["prompt_tokens"] - r["cached_tokens"] for r in scraped.records if r["prompt_tokens"])
    got_tokens = {
        s["metric"]["kind"]: s["value"] for s in prometheus.query("sglang_mmtrace_prefix_tokens_total", scraped.at)
    }
    assert got_tokens.get("cached", 0.0) == cached and got_tokens.get("computed", 0.0) == computed, (
        got_tokens,
        cached,
        computed,
    )

    imgs = [i for r in scraped.records for i in r["images"]]
    assert prometheus.scalar("sum(sglang_mmtrace_visual_tokens_count)", scraped.at) == len(imgs)
    assert prometheus.scalar("sum(sglang_mmtrace_visual_tokens_sum)", scraped.at) == sum(
        i["visual_tokens"] for i in imgs
    )

    by_mode: Counter[str] = Counter()
    for r in scraped.records:
        t = r["transport"]
        if t["bytes"] and t["mode"] not in (None, "none"):
            by_mode[t["mode"]] += t["bytes"]
    got_bytes = {
        s["metric"]["mode"]: s["value"] for s in prometheus.query("sglang_mmtrace_transport_bytes_total", scraped.at)
    }
    assert got_bytes == dict(by_mode), (got_bytes, by_mode)
    assert by_mode, "no transport bytes in the records of image requests"


def test_prometheus_histograms_share_one_bucket_layout(prometheus, scraped):
    layouts: dict[tuple[str, str], frozenset[str]] = {}
    for metric in ("sglang_mmtrace_stage_seconds_bucket", "sglang_mmtrace_ttft_seconds_bucket",
                   "sglang_mmtrace_ttft_unattributed_seconds_bucket"):  # fmt: skip
        per_series: dict[tuple[str, str], set[str]] = defaultdict(set)
        for s in prometheus.query(metric, scraped.at):
            labels = dict(s["metric"])
            le = labels.pop("le")
            labels.pop("__name__", None)
            per_series[metric, json.dumps(labels, sort_keys=True)].add(le)
        assert per_series, f"no {metric} series"
        layouts.update({k: frozenset(v) for k, v in per_series.items()})
    stage_layouts = {v for (m, _), v in layouts.items() if m == "sglang_mmtrace_stage_seconds_bucket"}
    n_stages = len({json.loads(k)["stage"] for (m, k) in layouts if m == "sglang_mmtrace_stage_seconds_bucket"})
    assert n_stages >= 10, f"only {n_stages} stages have histograms"
    assert len(stage_layouts) == 1, f"stage histograms use {len(stage_layouts)} bucket layouts: {stage_layouts}"
    (layout,) = stage_layouts
    assert "+Inf" in layout and len(layout) >= 10, sorted(layout)
    # TTFT histograms use the same layout (the sink's own contract: stacked panels add up to TTFT)
    assert {v for v in layouts.values()} == {layout}, {k: sorted(v) for k, v in layouts.items() if v != layout}


def test_prometheus_no_per_request_labels(prometheus, scraped):
    series = prometheus.api("series", **{"match[]": '{__name__=~"sglang_mmtrace_.+"}'})
    assert series, "Prometheus holds no sglang_mmtrace_ series"
    allowed: dict[str, set[str]] = {}
    for name, (kind, labels, _) in METRICS.items():
        base = PREFIX + name
        names = [base + s for s in ("_bucket", "_count", "_sum")] if kind == "histogram" else [base]
        if kind == "counter":
            names += [base.removesuffix("_total") + "_created"]
        for n in names:
            allowed[n] = set(labels) | {"__name__", "job", "instance"} | ({"le"} if n.endswith("_bucket") else set())
    closed = {
        "modality": {"image", "text"},
        "prefix": {"hit", "partial", "miss"},
        "cache": {"preprocess", "embedding", "prefix_image"},
        "result": {"hit", "miss"},
        "status": {"ok", "error", "aborted"},
        "kind": {"cached", "computed"},
        "stage": set(STAGES),
        "model_name": {r["model"] for r in scraped.records},
        "process": {"api", "scheduler"},  # occupancy: where it is held, never a pid
    }
    per_request = {r["rid"] for r in scraped.records} | {r["trace_id"] for r in scraped.records if r["trace_id"]}
    rid_like = re.compile(r"[0-9a-f]{16,}|chatcmpl-|[0-9a-f]{8}-[0-9a-f]{4}-")
    problems, values = [], defaultdict(set)
    for s in series:
        name = s["__name__"]
        if name not in allowed:
            problems.append(f"unexpected series {name} (not in the contract's metric table)")
            continue
        for key, value in s.items():
            values[key].add(value)
            if key not in allowed[name]:
                problems.append(f"{name}: label {key}={value!r} is not in the contract's labels")
            if value in per_request:
                problems.append(f"{name}: per-request label value {key}={value!r}")
            if key in closed:
                if value not in closed[key]:
                    problems.append(f"{name}: {key}={value!r} is outside {sorted(closed[key])}")
            elif key not in ("__name__", "instance", "job", "le") and rid_like.search(value):
                problems.append(f"{name}: rid-like label value {key}={value!r}")
    assert not problems, "\n".join(problems[:30])
    assert len(values["model_name"]) == 1 and len(values["instance"]) == 1, values


def _mmtrace_families(text: str) -> str:
    keep = []
    for line in text.splitlines():
        if line.startswith(("# HELP ", "# TYPE ")):
            if line.split(" ", 3)[2].startswith(PREFIX):
                keep.append(line)
        elif line.startswith(PREFIX):
            keep.append(line)
    return "\n".join(keep) + "\n"


def test_promtool_check_metrics(prometheus, scraped):
    """``promtool check metrics`` finds nothing in the plugin's families, and nothing that names them
    in the whole /metrics page (SGLang's own metrics are SGLang's business)."""
    ours = _mmtrace_families(scraped.text)
    families = set(re.findall(r"^# TYPE (\S+) ", ours, flags=re.M))
    contract = {PREFIX + name for name in METRICS}
    # errors_total / dropped_total have no sample until something fails or drops (prometheus_client
    # in multiprocess mode then omits the family); every request-driven family is there.
    # the cuda_ipc pool's families exist only with the cuda_ipc transport, which needs CUDA
    no_cuda = {PREFIX + n for n in METRICS if n.startswith("cuda_ipc_pool_")}
    # unobserved_stages_total has none either while every stage is seen (as here), nor
    # stage_failures_total while no media fails, and window_active exists only while tracing windows are set
    quiet = {
        PREFIX + "errors_total",
        PREFIX + "stage_failures_total",
        PREFIX + "dropped_total",
        PREFIX + "unobserved_stages_total",
        PREFIX + "window_active",
    }
    request_driven = contract - quiet - no_cuda
    assert request_driven <= families <= contract, (sorted(families), sorted(contract))
    rc, out = promtool_check_metrics(ours)
    assert rc == 0 and not out, f"promtool check metrics (sglang_mmtrace_* families) rc={rc}:\n{out}"
    rc_all, out_all = promtool_check_metrics(scraped.text)
    print(f"promtool check metrics on the whole /metrics page: rc={rc_all}\n{out_all}")
    ours_flagged = [line for line in out_all.splitlines() if PREFIX in line]
    assert not ours_flagged, "\n".join(ours_flagged)
    if rc_all != 0:  # only lint findings about SGLang's own metrics are tolerated, never parse errors
        assert all(" " in line and "error while linting" not in line for line in out_all.splitlines()), out_all


# -- OpenTelemetry GenAI server metrics (Prometheus and OTLP) ------------------------------------


def genai_expected(recs: Sequence[dict[str, Any]]) -> dict[str, list[float]]:
    """The conventions' three values per record, computed here from the record's own fields."""
    out: dict[str, list[float]] = {genai.TTFT: [], genai.DURATION: [], genai.TPOT: []}
    for r in recs:
        if r["e2e_s"] is not None:
            out[genai.DURATION].append(r["e2e_s"])
        if r["status"] == "ok" and r["ttft_s"] is not None:
            out[genai.TTFT].append(r["ttft_s"])
            if r["output_tokens"] > 1:
                out[genai.TPOT].append((r["e2e_s"] - r["ttft_s"]) / (r["output_tokens"] - 1))
    return out


def test_prometheus_genai_metrics_match_records(prometheus, scraped):
    """``gen_ai_server_*_seconds``: counts and sums equal the records' values, the conventions'
    buckets and attributes, and ``promtool check metrics`` finds nothing in them."""
    expected = genai_expected(scraped.records)
    assert all(expected.values()), {k: len(v) for k, v in expected.items()}
    for name, (_, bounds) in genai.METRICS.items():
        prom = genai.prometheus_name(name)
        assert prometheus.scalar(f"sum({prom}_count)", scraped.at) == len(expected[name]), name
        got = prometheus.scalar(f"sum({prom}_sum)", scraped.at)
        assert got == pytest.approx(sum(expected[name]), rel=1e-6, abs=1e-9), name
        series = prometheus.query(f"{prom}_bucket", scraped.at)
        assert {float(s["metric"]["le"]) for s in series} == {*bounds, float("inf")}, name
        for s in series:
            labels = s["metric"]
            assert labels["gen_ai_operation_name"] == "chat" and labels["gen_ai_provider_name"] == "sglang", labels
            assert labels["gen_ai_request_model"] in {r["model"] for r in scraped.records}, labels
    families = [
        line
        for line in scraped.text.splitlines()
        if line.startswith("gen_ai_server_") or (line.startswith("# ") and " gen_ai_server_" in line)
    ]
    rc, out = promtool_check_metrics("\n".join(families) + "\n")
    assert rc == 0 and not out, f"promtool check metrics (gen_ai_server_* families) rc={rc}:\n{out}"


def test_otlp_genai_metrics_match_records(scraped, http_receiver, server_a):
    """The same three histograms over OTLP/HTTP (``POST /v1/metrics``) to the spans' receiver: the
    latest cumulative point of each carries the records' count and sum and the conventions' buckets."""
    expected = genai_expected(scraped.records)
    deadline = time.monotonic() + SPAN_TIMEOUT_S
    while True:
        latest: dict[tuple[str, str], Any] = {}  # (metric, its attributes) -> the newest cumulative point
        for p in http_receiver.metric_snapshot():
            key = (p.name, json.dumps(p.attrs, sort_keys=True))
            if key not in latest or p.time_ns >= latest[key].time_ns:
                latest[key] = p
        counts = {name: sum(p.count for (n, _), p in latest.items() if n == name) for name in genai.METRICS}
        if counts == {name: len(v) for name, v in expected.items()} or time.monotonic() > deadline:
            break
        time.sleep(0.25)
    assert counts == {name: len(v) for name, v in expected.items()}, (counts, plugin_warnings(server_a))
    for name in genai.METRICS:
        got = sum(p.sum for (n, _), p in latest.items() if n == name)
        assert got == pytest.approx(sum(expected[name]), rel=1e-6, abs=1e-9), name
    for (name, _), point in latest.items():
        assert point.bounds == genai.METRICS[name][1] and point.unit == "s" and point.temporality == 2, point
        assert point.attrs["gen_ai.provider.name"] == "sglang" and point.attrs["gen_ai.operation.name"] == "chat"
        assert point.resource["service.name"] == "sglang" and point.transport == "http"
    assert not http_receiver.bad_requests, http_receiver.bad_requests[:5]
