#!/usr/bin/env bash
# Issue 14 on the H200 (SGLang 0.5.17, random-weight Qwen3-VL): the resolution sweep with both
# feature transports and the concurrency tail at 1/4/16/64 streams, each with its report --html.
#
#   [SHAPE=tiny|qwen3-vl-2b|qwen3-vl-4b] [RES_N=ROUNDS] [RES_DEADLINE=EPOCH_S] [CONC_DEADLINE=EPOCH_S] \
#     benchmarks/gpu/analysis_017.sh OUTDIR [MODEL_DIR]
#
# SHAPE (default tiny) is the model's shape, built into MODEL_DIR (default /tmp/<shape>-qwen3vl) when
# missing; RES_N sets the resolution rounds per launch (default: the bench's, 10).
#
# The deadlines (bench --deadline: no new request after it) keep both experiments inside one device call.
# Runs after the three install steps of ../shared/gpu/README.md (env.sh sourced, the project's
# wheel first on PYTHONPATH). Every command is the user's: `sglang-mmtrace bench --launcher gpu`
# with default rounds, timed with `date`, so the README's "default run under 5 minutes" is checked
# here. Writes OUTDIR/{resolution,concurrency}.{jsonl,json,html,txt} and OUTDIR/timing.txt.
set -uo pipefail
out=${1:?usage: analysis_017.sh OUTDIR [MODEL_DIR]}
model=${2:-/tmp/${SHAPE:-tiny}-qwen3vl}
mkdir -p "$out"
python3 -m sglang_mmtrace.harness.families "$model" --shape "${SHAPE:-tiny}" || exit 3
flags="--model-path $model $SGLANG_GPU_FLAGS"
mm() { python3 -m sglang_mmtrace.cli.main "$@"; }

t0=$(date +%s)
mm bench --launcher gpu --work-dir /tmp/mmtrace-analysis-work \
  --launch "$flags --mm-feature-transport cuda_ipc" --launch "$flags --mm-feature-transport cpu" \
  --experiment resolution ${RES_N:+--n $RES_N} ${RES_DEADLINE:+--deadline $RES_DEADLINE} --out "$out/resolution.jsonl" >"$out/resolution.txt" 2>"$out/resolution.log"
echo "resolution (2 launches, ${RES_N:-default 10} rounds, shape ${SHAPE:-tiny}): rc $? in $(($(date +%s) - t0)) s" | tee -a "$out/timing.txt"
mm report "$out/resolution.jsonl" --html "$out/resolution.html" >/dev/null 2>>"$out/resolution.log"

t0=$(date +%s)
mm bench --launcher gpu --work-dir /tmp/mmtrace-analysis-work --launch "$flags --mm-feature-transport cuda_ipc" \
  --experiment concurrency ${CONC_DEADLINE:+--deadline $CONC_DEADLINE} --out "$out/concurrency.jsonl" >"$out/concurrency.txt" 2>"$out/concurrency.log"
echo "concurrency (1 launch, 1/4/16/64 streams, shape ${SHAPE:-tiny}): rc $? in $(($(date +%s) - t0)) s" | tee -a "$out/timing.txt"
mm report "$out/concurrency.jsonl" --html "$out/concurrency.html" >/dev/null 2>>"$out/concurrency.log"
tail -c 3000 "$out/resolution.txt"; tail -c 2500 "$out/concurrency.txt"
