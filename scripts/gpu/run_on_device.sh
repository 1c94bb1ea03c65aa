#!/usr/bin/env bash
# Builds and checks the fused CUDA attention on a GPU device machine, in one call of the
# device tool. The machine has CUDA (nvcc, compute-sanitizer, cuobjdump), CMake, ninja, a
# compiler and PyTorch (whose LibTorch, with CUDA, this build uses), but no network: the
# Debian packages extrap also needs come along in .debs/ (scripts/gpu/fetch_debs.sh, run
# beforehand on a machine with network) and are unpacked into a private prefix, never /.
#
#   bash scripts/gpu/run_on_device.sh [STAGE...]     (default: build test sanitize bench)
#
# One device command may run 10 minutes; a cold build takes 2-3. Carry .debs and data:
#   bash scripts/gpu/run_on_device.sh build test smoke sanitize
#   bash scripts/gpu/run_on_device.sh build bench
#   bash scripts/gpu/run_on_device.sh build flow trainbench
# A call that follows within the machine's warm window (30 s) finds build-gpu/ still there
# and only relinks.
#
# Stages (each logs to $OUT/<stage>.log and prints a summary line; build is incremental, so
# a later call on a still-warm machine only relinks):
#   build     configure build-gpu/ against PyTorch's LibTorch + the prefix, build the CUDA
#             tests and benchmark; $OUT/device.txt gets the GPU, versions and the kernels'
#             register / shared-memory / spill report
#   test      extrap_cuda_tests (every [cuda] and [runtime] test; TEST_SPEC="[cuda]~name*" leaves some out)
#   graphdiag each CUDA-graph test alone in a fresh process, one that crashes under cuda-gdb
#   smoke     `extrap train` on CUDA (bf16, configs/train_quick.yaml, 200 steps, evaluation to
#             16x L; needs data/pydoc: carry "data") -> $OUT/train_cuda.json
#   flow      rotary trained on CUDA, eval with windows and YaRN, one NCCL rank, a small sweep
#   gpuflow   the whole journey, a verdict a step (scripts/gpu/gpuflow.sh): the CUDA graph on and
#             off, kill -9 and resume, windows and YaRN, retrieval, export, NCCL, sweeps with
#             --jobs 1 and 2, the report (needs data/pydoc: carry "data")
#   paper     configs/gpu_paper.yaml (5 methods at L 512 to 16x L) and its report -> $OUT/gpu_paper*
#             (PAPER_ARGS: more sweep arguments, e.g. "--set base.train.cuda_graph=off")
#   paper_modern  the same on a Llama-style block: configs/gpu_paper_modern.yaml -> $OUT/gpu_paper_modern*
#   trainbench  extrap bench train against benchmarks/train_pytorch.py (eager, compiled)
#   trainab   issue 66 part 2: GPT-2-small training (ALiBi) with the new GPU paths off, on without
#             the CUDA LayerNorms, and on; rotary with them on; torch.compile once; the quick
#             shape against eager PyTorch -> $OUT/trainab.log
#   testshapes  the reference test under each forward tile shape (EXTRAP_FLASH_FWD_ROWS) and
#             dQ atomic width (EXTRAP_FLASH_BWD_ATOMICS; flash_dispatch.h)
#   atomics   the backward under each dQ atomic width, alternating -> $OUT/atomics.jsonl
#   graphbench  the training step as a CUDA graph (train.cuda_graph) against the eager step and
#             eager PyTorch, alternating; torch.compile once; the graphed step's profile
#   graphsmoke  `extrap train` on CUDA with train.cuda_graph on and off: throughput, loss curves
#   stepbench the GPU training step with each optimiser path (EXTRAP_FUSED_ADAMW), eager
#             PyTorch between, and their operator profiles
#   tune      extrap's fused kernels under each tile shape, alternating -> $OUT/tune.jsonl
#   profile   Nsight Compute on one forward and one backward kernel -> $OUT/ncu_*.txt
#   sanitize  compute-sanitizer memcheck and racecheck on the [sanitize] subset
#   bench     extrap bench attention --device cuda -> $OUT/attention_cuda.jsonl (copy it to
#             benchmarks/results/ on the development machine)
#   routes    issue 66: the GPU route table's tests ([gpu-routes]) and each route timed beside
#             FlexAttention-ALiBi and SDPA cuDNN -> $OUT/routes*.jsonl
#   pybench   benchmarks/attention_pytorch.py (FlexAttention, SDPA per backend, SDPA with a
#             bias) -> $OUT/attention_pytorch.jsonl
# What fitted on an H100, 2026-11-25: "build test smoke sanitize" (cold build 125-155 s, all
# of it 160 s); then "build test sanitize bench pybench" with PYBENCH_ARGS="--head-dims 128
# --lengths 4096,16384" ran out of the 10 minutes inside pybench (FlexAttention compiles each
# shape, and its learned-slopes backward took ~1 s a call); "build flow trainbench" with
# TRAINBENCH_ROUNDS=1 took 320 s cold. 2026-11-28 (H100): "build", then "paper" in the background
# (PAPER_ARGS="--set base.train.cuda_graph=off") while "graphdiag test gpuflow" ran: 411 s cold
# (build 83 s, paper 327 s); "build test graphdiag gpuflow": 168 s cold.
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
  # Ninja: keep going past a failed file, so that one call reports every compile error.
  local keep_going=()
  ((${#generator[@]})) && keep_going=(-- -k 0)
  TORCH_CUDA_ARCH_LIST=9.0 cmake --build "$BUILD" --parallel "$(nproc)" \
    --target extrap_cuda_tests extrap_cli "${keep_going[@]}" >>"$log" 2>&1 || {
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
  "$BUILD/tests/extrap_cuda_tests" "${TEST_SPEC:-[cuda],[runtime]}" --durations yes >"$OUT/test.log" 2>&1
  local rc=$?
  tail -25 "$OUT/test.log"
  return "$rc"
}

stage_graphdiag() {
  # Each CUDA-graph test alone in a fresh process; one that crashes runs again under cuda-gdb:
  # the backtrace, and the return addresses on the stack (a call through a null pointer leaves
  # no frame to unwind; the return address names its caller: issue 65's crash).
  local log=$OUT/graphdiag.log tests=$BUILD/tests/extrap_cuda_tests name rc=0
  {
    while IFS= read -r name; do
      [[ -n $name ]] || continue
      local spec=${name%%,*}*  # a comma separates test specs: the name up to its first one
      echo "### $name"
      timeout 180 "$tests" "$spec" 2>&1 | tail -30
      local r=${PIPESTATUS[0]}
      echo "### exit $r"
      ((r == 0)) && continue
      rc=1
      ((r >= 128)) || continue
      echo "### the bindings of std::filesystem (LD_DEBUG=bindings)"
      LD_DEBUG=bindings timeout 180 "$tests" "$spec" 2>&1 | grep -E "binding file .*filesystem" | sed 's/^ *[0-9]*:\t*//' | sort -u | head -20
      timeout 200 cuda-gdb -q -batch -ex "set pagination off" -ex run -ex "bt 40" -ex "info registers rip rsp" \
        -ex 'x/12a $rsp' --args "$tests" "$spec" 2>&1 | grep -vE "Cuda Driver error|^\[New Thread|^\[Thread .* exited" | tail -60
    done < <("$tests" --list-test-names-only "[graph]")
  } >"$log" 2>&1
  grep -E "^###|Segmentation|SIG|^#[0-9]|^0x" "$log" | head -80
  return "$rc"
}

stage_testshapes() {
  # The reference test under each forward tile shape (EXTRAP_FLASH_FWD_ROWS) and each width of
  # the backward's dQ atomics (EXTRAP_FLASH_BWD_ATOMICS) that is not the default (flash_dispatch.h).
  local rc=0 setting
  for setting in EXTRAP_FLASH_FWD_ROWS=64 EXTRAP_FLASH_FWD_ROWS=128 EXTRAP_FLASH_BWD_ATOMICS=1 \
                 EXTRAP_FLASH_BWD_ATOMICS=2; do
    env "$setting" "$BUILD/tests/extrap_cuda_tests" \
      "fused attention matches the reference: outputs and gradients" >"$OUT/test_$setting.log" 2>&1
    local r=$?
    echo "$setting: exit $r, $(grep -E "^test cases|All tests passed" "$OUT/test_$setting.log" | tail -1)"
    ((r == 0)) || rc=1
  done
  return "$rc"
}

stage_atomics() {
  # The backward under each width of its dQ atomics, alternating, the default (4) first and
  # last: fused-none and fused-alibi, causal and not, D 64 and 128 -> $OUT/atomics.jsonl.
  local rc=0 width
  for width in 4 1 2 4; do
    # shellcheck disable=SC2086
    EXTRAP_FLASH_BWD_ATOMICS=$width "$BUILD/extrap" bench attention --device cuda \
      --impls fused-none,fused-alibi --head-dims 64,128 --lengths 4096,16384 --passes forward+backward \
      --out "$OUT/atomics.jsonl" ${ATOMICS_ARGS:-} >>"$OUT/atomics.log" 2>&1 || rc=1
  done
  python3 - "$OUT/atomics.jsonl" <<'PY'
import collections, json, sys
rows = [json.loads(line) for line in open(sys.argv[1])]
table = collections.defaultdict(list)
for r in rows:
    table[(r["impl"], r["mode"], r["head_dim"], r["seq_len"])].append((r["kernel_shapes"].split()[-1], r["ms"]))
print("forward+backward ms (median of 20) per dQ atomic width, in run order")
for key, values in table.items():
    print(f"{key[0]:12} {key[1]:13} D {key[2]:3} T {key[3]:5}  " + "  ".join(f"{w}: {ms:.3f}" for w, ms in values))
PY
  return "$rc"
}

stage_tune() {
  # extrap's fused kernels under each forward tile shape, alternating, auto again at the end
  # (its two runs give the noise): -> $OUT/tune.jsonl. TUNE_ARGS adds benchmark arguments.
  local rc=0 rows
  for rows in auto 64 128 auto; do
    # shellcheck disable=SC2086
    EXTRAP_FLASH_FWD_ROWS=$rows "$BUILD/extrap" bench attention --device cuda \
      --impls fused-alibi,fused-none,fused-learned --head-dims 64,128 --lengths 4096,16384 \
      --out "$OUT/tune.jsonl" ${TUNE_ARGS:-} >>"$OUT/tune.log" 2>&1 || rc=1
  done
  "$BUILD/extrap" bench attention --device cuda --impls sdpa --head-dims 64,128 \
    --lengths 4096,16384 --out "$OUT/tune.jsonl" >>"$OUT/tune.log" 2>&1 || rc=1
  python3 - "$OUT/tune.jsonl" <<'PY'
import collections, json, sys
rows = [json.loads(line) for line in open(sys.argv[1])]
table = collections.defaultdict(list)
for r in rows:
    key = (r["impl"], r["mode"], r["head_dim"], r["seq_len"], r["pass"])
    table[key].append((r.get("kernel_shapes", ""), r["ms"]))
shapes = []
for r in rows:
    if r.get("kernel_shapes") not in shapes and r["impl"] != "sdpa":
        shapes.append(r.get("kernel_shapes"))
print("ms (median of 20) per kernel shape; sdpa = LibTorch SDPA without bias")
print(f"{'impl':12} {'mode':13} {'D':>3} {'T':>5} {'pass':16} " + " ".join(f"{s:>26}" for s in shapes) + "   sdpa")
sdpa = {(r["mode"], r["head_dim"], r["seq_len"], r["pass"]): r["ms"] for r in rows if r["impl"] == "sdpa"}
for key, values in table.items():
    if key[0] == "sdpa":
        continue
    cells = []
    for s in shapes:
        ms = [m for k, m in values if k == s]
        cells.append(" / ".join(f"{m:.3f}" if m is not None else "-" for m in ms))
    print(f"{key[0]:12} {key[1]:13} {key[2]:3} {key[3]:5} {key[4]:16} " + " ".join(f"{c:>26}" for c in cells)
          + f"   {sdpa.get(key[1:], float('nan')):.3f}")
PY
  return "$rc"
}

stage_profile() {
  # Nsight Compute on one forward and one backward kernel (fused-none, causal, D 128, T 4096):
  # the detailed set, then the warp stall reasons -> $OUT/ncu_*.txt.
  local ncu rc=0 pass kernel
  ncu=$(command -v ncu || ls /usr/local/cuda/bin/ncu /opt/nvidia/nsight-compute/*/ncu 2>/dev/null | head -1)
  [[ -n $ncu ]] || { echo "no ncu"; return 1; }
  for pass in forward forward+backward; do
    kernel=flash_fwd_kernel
    [[ $pass == forward+backward ]] && kernel=flash_bwd_kernel
    local bench=("$BUILD/extrap" bench attention --device cuda --impls fused-none --head-dims 128
                 --lengths 4096 --causal --passes "$pass" --warmup 2 --repeats 1 --out /tmp/ncu_bench.jsonl)
    timeout 150 "$ncu" --clock-control none --set detailed --kernel-name "regex:$kernel" \
      --launch-skip 2 --launch-count 1 "${bench[@]}" >"$OUT/ncu_$kernel.txt" 2>&1 || rc=1
    timeout 100 "$ncu" --clock-control none --kernel-name "regex:$kernel" --launch-skip 2 --launch-count 1 \
      --metrics "regex:smsp__average_warps_issue_stalled_.*_per_issue_active\.ratio" \
      "${bench[@]}" >"$OUT/ncu_stalls_$kernel.txt" 2>&1 || rc=1
    grep -E "Duration|Compute \(SM\) Throughput|Memory Throughput|Achieved Occupancy|Registers Per|Issue Slots Busy|Warp Cycles Per Issued|Shared Memory|Bank" "$OUT/ncu_$kernel.txt" | head -24
    grep -E "stalled" "$OUT/ncu_stalls_$kernel.txt" | sort -k3 -n -r | head -8
  done
  return "$rc"
}

stage_sanitize() {
  local rc=0 tool
  for tool in memcheck racecheck; do
    timeout 120 compute-sanitizer --tool "$tool" --error-exitcode 99 \
      "$BUILD/tests/extrap_cuda_tests" "[sanitize]" >"$OUT/$tool.log" 2>&1
    local r=$?
    echo "$tool: exit $r"
    grep -E "ERROR SUMMARY|RACECHECK SUMMARY|Invalid|Race|hazard" "$OUT/$tool.log" | head -10
    ((r == 0)) || rc=1
  done
  return "$rc"
}

stage_smoke() {
  # The trainer on CUDA, end to end: bf16 autocast, the fused attention, evaluation to 16x L.
  local log=$OUT/smoke.log
  {
    "$BUILD/extrap" --version
    python3 -c 'import torch; from torch.nn.attention.flex_attention import flex_attention; print("flex_attention: importable, torch", torch.__version__)'
    [[ -d data/pydoc ]] || { echo "no data/pydoc: carry data"; return 1; }
    "$BUILD/extrap" train --config configs/train_quick.yaml --overwrite --json "$OUT/train_cuda.json" \
      --set train.device=cuda --set train.precision=bf16 --set train.steps=200 \
      --set train.out_dir="$BUILD/runs/smoke-alibi"
  } >"$log" 2>&1
  local rc=$?
  tail -30 "$log"
  return "$rc"
}

stage_flow() {
  # The rest of a researcher's CUDA journey: a bias-free method (rotary) trained, evaluation
  # with sliding windows and a RoPE scaling, one NCCL rank, and a small sweep to HDF5.
  local log=$OUT/flow.log runs=$BUILD/runs
  {
    set -x
    "$BUILD/extrap" train --config configs/train_quick.yaml --overwrite --no-eval \
      --set train.device=cuda --set train.precision=bf16 --set train.steps=100 \
      --set position.name=rotary --set train.out_dir="$runs/flow-rotary" &&
    "$BUILD/extrap" eval --checkpoint "$runs/flow-rotary" --length 64 1024 --stride 32 \
      --rope-scaling none yarn --max-tokens 32768 --json "$OUT/flow_eval.json" &&
    "$BUILD/extrap" eval --checkpoint "$runs/smoke-alibi" --length 64 1024 4096 --stride 16 \
      --max-tokens 65536 &&
    "$BUILD/extrap" eval --checkpoint "$runs/smoke-alibi" --length 64 1024 --max-tokens 16384 \
      --device cpu --json "$OUT/eval_on_cpu.json" &&
    "$BUILD/extrap" eval --checkpoint "$runs/smoke-alibi" --length 64 1024 --max-tokens 16384 \
      --json "$OUT/eval_on_cuda.json" &&
    python3 - "$OUT/eval_on_cpu.json" "$OUT/eval_on_cuda.json" <<'PY' &&
import json, sys
cpu, gpu = (json.load(open(p))["results"] for p in sys.argv[1:])
for a, b in zip(cpu, gpu):
    print(f"L {a['length']}: mean NLL cpu {a['mean_nll']:.6f} cuda {b['mean_nll']:.6f} "
          f"(difference {abs(a['mean_nll'] - b['mean_nll']) / a['mean_nll']:.2e} relative)")
PY
    "$BUILD/extrap" train --nproc 1 --config configs/train_quick.yaml --overwrite \
      --set train.device=cuda --set train.precision=bf16 --set train.steps=100 \
      --set train.out_dir="$runs/flow-nccl" &&
    "$BUILD/extrap" sweep configs/quick.yaml --out "$runs/sweep.h5" --jobs 1 \
      --set base.train.device=cuda --set base.train.precision=bf16 --set base.train.steps=100 \
      --set output.run_root="$runs/sweep" &&
    "$BUILD/extrap" report "$runs/sweep.h5" --out "$runs/report" --python "$(command -v python3)" &&
    ls "$runs/report"
  } >"$log" 2>&1
  local rc=$?
  set +x
  grep -vE "^step [0-9]+/" "$log" | tail -60
  return "$rc"
}

stage_gpuflow() {
  # A researcher's whole GPU journey, one verdict line a step (scripts/gpu/gpuflow.sh): the CUDA
  # graph on and off, kill -9 and resume, windows and YaRN, retrieval, export, one NCCL rank, a
  # sweep with --jobs 1 and 2, the report.
  local log=$OUT/gpuflow.log
  bash scripts/gpu/gpuflow.sh "$BUILD/extrap" cuda "$BUILD" >"$log" 2>&1
  local rc=$?
  grep '^gpuflow:' "$log"
  return "$rc"
}

paper_sweep() {
  # configs/NAME.yaml, its sweep and report (tables and figures) -> $OUT/NAME.h5,
  # $OUT/NAME_report/, the log in $OUT/NAME.log.
  local name=$1 log=$OUT/$1.log
  {
    # shellcheck disable=SC2086
    "$BUILD/extrap" sweep "configs/$name.yaml" --out "$OUT/$name.h5" \
      --set output.run_root="$BUILD/runs/$name" ${PAPER_ARGS:-} &&
    "$BUILD/extrap" report "$OUT/$name.h5" --out "$OUT/${name}_report" --python "$(command -v python3)"
  } >"$log" 2>&1
  local rc=$?
  grep -vE "^step [0-9]+/" "$log" | tail -40
  [[ -f $OUT/${name}_report/report.md ]] && grep '^|' "$OUT/${name}_report/report.md" | head -30
  return "$rc"
}

# The paper's comparison at L = 512 on GPT-2's block, and on a Llama-style one.
stage_paper() { paper_sweep gpu_paper; }
stage_paper_modern() { paper_sweep gpu_paper_modern; }

# bench train's arguments for the quick shape and a GPT-2-small-sized one (12 layers, d 768,
# L 1024, 16k tokens a step, vocabulary 50304) on the GPU, bf16 autocast.
train_shape_args() {
  local args=(--config configs/train_quick.yaml --set train.device=cuda --set train.precision=bf16)
  [[ $1 == gpt2 ]] && args+=(--set model.layers=12 --set model.d_model=768 --set model.heads=12
                             --set model.d_ffn=3072 --set train.seq_len=1024 --set train.batch_tokens=16384
                             --vocab 50304)
  [[ $1 == quick ]] && args+=(--vocab 257)
  printf '%s\n' "${args[@]}"
}

stage_stepbench() {
  # The optimiser step's two paths on the GPU (EXTRAP_FUSED_ADAMW 1: ATen's multi-tensor
  # clipping and fused AdamW; 0: LibTorch's clip_grad_norm_ and AdamW), alternating, eager
  # PyTorch (AdamW fused=True) between; then each path's operator profile (CPU side: the wait
  # for the device shows in aten::_local_scalar_dense).
  local log=$OUT/stepbench.log shape round adamw args
  {
    for round in 1 2; do
      for shape in gpt2 quick; do
        mapfile -t args < <(train_shape_args "$shape")
        for adamw in 1 0; do
          echo "### round $round, $shape: extrap, EXTRAP_FUSED_ADAMW=$adamw"
          EXTRAP_FUSED_ADAMW=$adamw "$BUILD/extrap" bench train "${args[@]}" --steps 20 --warmup 5
        done
        echo "### round $round, $shape: pytorch eager"
        python3 benchmarks/train_pytorch.py "${args[@]}" --steps 20 --warmup 5
      done
    done
    mapfile -t args < <(train_shape_args gpt2)
    for adamw in 1 0; do
      echo "### profile, gpt2: EXTRAP_FUSED_ADAMW=$adamw"
      EXTRAP_FUSED_ADAMW=$adamw "$BUILD/extrap" bench train "${args[@]}" --steps 3 --warmup 3 --profile 3
    done
  } >"$log" 2>&1
  local rc=$?
  grep -E "^###|^tokens/s|^paths|^MFU|Error|error" "$log" | tail -60
  return "$rc"
}

stage_graphbench() {
  # The training step captured as a CUDA graph (train.cuda_graph auto) against the eager step
  # (off) and eager PyTorch, alternating, GRAPHBENCH_ROUNDS rounds (2) of GRAPHBENCH_SHAPES
  # ("gpt2 quick"); then torch.compile once on the GPT-2 shape (GRAPHBENCH_COMPILE=0 skips it)
  # and the graphed step's operator profile (GRAPHBENCH_PROFILE=0 skips it).
  local log=$OUT/graphbench.log shape round mode args
  {
    for round in $(seq "${GRAPHBENCH_ROUNDS:-2}"); do
      for shape in ${GRAPHBENCH_SHAPES:-gpt2 quick}; do
        mapfile -t args < <(train_shape_args "$shape")
        for mode in auto off; do
          echo "### round $round, $shape: extrap, train.cuda_graph=$mode"
          "$BUILD/extrap" bench train "${args[@]}" --set train.cuda_graph=$mode --steps 20 --warmup 5
        done
        echo "### round $round, $shape: pytorch eager"
        python3 benchmarks/train_pytorch.py "${args[@]}" --steps 20 --warmup 5
      done
    done
    if [[ ${GRAPHBENCH_COMPILE:-1} == 1 ]]; then
      mapfile -t args < <(train_shape_args gpt2)
      echo "### gpt2: pytorch compiled"
      timeout 240 python3 benchmarks/train_pytorch.py "${args[@]}" --steps 20 --warmup 5 --compile
    fi
    if [[ ${GRAPHBENCH_PROFILE:-1} == 1 ]]; then
      mapfile -t args < <(train_shape_args gpt2)
      echo "### profile, gpt2: train.cuda_graph=auto"
      "$BUILD/extrap" bench train "${args[@]}" --steps 3 --warmup 3 --profile 3
    fi
  } >"$log" 2>&1
  local rc=$?
  grep -E "^###|^tokens/s|^training step|^MFU|^peak CUDA|Error|error" "$log" | tail -80
  return "$rc"
}

stage_graphsmoke() {
  # `extrap train` on CUDA with the step as a CUDA graph (train.cuda_graph on) and without
  # (off), 300 bf16 steps of configs/train_quick.yaml each: throughput and the two loss curves.
  local log=$OUT/graphsmoke.log mode
  [[ -d data/pydoc ]] || { echo "no data/pydoc: carry data"; return 1; }
  {
    for mode in on off; do
      echo "### train.cuda_graph=$mode"
      "$BUILD/extrap" train --config configs/train_quick.yaml --overwrite --no-eval \
        --json "$OUT/graphsmoke_$mode.json" --set train.device=cuda --set train.precision=bf16 \
        --set train.steps=300 --set train.validate_every=100 --set train.cuda_graph=$mode \
        --set train.out_dir="$BUILD/runs/graph-$mode" || return 1
    done
    python3 - "$OUT/graphsmoke_on.json" "$OUT/graphsmoke_off.json" <<'PY'
import json, sys
on, off = (json.load(open(p)) for p in sys.argv[1:])
print(f"tokens/s: graph {on['tokens_per_second']:.0f}, eager {off['tokens_per_second']:.0f} "
      f"({on['tokens_per_second'] / off['tokens_per_second']:.2f}x)")
for name in ("train_curve", "valid_curve"):
    for a, b in zip(on[name], off[name]):
        print(f"{name} {a}  |  {b}")
PY
  } >"$log" 2>&1
  local rc=$?
  grep -vE "^step [0-9]+/" "$log" | tail -40
  return "$rc"
}

stage_trainbench() {
  # `extrap bench train` on the GPU against benchmarks/train_pytorch.py (eager SDPA with the
  # ALiBi mask, and torch.compile), bf16 autocast, alternating, on the quick shape and the
  # GPT-2-small-sized one (train_shape_args).
  local log=$OUT/trainbench.log round shape args
  {
    for round in $(seq "${TRAINBENCH_ROUNDS:-2}"); do
      for shape in quick gpt2; do
        mapfile -t args < <(train_shape_args "$shape")
        echo "### round $round, $shape: extrap"
        "$BUILD/extrap" bench train "${args[@]}" --steps 20 --warmup 5
        echo "### round $round, $shape: pytorch eager"
        python3 benchmarks/train_pytorch.py "${args[@]}" --steps 20 --warmup 5
        echo "### round $round, $shape: pytorch compiled"
        python3 benchmarks/train_pytorch.py "${args[@]}" --steps 20 --warmup 5 --compile
      done
    done
  } >"$log" 2>&1
  local rc=$?
  grep -E "^###|^tokens/s|^peak|^model FLOPs|^matrix-product|^MFU|Error|error" "$log" | tail -80
  return "$rc"
}

stage_trainab() {
  # Issue 66, part 2: the GPT-2-small-shaped training step (train_shape_args gpt2, ALiBi) with
  # the GPU paths not yet run on a GPU off (EXTRAP_GPU_NEW_ROUTES=0: extrap's fused attention,
  # LibTorch's adds, LayerNorms and loss), on but with LibTorch's LayerNorms
  # (EXTRAP_FUSED_LAYER_NORM=0), and on; then rotary with them on (the target "ALiBi within 3% of
  # rotary": SDPA against cuDNN's ALiBi), alternating. Then once each: torch.compile (the anchor,
  # 1.1x), and the quick shape with the new paths on against eager PyTorch (the target "the
  # quick shape's 4.8x over eager kept") -> $OUT/trainab.log.
  local log=$OUT/trainab.log round args quick
  mapfile -t args < <(train_shape_args gpt2)
  mapfile -t quick < <(train_shape_args quick)
  {
    for round in $(seq "${TRAINAB_ROUNDS:-2}"); do
      echo "### round $round: alibi, new paths off"
      EXTRAP_GPU_NEW_ROUTES=0 "$BUILD/extrap" bench train "${args[@]}" --steps 20 --warmup 5
      echo "### round $round: alibi, new paths on, LibTorch's LayerNorms"
      EXTRAP_GPU_NEW_ROUTES=1 EXTRAP_FUSED_LAYER_NORM=0 "$BUILD/extrap" bench train "${args[@]}" --steps 20 --warmup 5
      echo "### round $round: alibi, new paths on"
      EXTRAP_GPU_NEW_ROUTES=1 "$BUILD/extrap" bench train "${args[@]}" --steps 20 --warmup 5
      echo "### round $round: rotary, new paths on"
      EXTRAP_GPU_NEW_ROUTES=1 "$BUILD/extrap" bench train "${args[@]}" --set position.name=rotary --steps 20 --warmup 5
    done
    echo "### quick: alibi, new paths on"
    EXTRAP_GPU_NEW_ROUTES=1 "$BUILD/extrap" bench train "${quick[@]}" --steps 20 --warmup 5
    echo "### quick: pytorch eager"
    python3 benchmarks/train_pytorch.py "${quick[@]}" --steps 20 --warmup 5
    echo "### gpt2: pytorch compiled"
    python3 benchmarks/train_pytorch.py "${args[@]}" --steps 20 --warmup 5 --compile
  } >"$log" 2>&1
  local rc=$?
  grep -E "^###|^tokens/s|^peak|^MFU|Error|error" "$log" | tail -60
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

stage_routes() {
  # Issue 66's table: which cuDNN extrap found, every GPU route against the float64 reference
  # ([gpu-routes]), then each route timed at the issue's shape (bf16, causal, D 128, 16 heads, 16k
  # tokens a batch, T 4096 and 16384), with FlexAttention-ALiBi and SDPA's cuDNN backend in the
  # same call for the anchors -> $OUT/routes.jsonl, $OUT/routes_pytorch.jsonl.
  local rc=0
  "$BUILD/extrap" --version 2>&1 | grep -E "^(libtorch|cuda|fused|cudnn)" | tee -a "$OUT/device.txt"
  # The [gpu-routes] tests are [cuda] tests too: run here only when this call's test stage did not.
  if [[ ! -f $OUT/test.log ]]; then
    "$BUILD/tests/extrap_cuda_tests" "[gpu-routes]" --durations yes >"$OUT/routes_test.log" 2>&1 || rc=1
    tail -6 "$OUT/routes_test.log"
  fi
  # The routes not yet run on a GPU are opt-in (core/attention/gpu_routes.h): on for the timings.
  # shellcheck disable=SC2086
  EXTRAP_GPU_NEW_ROUTES=1 "$BUILD/extrap" bench attention --device cuda --causal --head-dims 128 --lengths 4096,16384 \
    --impls auto,cudnn-alibi,fused-alibi,fused-learned,fused-none,offsets,reference-offsets,sdpa --out "$OUT/routes.jsonl" \
    ${ROUTES_ARGS:-} >"$OUT/routes_bench.log" 2>&1 || rc=1
  cat "$OUT/routes_bench.log"
  # FlexAttention compiles each shape (tens of seconds); its learned-slopes backward is slow at
  # 16384 (about 1 s a call on the H100, 2026-11-25), so it and the learned offsets table (the
  # dense-bias anchor) are timed at 4096 only.
  PYTHONUNBUFFERED=1 timeout 200 python3 benchmarks/attention_pytorch.py --causal --head-dims 128 \
    --lengths 4096,16384 --impls flex-alibi,sdpa --out "$OUT/routes_pytorch.jsonl" \
    >"$OUT/routes_pytorch.log" 2>&1 || rc=1
  PYTHONUNBUFFERED=1 timeout 120 python3 benchmarks/attention_pytorch.py --causal --head-dims 128 \
    --lengths 4096 --impls flex-alibi-learned,flex-offsets --out "$OUT/routes_pytorch.jsonl" \
    >>"$OUT/routes_pytorch.log" 2>&1 || rc=1
  tail -30 "$OUT/routes_pytorch.log"
  return "$rc"
}

stage_pybench() {
  # PyTorch's own attention on the same shapes (benchmarks/attention_pytorch.py): FlexAttention
  # with an ALiBi score_mod (compiled), SDPA without a bias on each backend, SDPA with the
  # materialised bias. Extra arguments: PYBENCH_ARGS="--head-dims 128 --lengths 4096".
  # shellcheck disable=SC2086
  PYTHONUNBUFFERED=1 python3 benchmarks/attention_pytorch.py --out "$OUT/attention_pytorch.jsonl" \
    ${PYBENCH_ARGS:-} >"$OUT/pybench.log" 2>&1
  local rc=$?
  tail -80 "$OUT/pybench.log"
  return "$rc"
}

setup_prefix || exit 1
for stage in "${stages[@]}"; do
  start=$SECONDS
  if declare -F "stage_$stage" >/dev/null; then
    "stage_$stage"
    rc=$?
  else
    echo "unknown stage '$stage' ($(declare -F | sed -n 's/^declare -f stage_//p' | paste -sd ' '))"
    rc=2
  fi
  summary "$stage: $([[ $rc == 0 ]] && echo ok || echo "FAILED ($rc)") in $((SECONDS - start)) s"
  if ((rc != 0)); then
    status=1
    [[ $stage == build ]] && break
  fi
done
exit $status
