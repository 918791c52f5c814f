#!/usr/bin/env bash
# The same-instance overhead experiment with SGLang's own tracing as the peer arm (issue 43): one tiny
# Qwen3-VL server with the plugin installed AND `--enable-trace`, SGLang's spans to a local OTLP/HTTP
# sink on 4319 and the plugin's on 4318 (otlp_sink.py, beside this script), then
# `sglang-mmtrace bench --experiment overhead --sglang-trace-peer` until the deadline.
#
#   benchmarks/gpu/overhead_peer.sh OUTDIR [END_S]     # END_S: no new request after END_S s (420)
#
# Runs after the three install steps of ../shared/gpu/README.md (stage-g's gRPC OTLP exporter is what
# SGLang's --enable-trace imports, even for HTTP export), env.sh sourced and the plugin's wheel first
# on PYTHONPATH. The server and the bench run from outside the checkout (/tmp/wd): from the repository
# root `python -m` would import the checkout's plugin instead of the wheel. Env: ROUNDS (1000, the
# deadline ends the run first), GAP_MS (40), MODEL (/tmp/tiny-qwen3vl), LEAD_IN (set: the bench's
# --lead-in). Writes into OUTDIR: table.txt (the bench's table), overhead_peer.json (--json), overhead_peer.jsonl.gz, the sink's
# counts, run_info.txt, the server log's tail.
set -u
t0=$(date +%s)
out=${1:?usage: overhead_peer.sh OUTDIR [END_S]}
mkdir -p "$out"
out=$(cd "$out" && pwd)
here=$(cd "$(dirname "$0")" && pwd)
end=$((t0 + ${2:-420}))
model=${MODEL:-/tmp/tiny-qwen3vl}
log() { echo "[$(date +%H:%M:%S) +$(( $(date +%s) - t0 ))s] $*" | tee -a "$out/console.log"; }
mkdir -p /tmp/wd && cd /tmp/wd || exit 2
{ nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
  python3 -c "import sglang, torch, sglang_mmtrace, importlib.metadata as m; print('sglang', m.version('sglang'), 'torch', torch.__version__, 'plugin at', sglang_mmtrace.__file__)"
  python3 -c "import opentelemetry.exporter.otlp.proto.grpc; print('gRPC OTLP exporter importable')"
} > "$out/run_info.txt" 2>&1
[ -d "$model" ] || python3 -m sglang_mmtrace.harness.families "$model" --family qwen3-vl --shape tiny > "$out/model.log" 2>&1 \
  || { log "model build failed"; exit 3; }
python3 "$here/otlp_sink.py" 4318,4319 "$out/otlp_sink_counts.json" > "$out/sink.log" 2>&1 &
sink=$!
export OTEL_EXPORTER_OTLP_TRACES_PROTOCOL=http/protobuf
SGLANG_MMTRACE_JSONL=/tmp/wd/records.jsonl SGLANG_MMTRACE_OTLP_ENDPOINT=http://127.0.0.1:4318 \
  SGLANG_MMTRACE_OTLP_PROTOCOL=http/protobuf setsid python3 -m sglang.launch_server --model-path "$model" \
  ${SGLANG_GPU_FLAGS:-} --enable-metrics --enable-trace --otlp-traces-endpoint http://127.0.0.1:4319/v1/traces \
  --host 127.0.0.1 --port 30000 > "$out/server.log" 2>&1 &
srv=$!
stop() { kill -- -"$srv" 2>/dev/null; sleep 2; kill "$sink" 2>/dev/null; tail -60 "$out/server.log" > "$out/server_tail.log"; rm -f "$out/server.log"; }
for _ in $(seq 1 240); do curl -sf http://127.0.0.1:30000/health > /dev/null && break; kill -0 "$srv" 2>/dev/null || break; sleep 1; done
curl -sf http://127.0.0.1:30000/health > /dev/null || { log "server not healthy"; stop; exit 4; }
log "server healthy; bench until +$((end - t0)) s"
python3 -m sglang_mmtrace.cli.main bench --url http://127.0.0.1:30000 --records /tmp/wd/records.jsonl \
  --experiment overhead --sglang-trace-peer --n "${ROUNDS:-1000}" --gap-ms "${GAP_MS:-40}" --deadline "$end" \
  ${LEAD_IN:+--lead-in} \
  --seed 43 --out /tmp/wd/overhead_peer.jsonl > "$out/table.txt" 2> "$out/bench_stderr.log"
log "bench exit $?"
python3 -c "
import json, sys
from sglang_mmtrace.bench import overhead
lines = [json.loads(x) for x in open('/tmp/wd/overhead_peer.jsonl')]
json.dump(overhead.summary(lines), sys.stdout, indent=1)" > "$out/overhead_peer.json"
gzip -c /tmp/wd/overhead_peer.jsonl > "$out/overhead_peer.jsonl.gz"
stop
log "done"
