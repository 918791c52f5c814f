#!/bin/bash
# The whole H200 experiment (third `run` call, after stage-b/env.sh is sourced and the project wheel
# is on PYTHONPATH): build the tiny Qwen3-VL, run the reference requests with the default feature
# transport (cuda_ipc on 0.5.17) and, if time allows, with --mm-feature-transport cpu; doctor and
# report. Everything it keeps is under $OUT (at most 8 files come back).
set -u
T0=$(date +%s); DEADLINE=$((T0 + ${BUDGET_S:-570}))
OUT=${OUT:?}; ROUNDS=${ROUNDS:-5}
log() { echo "[$(date +%H:%M:%S) +$(( $(date +%s) - T0 ))s] $*"; }
nvidia-smi --query-gpu=name,driver_version,memory.used,memory.total --format=csv,noheader
python3 -c "import sglang, torch, transformers, sglang_mmtrace, importlib.metadata as m; print('sglang', m.version('sglang'), 'torch', torch.__version__, 'transformers', transformers.__version__, 'mmtrace', sglang_mmtrace.__file__)"
python3 -c "import importlib.metadata as m; print([e.value for e in m.entry_points(group='sglang.srt.plugins')])"
{ python3 -m sglang_mmtrace.cli.main doctor; echo "doctor exit $?"; } > $OUT/doctor.txt 2>&1
log "doctor: $(tail -1 $OUT/doctor.txt)"
MODEL=/tmp/tiny-qwen3vl
python3 -c "from pathlib import Path; from sglang_mmtrace.harness.tiny_model import build_tiny_qwen3vl; build_tiny_qwen3vl(Path('$MODEL'))" || { log "model build failed"; exit 3; }
log "model built: $(du -sh $MODEL | cut -f1)"
python3 benchmarks/gpu/drive_017.py --model $MODEL --out $OUT --label ipc --rounds $ROUNDS --deadline $((DEADLINE - ${CPU_RUN_RESERVE_S:-170}))
log "cuda_ipc run done (rc $?)"
if (( $(date +%s) < DEADLINE - 120 )); then
  python3 benchmarks/gpu/drive_017.py --model $MODEL --out $OUT --label cpu --rounds $ROUNDS --port 30001 --deadline $DEADLINE -- --mm-feature-transport cpu
  log "cpu-transport run done (rc $?)"
else
  log "skipped the cpu-transport run: not enough time left"
fi
for l in ipc cpu; do
  [ -f $OUT/records_$l.jsonl ] && { echo "== $l transport: all records (sglang-mmtrace report)"; python3 -m sglang_mmtrace.cli.main report $OUT/records_$l.jsonl; } >> $OUT/report.txt 2>&1
  [ -f /tmp/server_$l.log ] && { echo "===== server_$l.log (grep + tail)"; grep -aiE "mmtrace|transport auto|processor concurrency|Traceback|Error|radix|cache" /tmp/server_$l.log | grep -v "server_args=" | head -60; echo "----- tail"; tail -n 60 /tmp/server_$l.log | cut -c1-400; } >> $OUT/server_logs.txt 2>&1
done
log "finished"
