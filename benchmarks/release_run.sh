#!/usr/bin/env bash
# One real CPU run of another SGLang release with the plugin on, backing the static manifest check
# (sglang_mmtrace/manifest_check.py) with records: a venv with that release, `sglang-mmtrace doctor`
# there, then `sglang-mmtrace demo` (the real server, tiny Qwen3-VL, the reference requests).
#
#   benchmarks/release_run.sh 0.5.20 benchmarks/results/release-0.5.20-cpu-YYYYMMDD [ROUNDS]
#
# The venv is /tmp/venv-<version without dots> (kept for reruns). The release's own requirements are installed
# from its wheel's metadata except those that only download from pypi.nvidia.com at build time
# (`cuda-tile`, a CUDA compiler the CPU build never imports), which a machine without that host
# cannot install. Everything comes from PyPI: the machine's pip configuration (find-links, extra
# indexes) is left out, as it offers a CPU-only torch build that PyPI's torchvision (built against
# PyPI's CUDA torch) cannot load with; PyPI's torch runs on the CPU, as 0.5.23's does in CI.
# OUTDIR gets: requirements.txt, install.txt, versions.txt, doctor.txt, demo.txt, records.jsonl.
set -euo pipefail
version=${1:?SGLang version}
out=${2:?output folder}
rounds=${3:-5}
repo=$(cd "$(dirname "$0")/.." && pwd)
venv=/tmp/venv-${version//./}
mkdir -p "$out"
out=$(cd "$out" && pwd)

if [[ ! -x $venv/bin/sglang-mmtrace ]]; then
  python3 -m venv "$venv"
  wheel=$(PYTHONPATH=$repo python3 -c "from sglang_mmtrace.manifest_check import wheel; print(wheel('$version'))")
  unzip -p "$wheel" "sglang-${version}.dist-info/METADATA" | sed -n 's/^Requires-Dist: //p' | grep -v 'extra ==' \
    | grep -v '^cuda-tile' >"$out/requirements.txt"
  pip=(env -u PIP_FIND_LINKS PIP_CONFIG_FILE=/dev/null nice -n 10 "$venv/bin/pip" install -q)
  {
    "${pip[@]}" --no-deps "sglang==${version}"
    "${pip[@]}" -r "$out/requirements.txt"
    "${pip[@]}" -e "$repo"
  } 2>&1 | sed '/^WARNING: Location/d' | tee "$out/install.txt"
fi
"$venv/bin/pip" list 2>/dev/null | grep -iE '^(sglang|torch|transformers|sglang-mmtrace) ' >"$out/versions.txt"

# The worktree's plugin, not another checkout's (PYTHONPATH first, inherited by the server).
export PYTHONPATH=$repo
nice -n 10 "$venv/bin/sglang-mmtrace" doctor >"$out/doctor.txt" 2>&1 || true
nice -n 10 "$venv/bin/sglang-mmtrace" demo --jsonl "$out/records.jsonl" --rounds "$rounds" 2>&1 | tee "$out/demo.txt"
