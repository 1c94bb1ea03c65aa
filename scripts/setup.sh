#!/usr/bin/env bash
# Sets up extrap on Debian (bookworm) or a derivative: the system packages, then the default
# corpus (data/pydoc, see scripts/make_default_corpus.py). Idempotent and quiet when there is
# nothing to do: packages are installed only if dpkg says they are missing (and apt-get update
# runs only then); the corpus is rebuilt only if its sources or its build script changed.
#
# Usage: scripts/setup.sh [STEP...]    STEP: deps | corpus | build | all (default: all)
#
# Each step is a function step_NAME; "all" runs ALL_STEPS in order. A new step is one function
# and one entry in ALL_STEPS.
set -euo pipefail

ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
ALL_STEPS=(deps corpus build)

PACKAGES=(
  libtorch-dev libopenblas0-pthread libyaml-cpp-dev libboost-program-options-dev libhdf5-dev
  catch2 python3-h5py python3-matplotlib python3-torch python3.11-doc cmake g++ make
)

installed() {
  [[ "$(dpkg-query -W -f='${Status}' "$1" 2>/dev/null)" == "install ok installed" ]]
}

step_deps() {
  local missing=() package
  for package in "${PACKAGES[@]}"; do
    installed "$package" || missing+=("$package")
  done
  ((${#missing[@]} == 0)) && return 0
  local as_root=()
  ((EUID == 0)) || as_root=(sudo)
  echo "setup: installing ${missing[*]}"
  "${as_root[@]}" env DEBIAN_FRONTEND=noninteractive apt-get update -q
  "${as_root[@]}" env DEBIAN_FRONTEND=noninteractive \
    apt-get install -y -q --no-install-recommends "${missing[@]}"
}

step_corpus() {
  # /usr/bin/python3 is Debian's, whatever python3 comes first on PATH.
  /usr/bin/python3 "$ROOT/scripts/make_default_corpus.py" --out "$ROOT/data/pydoc"
}

step_build() {
  # One CMake build in build/ (Release, warnings on); make only rebuilds what changed.
  local jobs
  jobs=$(nproc 2>/dev/null || echo 2)
  if [[ ! -f "$ROOT/build/CMakeCache.txt" ]]; then
    cmake -S "$ROOT" -B "$ROOT/build" -DCMAKE_BUILD_TYPE=Release >/dev/null
  fi
  cmake --build "$ROOT/build" --parallel "$jobs" -- --no-print-directory -s
}

usage() {
  echo "usage: $0 [$(IFS='|'; echo "${ALL_STEPS[*]}")|all]..." >&2
  exit 2
}

main() {
  local steps=() step
  (($# == 0)) && set -- all
  for step in "$@"; do
    case "$step" in
      all) steps+=("${ALL_STEPS[@]}") ;;
      *) declare -F "step_$step" >/dev/null || usage; steps+=("$step") ;;
    esac
  done
  for step in "${steps[@]}"; do
    "step_$step"
  done
}

main "$@"
