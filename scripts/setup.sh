#!/usr/bin/env bash
# Sets up extrap on Debian (bookworm) or a derivative, in four steps:
#   deps    the Debian packages: compiler, CMake, and the C++ libraries that are not LibTorch
#           (yaml-cpp, Boost.Program_options, HDF5 C++, Catch2, nlohmann-json, xxhash,
#           SentencePiece; gloo's
#           headers, which c10d's ProcessGroupGloo.hpp includes: LibTorch carries gloo itself), the
#           Python 3.11 documentation (the default corpus' text), python3-venv where needed
#   python  the project's virtual environment .venv/ (git-ignored) with requirements.txt: every
#           Python package pinned exactly, PyTorch's wheel among them. Its LibTorch (headers,
#           CMake package, libtorch_cpu and libtorch_cuda) is what extrap builds against;
#           and the cuDNN frontend's C++ headers in .venv/cudnn-frontend (scripts/cudnn_frontend.sh).
#   corpus  the default corpus, data/pydoc (scripts/make_default_corpus.py)
#   build   CMake + make into build/
# Idempotent and quiet when there is nothing to do: packages are installed only if dpkg says
# they are missing (apt-get update runs only then); the environment is rebuilt only when
# requirements.txt or the interpreter changed (a stamp in .venv/); the corpus only when its
# sources changed; make rebuilds only what changed.
#
# Usage: scripts/setup.sh [STEP...]    STEP: deps | python | corpus | build | all (default)
#
# Environment:
#   EXTRAP_LIBTORCH  build against this LibTorch 2.x instead of the environment's: the
#                    directory of an unpacked libtorch archive, or any prefix that holds
#                    share/cmake/Torch (e.g. another Python's torch/share/cmake's parent).
#   EXTRAP_PYTHON    the interpreter the environment is made from (default: python3 on PATH
#                    if it is 3.11 or newer and can make virtual environments, else Debian's
#                    /usr/bin/python3).
#
# Each step is a function step_NAME; "all" runs ALL_STEPS in order.
set -euo pipefail

ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
ALL_STEPS=(deps python corpus build)
VENV=$ROOT/.venv
REQUIREMENTS=$ROOT/requirements.txt

PACKAGES=(
  cmake g++ make libyaml-cpp-dev libboost-program-options-dev libhdf5-dev catch2
  nlohmann-json3-dev libxxhash-dev libgloo-dev libsentencepiece-dev python3.11-doc libpcre2-dev libicu-dev
)

# Free space the python step needs, in GB: .venv (PyTorch with its CUDA libraries) and, at
# their peak, pip's downloads and unpacked wheels in TMPDIR, each with a margin (their sizes
# are in benchmarks/RESULTS.md). On one filesystem, both.
VENV_NEEDS_GB=6
UNPACK_NEEDS_GB=5

# check_free_space DIR GB WHAT: refuses, in one line, to start when DIR's filesystem has less
# than GB gigabytes free, rather than failing half-way with pip's "No space left on device".
check_free_space() {
  local dir=$1 need=$2 what=$3 free_kb
  free_kb=$(df -Pk "$dir" 2>/dev/null | awk 'NR == 2 {print $4}')
  [[ -n "$free_kb" ]] || return 0
  if ((free_kb < need * 1024 * 1024)); then
    echo "setup: $dir has $((free_kb / 1024 / 1024)) GB free; $what needs about $need GB: free some space and run scripts/setup.sh again" >&2
    exit 1
  fi
}

installed() {
  [[ "$(dpkg-query -W -f='${Status}' "$1" 2>/dev/null)" == "install ok installed" ]]
}

# The interpreter the environment is made from: EXTRAP_PYTHON, else python3 on PATH when it
# is new enough and has venv and ensurepip, else Debian's (which may still need python3-venv).
base_python() {
  if [[ -n "${EXTRAP_PYTHON:-}" ]]; then
    echo "$EXTRAP_PYTHON"
    return
  fi
  local candidate
  candidate=$(command -v python3 || true)
  if [[ -n "$candidate" ]] &&
     "$candidate" -c 'import sys, venv, ensurepip; sys.exit(sys.version_info < (3, 11))' 2>/dev/null; then
    echo "$candidate"
  else
    echo /usr/bin/python3
  fi
}

step_deps() {
  local wanted=("${PACKAGES[@]}") missing=() package python
  python=$(base_python)
  if [[ "$python" == /usr/bin/python3* ]]; then
    # Debian's interpreter makes environments only with python3-venv, and torch.compile
    # (the compiled PyTorch baseline) needs Python.h from python3-dev.
    wanted+=(python3-venv python3-dev)
  fi
  for package in "${wanted[@]}"; do
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

step_python() {
  local python stamp
  python=$(base_python)
  stamp="$("$python" -c 'import sys; print(sys.executable, sys.version.split()[0])') $(sha256sum "$REQUIREMENTS" | cut -c1-16)"
  if [[ -f "$VENV/.extrap-stamp" && "$(cat "$VENV/.extrap-stamp")" == "$stamp" ]]; then
    cudnn_frontend_headers
    return 0
  fi
  echo "setup: making $VENV from $python and requirements.txt (PyTorch's wheel is about 4 GB with its CUDA libraries)"
  rm -rf "$VENV"
  local tmp=${TMPDIR:-/tmp}
  if [[ "$(stat -c %d "$ROOT")" == "$(stat -c %d "$tmp")" ]]; then
    check_free_space "$ROOT" $((VENV_NEEDS_GB + UNPACK_NEEDS_GB)) \
      "the environment .venv/ and pip's downloads and unpacking in $tmp"
  else
    check_free_space "$ROOT" "$VENV_NEEDS_GB" "the environment .venv/"
    check_free_space "$tmp" "$UNPACK_NEEDS_GB" "pip's downloads and unpacking (TMPDIR)"
  fi
  "$python" -m venv "$VENV"
  # --no-cache-dir: a cached copy of the wheels would cost another 4 GB for nothing.
  "$VENV/bin/python" -m pip install --quiet --disable-pip-version-check --require-virtualenv \
    --no-input --no-cache-dir -r "$REQUIREMENTS" || {
    echo "setup: installing requirements.txt into $VENV failed (see pip's message above); $VENV removed" >&2
    rm -rf "$VENV"
    exit 1
  }
  "$VENV/bin/python" -c 'import torch, numpy, h5py, matplotlib, safetensors, yaml, tensorboard, sentencepiece, transformers'
  echo "$stamp" >"$VENV/.extrap-stamp"
  cudnn_frontend_headers
}

# The cuDNN frontend's headers for extrap's cuDNN attention (scripts/cudnn_frontend.sh). Without
# them extrap builds and runs; on a GPU causal ALiBi then takes extrap's own kernels.
cudnn_frontend_headers() {
  bash "$ROOT/scripts/cudnn_frontend.sh" "$VENV/cudnn-frontend" "$VENV/bin/python" ||
    echo "setup: going on without the cuDNN frontend's headers" >&2
}

step_corpus() {
  "$VENV/bin/python" "$ROOT/scripts/make_default_corpus.py" --out "$ROOT/data/pydoc"
}

# The CMake prefix that holds share/cmake/Torch: EXTRAP_LIBTORCH or the environment's torch.
torch_prefix() {
  if [[ -n "${EXTRAP_LIBTORCH:-}" ]]; then
    [[ -d "$EXTRAP_LIBTORCH/share/cmake/Torch" ]] || {
      echo "setup: EXTRAP_LIBTORCH=$EXTRAP_LIBTORCH has no share/cmake/Torch (expected an unpacked libtorch or a prefix holding one)" >&2
      exit 1
    }
    echo "$EXTRAP_LIBTORCH"
  else
    "$VENV/bin/python" -c 'import pathlib, torch; print(pathlib.Path(torch.utils.cmake_prefix_path).parent.parent)'
  fi
}

step_build() {
  # One CMake build in build/ (Release, warnings on); make only rebuilds what changed. The
  # build is configured afresh when the LibTorch it was configured against changes.
  local jobs prefix configured=""
  jobs=$(nproc 2>/dev/null || echo 2)
  prefix=$(torch_prefix)
  [[ -f "$ROOT/build/.extrap-libtorch" ]] && configured=$(cat "$ROOT/build/.extrap-libtorch")
  if [[ ! -f "$ROOT/build/CMakeCache.txt" || "$configured" != "$prefix" ]]; then
    rm -rf "$ROOT/build"
    mkdir -p "$ROOT/build"
    cmake -S "$ROOT" -B "$ROOT/build" -DCMAKE_BUILD_TYPE=Release \
      -DCMAKE_PREFIX_PATH="$prefix" -DEXTRAP_PYTHON="$VENV/bin/python" >"$ROOT/build/configure.log" 2>&1 || {
      cat "$ROOT/build/configure.log" >&2
      exit 1
    }
    echo "$prefix" >"$ROOT/build/.extrap-libtorch"
  fi
  # The whole log goes to build/build.log; the terminal sees what was compiled or linked, and
  # warnings and errors, so that a build with nothing to do prints nothing.
  cmake --build "$ROOT/build" --parallel "$jobs" -- --no-print-directory 2>&1 | tee "$ROOT/build/build.log" |
    { grep --line-buffered -E '(Building|Linking) |warning|error|Error' || true; }
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
