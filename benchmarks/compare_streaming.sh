#!/usr/bin/env bash
# Whether StreamingLLM evaluation runs in time linear in the stream's length: the same tokens
# read as streams of 4x L and of 16x L through a cache of L tokens (4 of them sinks), in
# alternating runs on one machine (the order flips every other round). Prints one Markdown row
# per run, then per method the line `METHOD streaming 16xL/4xL time per token: R` (issue 39's
# target: R at most 1.3). Each command's own timing is read (the evaluation's seconds column),
# so loading the checkpoint counts for neither.
#
#   bash benchmarks/compare_streaming.sh [ROUNDS] [TOKENS] [METHODS]
#        (defaults: 3 rounds, 65536 tokens, "alibi rotary")
#
# Environment: EXTRAP (default build/extrap), PROFILE_CACHE (where the models are kept, shared
# with compare_profile.sh, default build/compare_profile). The models: benchmarks/small_models.sh
# (L 32). Needs build/extrap and data/pydoc (scripts/setup.sh).
set -euo pipefail
shopt -s inherit_errexit
ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cd "$ROOT"
rounds=${1:-3}
tokens=${2:-65536}
read -r -a methods <<< "${3:-alibi rotary}"
source benchmarks/small_models.sh  # train, median, machine_header, alternate
L=32

stream_seconds() {  # stream_seconds RUN MULTIPLE: seconds for $tokens tokens in streams of MULTIPLE x L
  "$extrap" eval --checkpoint "$1" --length $(($2 * L)) --streaming $L --sinks 4 --max-tokens "$tokens" 2>&1 |
    tail -1 | awk '{print $NF}'
}

stream_4() { stream_seconds "$1" 4; }
stream_16() { stream_seconds "$1" 16; }

machine_header
for method in "${methods[@]}"; do train "$method" > /dev/null; done
echo
alternate "$rounds" stream_4 stream_16 "4x L s" "16x L s" "${methods[@]}"
echo
for method in "${methods[@]}"; do
  a=$(echo "${times_a[$method]}" | median); b=$(echo "${times_b[$method]}" | median)
  echo "$method streaming 16xL/4xL time per token: $(awk -v a="$a" -v b="$b" 'BEGIN {printf "%.2f", b / a}') (medians: 4x L $a s, 16x L $b s, $tokens tokens each)"
done
