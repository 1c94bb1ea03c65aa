#!/usr/bin/env bash
# Released models on the CPU: extrap's evaluation of an imported checkpoint against transformers
# on the same checkpoint, float32, one window of LENGTH tokens, time and peak memory. The
# checkpoints are ~100M-parameter Llama-style (GQA 3:1, SwiGLU, RMSNorm, rotary) and BLOOM-style
# (ALiBi) models initialised at random by transformers (benchmarks/hf_eval.py; speed, not
# quality, is measured), with a byte-level BPE of 8000 ids trained on the default corpus.
# Each tool scores the same tokens; their mean NLLs are printed side by side as a check.
# Rounds alternate which tool runs first.
#
#   bash benchmarks/compare_hf_eval.sh [ROUNDS] [LENGTH...]     (defaults: 1 round; 2048 8192)
#
# Environment: EXTRAP (default build/extrap), HF_EVAL_CACHE (default build/compare_hf_eval),
# FAMILIES (default "llama bloom").
# Target (issue 78): at 8k, extrap at least 1.2x transformers' tokens/s and at most 0.5x its peak
# memory. Needs build/extrap and the project's .venv (scripts/setup.sh).
set -euo pipefail
shopt -s inherit_errexit
ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cd "$ROOT"
rounds=${1:-1}
shift || true
lengths=("${@:-2048 8192}")
read -r -a lengths <<<"${lengths[*]}"
extrap=${EXTRAP:-build/extrap}
python=${EXTRAP_PYTHON:-.venv/bin/python}
cache=${HF_EVAL_CACHE:-build/compare_hf_eval}
text=data/pydoc/valid.txt
read -r -a families <<<"${FAMILIES:-llama bloom}"
[[ -x $extrap ]] || { echo "compare_hf_eval.sh: $extrap is missing: run scripts/setup.sh first" >&2; exit 1; }

echo "$("$extrap" --version | head -1); $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | xargs), $(nproc) cores; $(date -u +%F)"
"$extrap" --version | grep -m1 'cpu capability' || true
mkdir -p "$cache/corpus"
for split in train valid test; do ln -sf "$ROOT/$text" "$cache/corpus/$split.txt"; done
for family in "${families[@]}"; do
  if [[ ! -f $cache/$family/model.safetensors ]]; then
    "$python" benchmarks/hf_eval.py make "$cache/$family" "$family" data/pydoc/train.txt
  fi
  if [[ ! -f $cache/run-$family/checkpoint/weights.json ]]; then
    "$extrap" import "$cache/$family" --out "$cache/run-$family" --data "$cache/corpus" --train-length 2048 \
      --overwrite > "$cache/import-$family.log"
  fi
done

extrap_once() {  # FAMILY LENGTH -> "seconds peak_mib nll_mean"
  local out peak
  out=$(/usr/bin/time -f 'PEAK %M' "$extrap" eval --checkpoint "$cache/run-$1" --length "$2" \
        --max-tokens $(($2 + 1)) 2>&1)
  peak=$(echo "$out" | sed -n 's/^PEAK //p')
  echo "$out" | grep -E "^$2 " | awk -v peak="$peak" '{printf "%s %.0f %.6f\n", $NF, peak / 1024, $4 / $3}'
}
hf_once() { "$python" benchmarks/hf_eval.py time "$cache/$1" "$text" "$2"; }

printf '%-6s %6s %5s | %9s %9s %10s | %9s %9s %10s | %7s %7s\n' family length round \
  "extrap s" "MiB" "nll" "hf s" "MiB" "nll" "speed" "memory"
for family in "${families[@]}"; do
  for length in "${lengths[@]}"; do
    for ((r = 1; r <= rounds; r++)); do
      if ((r % 2)); then e=$(extrap_once "$family" "$length"); h=$(hf_once "$family" "$length")
      else h=$(hf_once "$family" "$length"); e=$(extrap_once "$family" "$length"); fi
      read -r es em en <<<"$e"
      read -r hs hm hn <<<"$h"
      printf '%-6s %6s %5s | %9s %9s %10s | %9s %9s %10s | %6.2fx %6.2fx\n' "$family" "$length" "$r" \
        "$es" "$em" "$en" "$hs" "$hm" "$hn" "$(echo "$hs / $es" | bc -l)" "$(echo "$em / $hm" | bc -l)"
    done
  done
done
