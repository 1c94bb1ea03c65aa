#!/usr/bin/env bash
# What the `attention` options cost in training (issue: a sink or an SSMax scale within 5% of the
# same model without it, a window of L/4 no slower than full attention): `extrap bench train`
# tokens/s on configs/train_quick.yaml (alibi, L 64) with each option and without, in alternating
# runs on one machine, so that a change in the machine's load hits every variant alike. Prints one
# Markdown row per round and the medians, each relative to the plain model's.
#
#   bash benchmarks/compare_attention_options.sh [ROUNDS] [STEPS] [PRECISIONS]
#        (defaults: 5 rounds, 30 timed steps, "bf16 fp32")
#
# Needs build/extrap (scripts/setup.sh).
set -euo pipefail
ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cd "$ROOT"
rounds=${1:-5}
steps=${2:-30}
read -r -a precisions <<< "${3:-bf16 fp32}"
config=configs/train_quick.yaml
variants=(plain sink ssmax window chunk gate)
declare -A overrides=(
  [plain]=""
  [sink]="--set attention.sink=true"
  [ssmax]="--set attention.ssmax=true"
  [window]="--set attention.window=16"
  [chunk]="--set attention.chunk=16"
  [gate]="--set attention.gate=headwise"
)
tokens_per_second() { sed -n 's/^tokens\/s: \([0-9]*\).*/\1/p'; }

echo "machine: $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | sed 's/^ //'), $(nproc) cores"
echo "flags: $(grep -m1 '^flags' /proc/cpuinfo | grep -o -w -E 'avx2|avx512f|avx512_bf16|amx_bf16|amx_tile' | sort -u | tr '\n' ' ')"
echo "date: $(date -u +%FT%TZ)"
build/extrap --version | sed 's/^/  /'
echo
echo "| round | precision | $(printf '%s | ' "${variants[@]}")"
echo "|---|---|$(printf -- '---|%.0s' "${variants[@]}")"
declare -A all
for ((r = 1; r <= rounds; ++r)); do
  for precision in "${precisions[@]}"; do
    row="| $r | $precision |"
    for variant in "${variants[@]}"; do
      # shellcheck disable=SC2086  # the overrides are words
      t=$(build/extrap bench train --config $config ${overrides[$variant]} --set train.precision="$precision" \
            --steps "$steps" | tokens_per_second)
      all[$precision/$variant]+="$t "
      row+=" $t |"
    done
    echo "$row"
  done
done
echo
median() { tr ' ' '\n' | grep . | sort -n | awk '{a[NR] = $1} END {print (NR % 2) ? a[(NR + 1) / 2] : (a[NR / 2] + a[NR / 2 + 1]) / 2}'; }
echo "| precision | variant | median tokens/s | relative to plain |"
echo "|---|---|---|---|"
for precision in "${precisions[@]}"; do
  plain=$(echo "${all[$precision/plain]}" | median)
  for variant in "${variants[@]}"; do
    m=$(echo "${all[$precision/$variant]}" | median)
    echo "| $precision | $variant | $m | $(awk -v a="$m" -v b="$plain" 'BEGIN {printf "%.3f", a / b}') |"
  done
done
