"""A minimal OTLP/HTTP sink for the peer runs: it answers every POST 200 with an empty body (the
exporters of SGLang and of the plugin need a 200, nothing more) and counts posts, bytes and spans
per port and path, so a run shows that both tracers exported.

    python3 benchmarks/gpu/otlp_sink.py PORT[,PORT...] COUNTS.json   # SIGTERM writes COUNTS.json

Decoding only counts spans (when ``opentelemetry.proto`` is importable), so the sink takes as little
CPU from the server under test as it can; the full receiver of the exporter tests is
``tests/peers/otlp_receiver.py``.
"""

from __future__ import annotations

import http.server
import json
import signal
import sys
import threading
from typing import Any

try:
    from opentelemetry.proto.collector.trace.v1 import trace_service_pb2
except ImportError:  # counts posts and bytes only
    trace_service_pb2 = None

counts: dict[str, dict[str, int]] = {}
lock = threading.Lock()


def spans_in(body: bytes) -> int:
    """Spans in one ExportTraceServiceRequest; -1 where it does not decode (e.g. compressed)."""
    if trace_service_pb2 is None:
        return 0
    try:
        msg = trace_service_pb2.ExportTraceServiceRequest()
        msg.ParseFromString(body)
    except Exception:
        return -1
    return sum(len(ss.spans) for rs in msg.resource_spans for ss in rs.scope_spans)


class Handler(http.server.BaseHTTPRequestHandler):
    def do_POST(self) -> None:  # noqa: N802
        body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
        n = spans_in(body) if self.path.endswith("/v1/traces") else 0
        with lock:
            c = counts.setdefault(
                f"{self.server.server_address[1]}{self.path}", {"posts": 0, "bytes": 0, "spans": 0, "undecoded": 0}
            )
            c["posts"] += 1
            c["bytes"] += len(body)
            c["spans"] += max(n, 0)
            c["undecoded"] += n < 0
        self.send_response(200)
        self.send_header("Content-Type", "application/x-protobuf")
        self.send_header("Content-Length", "0")
        self.end_headers()

    def log_message(self, format: str, *args: Any) -> None:
        pass


def main() -> None:
    ports, path = sys.argv[1], sys.argv[2]
    for port in ports.split(","):
        srv = http.server.ThreadingHTTPServer(("127.0.0.1", int(port)), Handler)
        threading.Thread(target=srv.serve_forever, daemon=True).start()

    def stop(*_: Any) -> None:
        with lock, open(path, "w") as fh:
            json.dump(counts, fh, indent=1)
        sys.exit(0)

    signal.signal(signal.SIGTERM, stop)
    print("sink up", flush=True)
    while True:
        signal.pause()


if __name__ == "__main__":
    main()
