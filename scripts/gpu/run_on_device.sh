#!/usr/bin/env bash
# Builds and checks the fused CUDA attention on a GPU device machine, in one call of the
# device tool. The machine has CUDA (nvcc, compute-sanitizer, cuobjdump), CMake, ninja, a
# compiler and PyTorch (whose LibTorch, with CUDA, this build uses), but no network: the
# Debian packages extrap also needs come along in .debs/ (scripts/gpu/fetch_debs.sh, run
# beforehand on a machine with network) and are unpacked into a private prefix, never /.
#
#   bash scripts/gpu/run_on_device.sh [STAGE...]     (default: build test sanitize bench)
#
# One device command may run 10 minutes; a cold build takes a few. Two calls in a row fit:
#   bash scripts/gpu/run_on_device.sh build test sanitize
#   bash scripts/gpu/run_on_device.sh build bench
# (the second finds build-gpu/ still there if the machine is still warm).
#
# Stages (each logs to $OUT/<stage>.log and prints a summary line; build is incremental, so
# a later call on a still-warm machine only relinks):
#   build     configure build-gpu/ against PyTorch's LibTorch + the prefix, build the CUDA
#             tests and benchmark; $OUT/device.txt gets the GPU, versions and the kernels'
#             register / shared-memory / spill report
#   test      extrap_cuda_tests (every [cuda] test)
#   sanitize  compute-sanitizer memcheck and racecheck on the [sanitize] subset
#   bench     extrap bench attention --device cuda -> $OUT/attention_cuda.jsonl (copy it to
#             benchmarks/results/ on the development machine)
# Extra arguments for the benchmark: BENCH_ARGS="--lengths 512,2048 --head-dims 128".
# shellcheck disable=SC2317  # the stage_* functions are called by name
set -uo pipefail

REPO=$(cd "$(dirname "$0")/../.." && pwd)
cd "$REPO" || exit 1
OUT=${OUT:-$REPO/build-gpu/out}
BUILD=$REPO/build-gpu
PREFIX=$BUILD/prefix
mkdir -p "$OUT" "$BUILD"
stages=("$@")
((${#stages[@]})) || stages=(build test sanitize bench)
status=0
summary() { echo "== $*" | tee -a "$OUT/summary.txt"; }

# --- environment: the unpacked packages and CUDA --------------------------------------
setup_prefix() {
  if [[ ! -d .debs/main ]]; then
    summary "no .debs/main: run scripts/gpu/fetch_debs.sh here first and carry .debs"
    return 1
  fi
  if [[ ! -f $PREFIX/.unpacked ]]; then
    rm -rf "$PREFIX"
    mkdir -p "$PREFIX"
    for deb in .debs/main/*.deb; do dpkg -x "$deb" "$PREFIX"; done
    touch "$PREFIX/.unpacked"
  fi
  local lib=$PREFIX/usr/lib/x86_64-linux-gnu
  export LD_LIBRARY_PATH=$lib:$lib/hdf5/serial${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
  # HDF5's own dependencies (curl, ssl, ...): the machine's copies if it has them.
  if ldd "$lib/libhdf5_serial.so.103" | grep -q 'not found'; then
    if [[ -d .debs/fallback && ! -f $PREFIX/fallback/.unpacked ]]; then
      mkdir -p "$PREFIX/fallback"
      for deb in .debs/fallback/*.deb; do dpkg -x "$deb" "$PREFIX/fallback"; done
      touch "$PREFIX/fallback/.unpacked"
    fi
    export LD_LIBRARY_PATH=$LD_LIBRARY_PATH:$PREFIX/fallback/usr/lib/x86_64-linux-gnu:$PREFIX/fallback/lib/x86_64-linux-gnu
  fi
  if ldd "$lib/libhdf5_serial.so.103" | grep 'not found'; then
    summary "HDF5 still misses libraries (above)"
    return 1
  fi
  for dir in /usr/local/cuda/bin /usr/local/cuda/compute-sanitizer; do
    [[ -d $dir ]] && export PATH=$PATH:$dir
  done
  return 0
}

# --- stages ---------------------------------------------------------------------------
stage_build() {
  local log=$OUT/build.log
  {
    echo "date: $(date -u +%FT%TZ)"
    nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.max.sm --format=csv
    nvcc --version | tail -2
    python3 -c 'import torch; print("torch", torch.__version__, "cuda", torch.version.cuda)'
    cmake --version | head -1
    c++ --version | head -1
  } >"$OUT/device.txt" 2>&1
  local torch_prefix generator=()
  torch_prefix=$(python3 -c 'import torch; print(torch.utils.cmake_prefix_path)') || return 1
  command -v ninja >/dev/null && generator=(-G Ninja)
  local p=$PREFIX/usr
  # TORCH_CUDA_ARCH_LIST: PyTorch's CMake adds its own -gencode flags; keep them to sm_90.
  # HDF5: the wrappers (h5cc) are not used; HDF5_ROOT names the library and include roots.
  if [[ ! -f $BUILD/CMakeCache.txt ]]; then
    TORCH_CUDA_ARCH_LIST=9.0 cmake -S . -B "$BUILD" "${generator[@]}" \
      -DCMAKE_BUILD_TYPE=Release \
      -DCMAKE_PREFIX_PATH="$torch_prefix;$p" \
      -DHDF5_ROOT="$p/lib/x86_64-linux-gnu;$p/include" \
      -DHDF5_C_COMPILER_EXECUTABLE= -DHDF5_CXX_COMPILER_EXECUTABLE= \
      -DCMAKE_CUDA_COMPILER="$(command -v nvcc)" \
      -DEXTRAP_CUDA_ARCHITECTURES=90 \
      -DCMAKE_POLICY_VERSION_MINIMUM=3.5 >"$log" 2>&1 || { tail -40 "$log"; return 1; }
  fi
  grep -E "extrap:|Found Torch|CUDA compiler" "$log" | head -8
  TORCH_CUDA_ARCH_LIST=9.0 cmake --build "$BUILD" --parallel "$(nproc)" \
    --target extrap_cuda_tests extrap_cli >>"$log" 2>&1 || {
    grep -E "error|Error" "$log" | head -40
    tail -20 "$log"
    return 1
  }
  {
    echo "--- kernel resources (registers, shared memory, spills)"
    cuobjdump --dump-resource-usage "$BUILD/core/attention/cuda/libextrap_cuda_kernels.a" 2>&1 |
      grep -E "Function|REG|STACK|SHARED" | sed 's/^ *//' | paste - - | cut -c1-220
    echo "--- tensor-core instructions in the SASS (HMMA expected)"
    cuobjdump --dump-sass "$BUILD/core/attention/cuda/libextrap_cuda_kernels.a" 2>/dev/null |
      grep -oE "HMMA[.A-Z0-9]*|HGMMA[.A-Z0-9]*|LDSM[.A-Z0-9]*" | sort | uniq -c
  } >>"$OUT/device.txt" 2>&1
  return 0
}

stage_test() {
  "$BUILD/tests/extrap_cuda_tests" "[cuda]" --durations yes >"$OUT/test.log" 2>&1
  local rc=$?
  tail -25 "$OUT/test.log"
  return "$rc"
}

stage_sanitize() {
  local rc=0 tool
  for tool in memcheck racecheck; do
    timeout 150 compute-sanitizer --tool "$tool" --error-exitcode 99 \
      "$BUILD/tests/extrap_cuda_tests" "[sanitize]" >"$OUT/$tool.log" 2>&1
    local r=$?
    echo "$tool: exit $r"
    grep -E "ERROR SUMMARY|RACECHECK SUMMARY|Invalid|Race|hazard" "$OUT/$tool.log" | head -10
    ((r == 0)) || rc=1
  done
  return "$rc"
}

stage_bench() {
  # shellcheck disable=SC2086
  "$BUILD/extrap" bench attention --device cuda --out "$OUT/attention_cuda.jsonl" ${BENCH_ARGS:-} \
    >"$OUT/bench.log" 2>&1
  local rc=$?
  tail -120 "$OUT/bench.log"
  return "$rc"
}

setup_prefix || exit 1
for stage in "${stages[@]}"; do
  start=$SECONDS
  if declare -F "stage_$stage" >/dev/null; then
    "stage_$stage"
    rc=$?
  else
    echo "unknown stage '$stage' (build, test, sanitize, bench)"
    rc=2
  fi
  summary "$stage: $([[ $rc == 0 ]] && echo ok || echo "FAILED ($rc)") in $((SECONDS - start)) s"
  if ((rc != 0)); then
    status=1
    [[ $stage == build ]] && break
  fi
done
exit $status
