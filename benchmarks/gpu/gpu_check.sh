#!/bin/bash
# End-to-end GPU check: real SGLang + the plugin + a random-weight VLM built on the spot (a tiny
# Qwen3-VL by default), the reference requests, optionally under Nsight Systems; results into OUTDIR.
#
#   [FAMILY=qwen3-vl] [SHAPE=tiny] benchmarks/gpu/gpu_check.sh OUTDIR [PHASE ...]   (default phases: doctor ipc cpu)
#
# FAMILY is a harness family (sglang_mmtrace/harness/families: qwen2.5-vl, gemma3, ...) and SHAPE one of
# its shapes (tiny, or a published size such as qwen2.5-vl-3b / gemma-3-4b, random weights, built on the
# GPU); the model goes to MODEL (default /tmp/<shape>-<family>) and the family's own server flags
# (gemma3: --enable-multimodal) join SGLANG_GPU_FLAGS, then EXTRA_FLAGS (e.g. a larger
# --mem-fraction-static for a real-size model). The nsys phase also writes OUTDIR/families.json/.csv
# (summarize_families.py: per request, the multimodal stages, unobserved, cache outcomes, coverage,
# and the encoder's CUDA-event time against the kernels in its NVTX range).
#
# Phases: doctor (sglang-mmtrace doctor), ipc (default feature transport), cpu (--mm-feature-transport
# cpu), nsys (ipc under Nsight Systems: records, the sqlite export trimmed, `sglang-mmtrace nsys`),
# overhead (the plugin's cost: same-instance on/off by the runtime switch, ablation by part, throughput,
# then the two-server crossover if time is left: benchmarks/gpu/overhead_017.py, results in OUTDIR/overhead).
# Env: SGLANG_GPU_FLAGS (server flags), ROUNDS (5), BUDGET_S (570), NSYS (nsys binary),
# QDSTRM_IMPORTER + NSYS_IMPORTER_LIBS (only where `nsys profile` stops at a .qdstrm, as on the H200 here).
set -u
OUT=${1:?usage: gpu_check.sh OUTDIR [PHASE ...]}; shift
PHASES=${*:-doctor ipc cpu}
T0=$(date +%s); DEADLINE=$((T0 + ${BUDGET_S:-570})); ROUNDS=${ROUNDS:-5}
NSYS=${NSYS:-nsys}; export NSYS
mkdir -p "$OUT"
log() { echo "[$(date +%H:%M:%S) +$(( $(date +%s) - T0 ))s] $*"; }
nvidia-smi --query-gpu=name,driver_version,memory.used,memory.total --format=csv,noheader
python3 -c "import sglang, torch, importlib.metadata as m; print('sglang', m.version('sglang'), 'torch', torch.__version__)"
FAMILY=${FAMILY:-qwen3-vl}; SHAPE=${SHAPE:-tiny}
if [ "$FAMILY" = qwen3-vl ]; then MODEL=${MODEL:-/tmp/$SHAPE-qwen3vl}; else MODEL=${MODEL:-/tmp/$SHAPE-$FAMILY}; fi
log "building $FAMILY $SHAPE into $MODEL"
python3 -m sglang_mmtrace.harness.families "$MODEL" --family "$FAMILY" --shape "$SHAPE" || { log "model build failed"; exit 3; }
log "model ready: $(du -sh "$MODEL" | cut -f1)"
FAMILY_FLAGS=$(python3 -c "import sys; from sglang_mmtrace.harness.families import families; print(' '.join(families()[sys.argv[1]].server_args))" "$FAMILY")
export SGLANG_GPU_FLAGS="${SGLANG_GPU_FLAGS:-} $FAMILY_FLAGS ${EXTRA_FLAGS:-}"
drive() { python3 benchmarks/gpu/drive_017.py --model "$MODEL" --out "$OUT" --rounds "$ROUNDS" --deadline "$DEADLINE" "$@"; }
server_log() { [ -f "/tmp/server_$1.log" ] && { echo "===== server_$1.log"; grep -aiE "mmtrace|transport|Traceback|Error|profil" "/tmp/server_$1.log" | grep -v "server_args=" | head -40; echo "----- tail"; tail -n 30 "/tmp/server_$1.log" | cut -c1-400; } >> "$OUT/server_logs.txt" 2>&1; }
for phase in $PHASES; do
  log "phase $phase"
  case $phase in
    doctor) { python3 -m sglang_mmtrace.cli.main doctor; echo "doctor exit $?"; } > "$OUT/doctor.txt" 2>&1 ;;
    ipc) drive --label ipc --port 30000; server_log ipc ;;
    cpu) drive --label cpu --port 30001 -- --mm-feature-transport cpu; server_log cpu ;;
    nsys)
      P=/tmp/mmtrace_nsys; rm -f $P.*
      drive --label nsys --port 30002 --nsys $P; server_log nsys
      if [ ! -f $P.nsys-rep ] && [ -f $P.qdstrm ] && [ -n "${QDSTRM_IMPORTER:-}" ]; then
        LD_LIBRARY_PATH=${NSYS_IMPORTER_LIBS:-} "$QDSTRM_IMPORTER" --input-file $P.qdstrm > /dev/null
      fi
      ls -la $P.* 2>&1 | sed 's/^/  /'
      "$NSYS" export --type sqlite --force-overwrite true -o $P.sqlite $P.nsys-rep > /dev/null && \
        python3 benchmarks/gpu/trim_nsys_sqlite.py $P.sqlite "$OUT/nsys_trimmed.sqlite" && \
        python3 -m sglang_mmtrace.cli.main nsys $P.sqlite --records "$OUT/records_nsys.jsonl" | tee "$OUT/nsys_summary.txt"
      python3 benchmarks/gpu/summarize_families.py collect --family "$FAMILY" --shape "$SHAPE" \
        --summary "$OUT/summary_nsys.json" --records "$OUT/records_nsys.jsonl" --sqlite $P.sqlite --out "$OUT"
      ;;
    overhead) python3 benchmarks/gpu/overhead_017.py --model "$MODEL" --out "$OUT/overhead" --deadline "$DEADLINE" ;;
    *) log "unknown phase $phase" ;;
  esac
  log "phase $phase done"
done
for l in ipc cpu nsys; do
  [ -f "$OUT/records_$l.jsonl" ] && { echo "== $l: all records"; python3 -m sglang_mmtrace.cli.main report "$OUT/records_$l.jsonl"; } >> "$OUT/report.txt" 2>&1
done
log "finished"
