#!/usr/bin/env bash
# The same-instance overhead phase (with its A/A control) for one wheel of the plugin, optionally
# reduced to its bare-wrapper skeleton: how the GPU runs of issue 11 compared plugin versions, or the
# plugin and its skeleton, one after the other on one warm machine.
#
#   benchmarks/gpu/overhead_wheel.sh LABEL WHEELDIR [N] [DEADLINE_S] [skeleton]
#
# Runs after the three install steps of ../shared/gpu/README.md, with env.sh sourced. WHEELDIR holds
# the plugin's wheel (plus any wheel it needs that the bundle lacks) and a file COMMIT naming its
# commit. The wheel goes into /tmp/site-p-LABEL, first on PYTHONPATH; with `skeleton`,
# benchmarks/skeleton.py rewrites that copy. The server is started from outside the checkout
# (/tmp/wd): `python -m sglang.launch_server` puts the working directory first on sys.path, and from
# the repository root it would import the checkout's plugin instead of the wheel (run_info.json's
# sglang_mmtrace_file says which one ran). N rounds per kind (200); no new request after
# DEADLINE_S seconds from the start (420). Writes /tmp/o-LABEL and $OUT/o-LABEL.tgz.
set -u
t0=$(date +%s)
label=${1:?usage: overhead_wheel.sh LABEL WHEELDIR [N] [DEADLINE_S] [skeleton]}
wheels=$(cd "${2:?WHEELDIR}" && pwd)
n=${3:-200}
deadline=${4:-420}
repo=$(pwd)
site=/tmp/site-p-$label
rm -rf "$site"
python3 -m pip install -q --no-index --no-deps --target "$site" "$wheels"/*.whl || exit 5
if [[ ${5:-} == skeleton ]]; then python3 benchmarks/skeleton.py "$site" || exit 6; fi
# /tmp/site-d: the bundle's deps wheels, installed from a fourth folder (stage-d) in a call of their own to
# keep each carry under 64 MiB; env.sh does not put it on the path.
export PYTHONPATH=$site:${PYTHONPATH:-}${PYTHONPATH:+:}/tmp/site-d MMTRACE_COMMIT=$(cat "$wheels/COMMIT")
out=/tmp/o-$label
mkdir -p /tmp/wd "$out" && cd /tmp/wd || exit 7
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader >"$out/gpu.txt"
python3 "$repo/benchmarks/gpu/overhead_017.py" --out "$out" --deadline $((t0 + deadline)) \
  --server-flags "$SGLANG_GPU_FLAGS --enable-metrics" --phases overhead --n "$n" --control 2>&1 | tee "$out/console.log"
tar czf "${OUT:-/tmp}/o-$label.tgz" -C /tmp "o-$label"
