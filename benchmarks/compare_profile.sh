#!/usr/bin/env bash
# What the attention profile costs next to a plain evaluation of the same window, in alternating
# runs on one machine: for each round and method, `extrap eval` of one window of LENGTH tokens
# and `extrap inspect attention` of that window, one after the other, in the opposite order
# every other round. Prints one Markdown row per run, then per method the median seconds and
# the line `METHOD profile/eval at LENGTH: R` (R = profile seconds / evaluation seconds; the
# target of issue 39 is at most 2 at 16k). Each command's own timing is read (the evaluation's
# seconds column, the profile's "(S s)"), so loading the checkpoint counts for neither.
#
#   bash benchmarks/compare_profile.sh [ROUNDS] [LENGTH] [METHODS]
#        (defaults: 3 rounds, 16384, "alibi rotary t5_bias")
#
# Environment: EXTRAP (default build/extrap), PROFILE_CACHE (where the models are kept, default
# build/compare_profile; delete a method's folder to retrain).
#
# The models (benchmarks/small_models.sh): the wave2 shape (4 layers, d_model 64, 4 heads, L 32,
# byte level, data/pydoc), trained 30 steps per method. alibi, rotary and t5_bias (a
# dense bias of j - i alone, read by offset) take the profile's own softmax kernel; fire, cope,
# path or stick_breaking would take the reference path's weights and the binning kernel.
# Needs build/extrap and data/pydoc (scripts/setup.sh).
set -euo pipefail
shopt -s inherit_errexit
ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cd "$ROOT"
rounds=${1:-3}
length=${2:-16384}
read -r -a methods <<< "${3:-alibi rotary t5_bias}"

source benchmarks/small_models.sh  # train, median, machine_header, alternate

eval_seconds() {  # the evaluation's seconds column (one window: LENGTH + 1 tokens for a causal model)
  "$extrap" eval --checkpoint "$1" --length "$length" --max-tokens $((length + 1)) 2>&1 | tail -1 | awk '{print $NF}'
}
profile_seconds() {
  "$extrap" inspect attention --checkpoint "$1" --length "$length" --windows 1 2>&1 | head -1 |
    sed -n 's/.*(\([0-9.]*\) s)$/\1/p'
}

machine_header
for method in "${methods[@]}"; do train "$method" > /dev/null; done
echo
alternate "$rounds" eval_seconds profile_seconds "eval s" "profile s" "${methods[@]}"
echo
for method in "${methods[@]}"; do
  e=$(echo "${times_a[$method]}" | median); p=$(echo "${times_b[$method]}" | median)
  echo "$method profile/eval at $length: $(awk -v p="$p" -v e="$e" 'BEGIN {printf "%.2f", p / e}') (medians: profile $p s, eval $e s)"
done
