# Sourced by the evaluation-lens benchmarks (compare_profile.sh, compare_streaming.sh; and for its
# `median` by compare_attention_paths.sh), after
# `set -e` and from the repository's root: one small model per method at the wave2 shape (4
# layers, d_model 64, 4 heads, L 32, byte level, data/pydoc), trained 30 steps: speed, not
# quality, is what they measure. `train METHOD` prints the run directory, trained once under
# PROFILE_CACHE (default build/compare_profile; delete a method's folder to retrain), with
# EXTRAP (default build/extrap). `alternate` runs two timed commands per method in alternating
# order.
extrap=${EXTRAP:-build/extrap}
cache=${PROFILE_CACHE:-build/compare_profile}
[[ -x $extrap ]] || { echo "$(basename "$0"): $extrap is missing: run scripts/setup.sh first" >&2; exit 1; }

train() {
  local method=$1 dir=$cache/$1
  if [[ ! -f $dir/checkpoint/model.pt ]]; then
    mkdir -p "$cache"
    cat > "$cache/$method.yaml" <<YAML
data: {path: data/pydoc, tokenizer: byte}
model: {layers: 4, d_model: 64, heads: 4, d_ffn: 256, dropout: 0.0}
position: $method
train: {seq_len: 32, batch_tokens: 4096, steps: 30, warmup: 5, validate_every: 100, checkpoint_every: 30, out_dir: $dir}
eval: {lengths: [32], max_tokens: 4096}
YAML
    "$extrap" train --config "$cache/$method.yaml" > "$cache/$method.train.log" 2>&1 ||
      { echo "$(basename "$0"): training $method failed (see $cache/$method.train.log)" >&2; exit 1; }
  fi
  echo "$dir"
}

# The median of whitespace-separated numbers on stdin.
median() { tr ' ' '\n' | grep . | sort -g | awk '{v[NR] = $1} END {print (NR % 2) ? v[(NR + 1) / 2] : (v[NR / 2] + v[NR / 2 + 1]) / 2}'; }

# One line naming the build, the CPU and the date, then the capability in force.
machine_header() {
  echo "$("$extrap" --version | head -1); $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | xargs), $(nproc) cores; $(date -u +%F)"
  "$extrap" --version | grep -m1 'cpu capability' || true
}

# alternate ROUNDS A B HEAD_A HEAD_B METHOD...: for each round and method, the functions A and
# B on the method's run directory (from `train`), each printing seconds, B first every other
# round; one Markdown row a run (columns HEAD_A, HEAD_B), and each method's timings left in the
# associative arrays times_a and times_b (space-separated). Stops, naming the method, where a
# function printed no number.
declare -A times_a times_b
alternate() {
  local rounds=$1 fn_a=$2 fn_b=$3 head_a=$4 head_b=$5 r method a b dir
  shift 5
  echo "| round | method | $head_a | $head_b |"
  echo "|---|---|---|---|"
  for ((r = 1; r <= rounds; ++r)); do
    for method in "$@"; do
      dir=$(train "$method")
      if ((r % 2)); then
        a=$("$fn_a" "$dir"); b=$("$fn_b" "$dir")
      else
        b=$("$fn_b" "$dir"); a=$("$fn_a" "$dir")
      fi
      [[ $a =~ ^[0-9.]+$ && $b =~ ^[0-9.]+$ ]] ||
        { echo "$(basename "$0"): $method: no timing ($head_a '$a', $head_b '$b'); run the commands by hand to see why" >&2; exit 1; }
      echo "| $r | $method | $a | $b |"
      times_a[$method]+="$a "; times_b[$method]+="$b "
    done
  done
}
