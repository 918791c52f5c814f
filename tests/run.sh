#!/usr/bin/env bash
# The test command (README "Set-up", and .ci/run calls it): tests/run.sh [--quick] [pytest arguments]
#
# --quick: only the tests that start no server (pytest -m "not server"), for the inner loop.
# Some tests need Debian packages as real peers: prometheus + promtool (metrics, dashboard and
# shipped-config tests), headless chromium (report --html) and ffmpeg (video requests). Any that are missing are installed
# with apt-get first (as root, or through password-less sudo). Where that is not possible (no
# apt-get, not root, apt-get failed) this says so and runs the tests anyway: those that need a
# missing peer skip, and -rfEs puts each skip's reason (the package to install) in the summary.
# Without -q pytest prints one progress line per test module. The whole suite takes about
# 30 minutes on 2 cores (it starts real SGLang servers on the CPU); --quick about 2.
set -uo pipefail
cd "$(dirname "$0")/.."

tier=()
if [[ ${1:-} == --quick ]]; then
  shift
  tier=(-m "not server")
fi

have() { command -v "$1" >/dev/null 2>&1; }

packages=()
{ have prometheus && have promtool; } || packages+=(prometheus)
{ have chromium || have chromium-browser; } || packages+=(chromium)
have ffmpeg || packages+=(ffmpeg)  # SGLang's video decoder (torchcodec) loads its libraries; the tests make videos with it

if ((${#packages[@]})); then
  echo "tests/run.sh: test peers missing, installing the Debian packages: ${packages[*]}" >&2
  as_root=()
  [[ $(id -u) -eq 0 ]] || as_root=(sudo -n)
  problem=""
  if ! have apt-get; then
    problem="no apt-get on this machine"
  elif ((${#as_root[@]})) && ! { have sudo && sudo -n true 2>/dev/null; }; then
    problem="not root and no password-less sudo"
  elif ! "${as_root[@]}" apt-get update -qq \
    || ! "${as_root[@]}" env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${packages[@]}" >/dev/null; then
    problem="apt-get failed (output above)"
  fi
  if [[ -n $problem ]]; then
    echo "tests/run.sh: cannot install ${packages[*]}: $problem. Continuing: the tests that need them" \
      "will be skipped (reasons in the summary). Install with: apt-get install -y ${packages[*]}" >&2
  fi
fi

exec python3 -m pytest -rfEs "${tier[@]}" "$@"
