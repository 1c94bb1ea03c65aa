#!/usr/bin/env bash
# Long-context evaluation speed of extrap against PyTorch 2 eager on the same trained ALiBi model,
# threads and precision (float32), in alternating runs on one machine: for each round, shape and
# length, `extrap eval`, PyTorch with the ALiBi mask (sdpa-mask) and PyTorch without a bias
# (sdpa-none) run one after the other, in the opposite order every other round, so that a change
# in the machine's load hits all three alike. Prints one Markdown row per run, the medians, and
# closes with the speed ratios at 16384 tokens (sdpa time / extrap time; above 1: extrap faster).
#
#   bash benchmarks/compare_eval.sh [ROUNDS] [LENGTHS] [SHAPES]
#        (defaults: 3 rounds, "4096 16384 32768", "quick"; SHAPES from "quick d256")
#
# Environment: EXTRAP (default build/extrap), THREADS (default: all cores), TOKENS (tokens scored
# at every length, default 65536: two windows of 32768), MEMORY_BUDGET_GB (default 12; sdpa-mask
# is skipped where its (1, H, T, T) float32 mask alone is larger), EVAL_CACHE (where the trained
# models are kept, default build/compare_eval; delete a shape's folder to retrain).
#
# The model: configs/train_quick.yaml (ALiBi, byte level, data/pydoc), trained once per shape
# with its 300 steps and exported with `extrap export`: speed, not quality, is measured. Shapes:
# quick as it is (3 layers, d_model 128, 4 heads, L 64) and d256 (d_model 256, d_ffn 1024,
# L 256). Every length scores the same TOKENS tokens of data/pydoc's valid split in
# non-overlapping windows (benchmarks/eval_pytorch.py describes the PyTorch side).
# Sdpa-mask is the model itself: its perplexity must match extrap's to 1e-4 relative, or the
# script stops. Sdpa-none drops the bias (is_causal=True): SDPA's speed ceiling, a wrong model.
# Needs build/extrap and .venv (scripts/setup.sh).
set -euo pipefail
shopt -s inherit_errexit  # a failure inside $(measure ...) stops the script too
ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cd "$ROOT"
rounds=${1:-3}
read -r -a lengths <<< "${2:-4096 16384 32768}"
read -r -a shape_names <<< "${3:-quick}"
extrap=${EXTRAP:-build/extrap}
python=.venv/bin/python
threads=${THREADS:-$(nproc)}
tokens=${TOKENS:-65536}
budget=${MEMORY_BUDGET_GB:-12}
cache=${EVAL_CACHE:-build/compare_eval}
config=configs/train_quick.yaml
data=data/pydoc
declare -A shapes=(
  [quick]=""
  [d256]="--set model.d_model=256 --set model.d_ffn=1024 --set train.seq_len=256"
)
for shape in "${shape_names[@]}"; do
  [[ -v shapes[$shape] ]] || { echo "compare_eval.sh: unknown shape $shape (quick, d256)" >&2; exit 2; }
done
scratch=$(mktemp -d)
trap 'rm -rf "$scratch"' EXIT

# Trains and exports a shape's model unless $cache/SHAPE/model.safetensors exists (log: SHAPE.log).
train_once() {
  local shape=$1 run=$cache/$1
  if [[ ! -f $run/model.safetensors ]]; then
    mkdir -p "$cache"
    echo "training $shape into $run ..." >&2
    # shellcheck disable=SC2086  # the overrides are words
    if ! "$extrap" train --config $config ${shapes[$shape]} --set data.path=$data \
        --set data.cache_dir="$cache/data" --set train.out_dir="$run" --overwrite --no-eval \
        > "$run.log" 2>&1 ||
       ! "$extrap" export --checkpoint "$run" --out "$run/model.safetensors" --overwrite >> "$run.log" 2>&1; then
      tail -5 "$run.log" >&2
      echo "compare_eval.sh: training or exporting $shape failed (log: $run.log)" >&2
      exit 1
    fi
  fi
}

# One measurement; prints "SECONDS PEAK_KIB PERPLEXITY", or "skipped REASON" for sdpa-mask.
measure() {
  local method=$1 shape=$2 length=$3 out s p
  if [[ $method == extrap ]]; then
    /usr/bin/time -f %M -o "$scratch/rss" "$extrap" eval --checkpoint "$cache/$shape" --length "$length" \
      --max-tokens $((tokens + 1)) --threads "$threads" --json "$scratch/eval.json" > "$scratch/eval.out" ||
      { cat "$scratch/eval.out" >&2; exit 1; }
    out=$("$python" -c 'import json, sys; r = json.load(open(sys.argv[1]))["results"][0]
print(r["seconds"], repr(r["perplexity"]))' "$scratch/eval.json")
    read -r s p <<< "$out"
    echo "$s $(cat "$scratch/rss") $p"
    return
  fi
  out=$(/usr/bin/time -f %M -o "$scratch/rss" "$python" benchmarks/eval_pytorch.py "$cache/$shape/model.safetensors" \
    --tokens-file "$data/valid.txt" --length "$length" --max-tokens $((tokens + 1)) \
    --attention "${method#sdpa-}" --threads "$threads" --memory-budget-gb "$budget")
  if grep -q '^skipped: ' <<< "$out"; then
    echo "skipped ($(sed -n 's/^skipped: \(mask [0-9.]* GB\) > .*/\1/p' <<< "$out") > budget)"
    return
  fi
  echo "$(field seconds <<< "$out") $(cat "$scratch/rss") $(field perplexity <<< "$out")"
}
field() { sed -n "s/^$1: \([0-9.e+-]*\).*/\1/p"; }
tokens_per_second() { awk -v t="$tokens" -v s="$1" 'BEGIN {printf "%.0f", t / s}'; }
mib() { awk -v k="$1" 'BEGIN {printf "%.0f", k / 1024}'; }
median() { tr ' ' '\n' | grep . | sort -g | awk '{v[NR] = $1} END {print (NR % 2) ? v[(NR + 1) / 2] : (v[NR / 2] + v[NR / 2 + 1]) / 2}'; }
ratio() { awk -v a="$1" -v b="$2" 'BEGIN {printf "%.2f", a / b}'; }
check_perplexity() {  # extrap's perplexity, sdpa-mask's, what is compared
  awk -v a="$1" -v b="$2" 'BEGIN {d = (a - b) / a; exit (d < 0 ? -d : d) > 1e-4}' || {
    echo "compare_eval.sh: $3: sdpa-mask perplexity $2 differs from extrap's $1 by more than 1e-4 relative" >&2
    exit 1
  }
}

for shape in "${shape_names[@]}"; do train_once "$shape"; done

echo "date: $(date -u +%FT%TZ)"
echo "machine: $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | sed 's/^ //'), $(nproc) cores"
echo "flags: $(grep -m1 '^flags' /proc/cpuinfo | grep -o -w -E 'avx2|avx512f|avx512_bf16|amx_[a-z0-9]+' | sort -u | tr '\n' ' ')"
echo "threads: $threads (extrap eval --threads; torch.set_num_threads)"
echo "extrap: $extrap"
"$extrap" --version | sed 's/^/  /'
echo "torch: $("$python" -c 'import torch; print(torch.__version__)')"
echo "tokens: $tokens scored at every length, non-overlapping windows over $data's valid split (byte level), float32"
echo "time: extrap's, as extrap eval reports it (the evaluation, without start-up and loading);"
echo "  PyTorch's, the forward passes and the loss (without start-up, loading and building the mask)"
echo "memory: the peak resident set of the whole process (/usr/bin/time %M), MiB"
echo
echo "| round | shape | length | extrap tokens/s | extrap MiB | sdpa-mask tokens/s | sdpa-mask MiB | sdpa-none tokens/s | sdpa-none MiB | extrap perplexity | sdpa-mask perplexity |"
echo "|---|---|---|---|---|---|---|---|---|---|---|"
methods=(extrap sdpa-mask sdpa-none)
declare -A seconds peak skipped perplexity
for ((r = 1; r <= rounds; ++r)); do
  order=("${methods[@]}")
  ((r % 2)) || order=(sdpa-none sdpa-mask extrap)
  for shape in "${shape_names[@]}"; do
    for length in "${lengths[@]}"; do
      declare -A got=()
      for method in "${order[@]}"; do got[$method]=$(measure "$method" "$shape" "$length"); done
      row="| $r | $shape | $length"
      for method in "${methods[@]}"; do
        read -r s k p <<< "${got[$method]}"
        if [[ $s == skipped ]]; then
          skipped[$shape,$length]=${got[$method]}
          row+=" | ${got[$method]} | -"
          continue
        fi
        seconds[$shape,$length,$method]+="$s "
        peak[$shape,$length,$method]+="$k "
        row+=" | $(tokens_per_second "$s") | $(mib "$k")"
        perplexity[$method]=$p
      done
      if [[ -v skipped[$shape,$length] ]]; then
        row+=" | ${perplexity[extrap]} | - |"
      else
        row+=" | ${perplexity[extrap]} | ${perplexity[sdpa-mask]} |"
        check_perplexity "${perplexity[extrap]}" "${perplexity[sdpa-mask]}" "$shape at length $length, round $r"
      fi
      echo "$row"
    done
  done
done

echo
echo "| shape | length | extrap tokens/s | extrap MiB | sdpa-mask tokens/s | sdpa-mask MiB | sdpa-none tokens/s | sdpa-none MiB | extrap/sdpa-none | extrap/sdpa-mask |"
echo "|---|---|---|---|---|---|---|---|---|---|"
declare -A speedup
for shape in "${shape_names[@]}"; do
  for length in "${lengths[@]}"; do
    row="| $shape | $length"
    declare -A median_seconds=()
    for method in "${methods[@]}"; do
      if [[ $method == sdpa-mask && -v skipped[$shape,$length] ]]; then
        row+=" | ${skipped[$shape,$length]} | -"
        continue
      fi
      median_seconds[$method]=$(echo "${seconds[$shape,$length,$method]}" | median)
      row+=" | $(tokens_per_second "${median_seconds[$method]}") | $(mib "$(echo "${peak[$shape,$length,$method]}" | median)")"
    done
    for method in sdpa-none sdpa-mask; do
      speedup[$shape,$length,$method]=$([[ -v median_seconds[$method] ]] &&
        ratio "${median_seconds[$method]}" "${median_seconds[extrap]}" || echo "n/a (skipped)")
      row+=" | ${speedup[$shape,$length,$method]}"
    done
    echo "$row |"
  done
done
echo
echo "extrap/sdpa-none: ${speedup[${shape_names[0]},16384,sdpa-none]:-n/a (16384 not measured)}"
echo "extrap/sdpa-mask: ${speedup[${shape_names[0]},16384,sdpa-mask]:-n/a (16384 not measured)}"
