#!/usr/bin/env bash
# Training throughput of extrap against PyTorch 2 (eager and torch.compile) on the same model,
# shapes, threads and precision, in alternating runs on one machine: for each round, each
# shape and precision, extrap, eager and compiled run one after the other, so that a change in
# the machine's load hits all three alike. Prints one Markdown row per run and the medians,
# with extrap's model FLOPs utilisation (`extrap bench train` measures the machine's
# matrix-product rate in the same run).
#
#   bash benchmarks/compare_train.sh [ROUNDS] [STEPS] [PRECISIONS] [SHAPES]
#        (defaults: 3 rounds, 20 timed steps, "fp32 bf16", "quick d256-L256 llama-d256-L256")
#
# Precision bf16: extrap's train.precision bf16 against PyTorch's torch.autocast(bfloat16),
# both with fp32 weights and optimiser.
# Allocator: extrap sets glibc's malloc thresholds at start (core/base/allocator.h: mmap 64 MiB,
# trim 512 MiB), which spares a step's tensors their page faults. The PyTorch runs get the same
# thresholds through GLIBC_TUNABLES, so that malloc is not the difference: PyTorch gains from
# them too (benchmarks/RESULTS.md, part 3). BASELINE_MALLOC=default
# runs them with glibc's defaults instead, as a plain `python` would.
# Shapes: configs/train_quick.yaml as it is (3 layers, d_model 128, 4 heads, L 64, 4,096 tokens
# a step) and the same with d_model 256, d_ffn 1024, L 256; and a Llama-style model of that size
# (4 layers, 8 query heads on 2 key and value heads, RMSNorm, SwiGLU of Llama's width, no
# biases, rotary with the half pairing; PyTorch's side uses nn.RMSNorm and SDPA's enable_gqa).
# Needs build/extrap and .venv (scripts/setup.sh).
set -euo pipefail
ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cd "$ROOT"
rounds=${1:-3}
steps=${2:-20}
read -r -a precisions <<< "${3:-fp32 bf16}"
read -r -a shape_names <<< "${4:-quick d256-L256 llama-d256-L256}"
config=configs/train_quick.yaml
declare -A shapes=(
  [quick]=""
  [d256-L256]="--set model.d_model=256 --set model.d_ffn=1024 --set train.seq_len=256"
  [llama-d256-L256]="--set model.layers=4 --set model.d_model=256 --set model.heads=8 --set model.kv_heads=2
    --set model.norm=rmsnorm --set model.ffn=swiglu --set model.d_ffn=0 --set model.bias=false
    --set model.tie_embeddings=false --set position.name=rotary --set position.pairing=half --set train.seq_len=256"
)
for shape in "${shape_names[@]}"; do
  [[ -v "shapes[$shape]" ]] || { echo "unknown shape '$shape' (${!shapes[*]})" >&2; exit 2; }
done
tokens_per_second() { sed -n 's/^tokens\/s: \([0-9]*\).*/\1/p'; }
field() { sed -n "s/^$1: \([0-9.]*\).*/\1/p"; }
case "${BASELINE_MALLOC:-extrap}" in
  extrap) baseline_env=("GLIBC_TUNABLES=glibc.malloc.mmap_threshold=67108864:glibc.malloc.trim_threshold=536870912") ;;
  default) baseline_env=() ;;
  *) echo "BASELINE_MALLOC=$BASELINE_MALLOC: expected extrap (the default) or default" >&2; exit 2 ;;
esac

echo "machine: $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | sed 's/^ //'), $(nproc) cores"
echo "flags: $(grep -m1 '^flags' /proc/cpuinfo | grep -o -w -E 'avx2|avx512f|avx512_bf16|amx_bf16|amx_tile' | sort -u | tr '\n' ' ')"
echo "date: $(date -u +%FT%TZ)"
echo "PyTorch's malloc: ${BASELINE_MALLOC:-extrap} (${baseline_env[*]:-glibc defaults})"
build/extrap --version | sed 's/^/  /'
echo
echo "| round | shape | precision | extrap tokens/s | extrap MFU | eager tokens/s | compiled tokens/s |"
echo "|---|---|---|---|---|---|---|"
declare -A all
for ((r = 1; r <= rounds; ++r)); do
  for shape in "${shape_names[@]}"; do
    for precision in "${precisions[@]}"; do
      # shellcheck disable=SC2086  # the overrides are words
      out=$(build/extrap bench train --config $config ${shapes[$shape]} --set train.precision="$precision" --steps "$steps")
      e=$(echo "$out" | tokens_per_second)
      mfu=$(echo "$out" | field MFU)
      # shellcheck disable=SC2086
      p=$(env "${baseline_env[@]}" .venv/bin/python benchmarks/train_pytorch.py --config $config ${shapes[$shape]} --precision "$precision" --steps "$steps" | tokens_per_second)
      # shellcheck disable=SC2086
      c=$(env "${baseline_env[@]}" .venv/bin/python benchmarks/train_pytorch.py --config $config ${shapes[$shape]} --precision "$precision" --steps "$steps" --compile 2>/dev/null | tokens_per_second)
      echo "| $r | $shape | $precision | $e | $mfu | $p | $c |"
      all[$shape,$precision,extrap]+="$e "
      all[$shape,$precision,mfu]+="$mfu "
      all[$shape,$precision,eager]+="$p "
      all[$shape,$precision,compiled]+="$c "
    done
  done
done
median() { tr ' ' '\n' | grep . | sort -g | awk '{v[NR] = $1} END {print (NR % 2) ? v[(NR + 1) / 2] : (v[NR / 2] + v[NR / 2 + 1]) / 2}'; }
echo
echo "| shape | precision | extrap (median) | extrap MFU | eager (median) | compiled (median) | extrap / eager | extrap / compiled |"
echo "|---|---|---|---|---|---|---|---|"
for shape in "${shape_names[@]}"; do
  for precision in "${precisions[@]}"; do
    e=$(echo "${all[$shape,$precision,extrap]}" | median)
    mfu=$(echo "${all[$shape,$precision,mfu]}" | median)
    p=$(echo "${all[$shape,$precision,eager]}" | median)
    c=$(echo "${all[$shape,$precision,compiled]}" | median)
    echo "| $shape | $precision | $e | $mfu | $p | $c | $(awk -v a="$e" -v b="$p" 'BEGIN {printf "%.2f", a / b}') | $(awk -v a="$e" -v b="$c" 'BEGIN {printf "%.2f", a / b}') |"
  done
done
