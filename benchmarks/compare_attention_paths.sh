#!/usr/bin/env bash
# Where `auto` attention should leave the reference path for long evaluations on the CPU
# (model.efficient_threshold): `extrap eval` of one trained model per bias kind, at each length,
# on each path it can take, in alternating runs on one machine (for each round and length the
# paths run one after the other, in the opposite order every other round), every run scoring the
# same TOKENS tokens of data/pydoc's valid split in non-overlapping windows. Prints one Markdown
# row per run and the medians, with the fastest path per (method, length).
#
#   bash benchmarks/compare_attention_paths.sh [ROUNDS] [LENGTHS] [METHODS]
#        (defaults: 3 rounds, "64 128 256 512 1024 2048", "alibi rotary t5_bias fire")
#
# The paths: reference (whole T x T scores), fused (extrap's fused CPU kernel's forward: no bias,
# the ALiBi family, biases of j - i alone) and efficient (tiles of the scores: every other bias).
# A path a method's bias cannot take is left out. The methods: alibi (a linear bias), rotary (no
# bias), t5_bias (a bias of j - i alone) and fire (a dense bias of i as well). The model is
# configs/train_quick.yaml (3 layers, d_model 128, 4 heads) with the method, trained for 30 steps
# once per method (speed, not quality, is measured) into EVAL_CACHE.
#
# Environment: EXTRAP (default build/extrap), THREADS (default 1), TOKENS (default 100000),
# EVAL_CACHE (default build/compare_attention_paths). Run it capped too, as an AVX2-only machine
# runs (ATEN_CPU_CAPABILITY=avx2 ONEDNN_MAX_CPU_ISA=AVX2 MKL_ENABLE_INSTRUCTIONS=AVX2): extrap's own
# kernels honour the same switch. Needs build/extrap and data/pydoc (scripts/setup.sh).
set -euo pipefail
shopt -s inherit_errexit
ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cd "$ROOT"
rounds=${1:-3}
read -r -a lengths <<< "${2:-64 128 256 512 1024 2048}"
read -r -a methods <<< "${3:-alibi rotary t5_bias fire}"
source benchmarks/small_models.sh  # extrap (EXTRAP), median
threads=${THREADS:-1}
tokens=${TOKENS:-100000}
cache=${EVAL_CACHE:-build/compare_attention_paths}
python=.venv/bin/python

# The paths a method's bias can take on the CPU.
paths_of() {
  case "$1" in
    fire) echo "reference efficient" ;;
    *) echo "reference fused efficient" ;;
  esac
}

echo "machine: $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | sed 's/^ //'), $(nproc) cores"
echo "flags: $(grep -m1 '^flags' /proc/cpuinfo | grep -o -w -E 'avx2|avx512f|avx512_bf16|amx_bf16|amx_tile' | sort -u | tr '\n' ' ')"
echo "capability: ATEN_CPU_CAPABILITY=${ATEN_CPU_CAPABILITY:-native} ONEDNN_MAX_CPU_ISA=${ONEDNN_MAX_CPU_ISA:-native}"
echo "date: $(date -u +%FT%TZ); threads $threads; $tokens tokens a run"
"$extrap" --version | sed 's/^/  /'
echo

mkdir -p "$cache"
for method in "${methods[@]}"; do
  if [[ ! -f "$cache/$method/checkpoint/manifest.json" ]]; then
    "$extrap" train --config configs/train_quick.yaml --set "position.name=$method" --set train.steps=30 \
      --set train.validate_every=0 --set train.checkpoint_every=0 --set "train.out_dir=$cache/$method" \
      --no-eval --overwrite > "$cache/$method.train.log" 2>&1
  fi
done

# seconds METHOD PATH LENGTH: the evaluation's time (its JSON row's seconds).
seconds() {
  local json="$cache/run.json"
  "$extrap" eval --checkpoint "$cache/$1" -L "$3" --max-tokens "$tokens" --attention "$2" --threads "$threads" \
    --json "$json" > /dev/null 2>&1
  "$python" -c 'import json, sys; print("%.4f" % json.load(open(sys.argv[1]))["results"][0]["seconds"])' "$json"
}

echo "| round | method | length | path | seconds |"
echo "|---|---|---|---|---|"
declare -A all
for ((round = 1; round <= rounds; ++round)); do
  for method in "${methods[@]}"; do
    read -r -a paths <<< "$(paths_of "$method")"
    ((round % 2 == 0)) && paths=($(printf '%s\n' "${paths[@]}" | tac))
    for length in "${lengths[@]}"; do
      for path in "${paths[@]}"; do
        s=$(seconds "$method" "$path" "$length")
        all[$method,$length,$path]+="$s "
        echo "| $round | $method | $length | $path | $s |"
      done
    done
  done
done

echo
echo "| method | length | reference s | fused s | efficient s | fastest |"
echo "|---|---|---|---|---|---|"
for method in "${methods[@]}"; do
  for length in "${lengths[@]}"; do
    row="| $method | $length |"
    best="" best_s=""
    for path in reference fused efficient; do
      if [[ -z "${all[$method,$length,$path]:-}" ]]; then
        row+=" |"
        continue
      fi
      m=$(echo "${all[$method,$length,$path]}" | median)
      row+=" $m |"
      if [[ -z "$best_s" ]] || awk -v a="$m" -v b="$best_s" 'BEGIN {exit !(a < b)}'; then
        best=$path best_s=$m
      fi
    done
    echo "$row $best |"
  done
done
