#!/bin/sh
# The demo server binds 127.0.0.1 (the CPU harness's choice); socat forwards the container's
# port 30000 to it so Prometheus (and you) can reach /metrics and /v1 from outside.
set -eu
INNER_PORT="${SGLANG_MMTRACE_DEMO_PORT:-30001}"
socat "TCP-LISTEN:30000,fork,reuseaddr" "TCP:127.0.0.1:${INNER_PORT}" &
exec sglang-mmtrace demo --serve-only --port "${INNER_PORT}" --jsonl /records/records.jsonl
