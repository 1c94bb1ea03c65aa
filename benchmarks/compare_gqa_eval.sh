#!/usr/bin/env bash
# Grouped-query attention at long evaluation lengths: a Llama-style model (4 layers, d_model 256,
# 8 query heads, RMSNorm, SwiGLU, no biases, rotary with the half pairing, L 256, byte level)
# with 2 key and value heads (4:1) against the same model with 8, evaluated on one window of
# LENGTH tokens, twice a model a round, in rounds on one machine. The
# fused CPU kernel reads each key and value head once for its group of query heads, so the
# grouped model should be at least as fast (it also computes a quarter of the k and v
# projections). Each command's own timing is read (the evaluation's seconds column), so loading
# the checkpoint counts for neither. Then `extrap bench generate` prints each model's KV cache.
#
#   bash benchmarks/compare_gqa_eval.sh [ROUNDS] [LENGTH]     (defaults: 3 rounds, 16384)
#
# Environment: EXTRAP (default build/extrap), GQA_CACHE (where the two models are kept, default
# build/compare_gqa; each trained 30 steps once: speed, not quality, is measured). Needs
# build/extrap and data/pydoc (scripts/setup.sh).
set -euo pipefail
shopt -s inherit_errexit
ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cd "$ROOT"
rounds=${1:-3}
length=${2:-16384}
PROFILE_CACHE=${GQA_CACHE:-build/compare_gqa}
source benchmarks/small_models.sh  # median, machine_header, alternate ($extrap, $cache)

# The models: METHOD here is the number of key and value heads (2 or 8); `alternate` calls
# train to find each one's run directory.
model_yaml() {
  cat <<YAML
data: {path: data/pydoc, tokenizer: byte}
model: {layers: 4, d_model: 256, heads: 8, kv_heads: $1, norm: rmsnorm, ffn: swiglu, d_ffn: 0, bias: false,
        tie_embeddings: false, dropout: 0.0}
position: {name: rotary, pairing: half}
train: {seq_len: 256, batch_tokens: 4096, steps: 30, warmup: 5, validate_every: 100, checkpoint_every: 30,
        out_dir: $cache/kv$1}
eval: {lengths: [256], max_tokens: 4096}
YAML
}
train() {
  local dir=$cache/kv$1
  if [[ ! -f $dir/checkpoint/model.pt ]]; then
    mkdir -p "$cache"
    model_yaml "$1" > "$cache/kv$1.yaml"
    "$extrap" train --config "$cache/kv$1.yaml" > "$cache/kv$1.train.log" 2>&1 ||
      { echo "compare_gqa_eval.sh: training kv_heads $1 failed (see $cache/kv$1.train.log)" >&2; exit 1; }
  fi
  echo "$dir"
}
eval_seconds() {  # eval_seconds RUN: seconds to evaluate one window of $length tokens
  "$extrap" eval --checkpoint "$1" --length "$length" --max-tokens $((length + 1)) 2>&1 | tail -1 | awk '{print $NF}'
}

machine_header
for kv in 2 8; do train "$kv" > /dev/null; done
echo
# One "method" per model, timed by the same function: alternate's two columns are one run each.
alternate "$rounds" eval_seconds eval_seconds "s (first)" "s (second)" 2 8
echo
for kv in 2 8; do
  all=$(echo "${times_a[$kv]} ${times_b[$kv]}" | median)
  echo "kv_heads $kv: median $all s for one window of $length tokens"
  declare "median_$kv=$all"
done
echo "grouped (2 of 8) / full heads time: $(awk -v a="$median_2" -v b="$median_8" 'BEGIN {printf "%.2f", a / b}')"
echo
for kv in 2 8; do
  "$extrap" bench generate --config "$cache/kv$kv.yaml" --prompt-tokens 256 --new 16 | grep '^KV cache'
done
