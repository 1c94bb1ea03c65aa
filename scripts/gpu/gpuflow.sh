#!/usr/bin/env bash
# A researcher's whole GPU journey in one run (issue 65), each step one verdict line
# ("gpuflow: STEP: ok ..." or "gpuflow: STEP: FAILED ..."), exit 1 if any failed:
#
#   graph     configs/train_quick.yaml trained with train.cuda_graph on and off: the training
#             and validation curves equal to the printed digits (4 decimals)
#   kill      the same run with dropout 0.1, killed with SIGKILL past its second checkpoint,
#             then `extrap train --resume`: its curve equals the uninterrupted one's to the
#             printed digits (dropout's masks continue: the checkpoint holds the GPU's generator)
#   eval      a rotary model evaluated with sliding windows and YaRN, to 16x L
#   retrieval passkey retrieval on the ALiBi model
#   export    the ALiBi model exported; analysis/extrap_model.py reproduces extrap's perplexity
#   nccl      one data-parallel rank (--nproc 1: NCCL on a GPU, Gloo on the CPU)
#   sweep     a sweep of three points with --jobs 1, the same with --jobs 2 (two processes
#             sharing the device), both complete; their report tables compared
#   report    extrap report of the --jobs 1 file
#
#   bash scripts/gpu/gpuflow.sh EXTRAP DEVICE OUT      (DEVICE cuda, or cpu to try it here)
#
# scripts/gpu/run_on_device.sh's `gpuflow` stage runs it with build-gpu/extrap on cuda. Needs
# data/pydoc. PYTHON (default python3) runs the comparisons, the reader and the report.
set -uo pipefail
EXTRAP=${1:?usage: gpuflow.sh EXTRAP DEVICE OUT}
DEVICE=${2:?usage: gpuflow.sh EXTRAP DEVICE OUT}
OUT=${3:?usage: gpuflow.sh EXTRAP DEVICE OUT}
PYTHON=${PYTHON:-python3}
cd "$(dirname "$0")/../.." || exit 1
runs=$OUT/gpuflow
rm -rf "$runs"
mkdir -p "$runs"
failed=0
precision=bf16
[[ $DEVICE == cpu ]] && precision=fp32
verdict() {  # verdict STEP RC DETAIL
  if [[ $2 == 0 ]]; then echo "gpuflow: $1: ok $3"; else echo "gpuflow: $1: FAILED $3"; failed=1; fi
}
train() {  # train NAME [--set ...]: configs/train_quick.yaml on DEVICE, 120 steps, a checkpoint every 40
  local name=$1
  shift
  "$EXTRAP" train --config configs/train_quick.yaml --overwrite --no-eval \
    --set train.device="$DEVICE" --set train.precision=$precision --set train.steps=120 \
    --set train.checkpoint_every=40 --set train.validate_every=40 --set train.log_every=10 \
    --set train.out_dir="$runs/$name" "$@" > "$runs/$name.log" 2>&1
}
# same_curves A B: the runs' training and validation losses, step by step, to 4 decimals.
same_curves() {
  "$PYTHON" - "$runs/$1/metrics.jsonl" "$runs/$2/metrics.jsonl" <<'PY'
import json, sys
def curve(path):
    rows = [json.loads(line) for line in open(path) if line.strip()]
    return [(r["step"], "%.4f" % r["loss"], "%.4f" % r["valid_loss"] if "valid_loss" in r else "") for r in rows]
a, b = curve(sys.argv[1]), curve(sys.argv[2])
diff = [(x, y) for x, y in zip(a, b) if x != y]
print(f"{len(a)} and {len(b)} rows; first difference: {diff[0] if diff else 'none'}")
sys.exit(0 if a == b and a else 1)
PY
}

# graph
if [[ $DEVICE == cuda ]]; then
  train graph-on --set train.cuda_graph=on && train graph-off --set train.cuda_graph=off
  rc=$?
  ((rc == 0)) && { detail=$(same_curves graph-on graph-off); rc=$?; } || detail="training failed (see $runs/graph-*.log)"
  verdict graph "$rc" "$detail"
else
  train graph-off --set train.cuda_graph=off
  verdict graph 0 "(no CUDA graph on the CPU: the eager run only)"
fi

# kill: SIGKILL at step 90, past the second checkpoint (step 80), then resume. The run stops
# itself there (EXTRAP_TEST_STOP_AT, core/base/fault.h: a SIGSTOP at an exact step, since a GPU
# trains the 120 steps faster than a poll of its log) and gets a real kill -9.
# Dropout 0.1 (train_quick.yaml has none), so that the masks drawn after the resumption are
# checked too: without the GPU's generator in the checkpoint they would start again.
dropout=(--set model.dropout=0.1 --set model.attention_dropout=0.1)
reference=dropout
train dropout "${dropout[@]}" || verdict kill 1 "the uninterrupted run with dropout failed (see $runs/dropout.log)"
stops=$runs/killed.stops
(EXTRAP_TEST_STOP_AT=step:90 EXTRAP_TEST_STOP_FILE=$stops train killed "${dropout[@]}") &
pid=$!
for ((i = 0; i < 600; ++i)); do
  [[ -s $stops ]] && break
  sleep 0.2
done
stopped=$(awk '{print $1}' "$stops" 2>/dev/null)
kill -9 ${stopped:-} $(pgrep -P $pid) $pid 2>/dev/null
wait $pid 2>/dev/null
at=$(tail -1 "$runs/killed/metrics.jsonl" 2>/dev/null | sed 's/.*"step":\([0-9]*\).*/\1/')
"$EXTRAP" train --config configs/train_quick.yaml --resume --no-eval \
  --set train.device="$DEVICE" --set train.precision=$precision --set train.steps=120 \
  --set train.checkpoint_every=40 --set train.validate_every=40 --set train.log_every=10 \
  --set train.out_dir="$runs/killed" "${dropout[@]}" > "$runs/killed.resume.log" 2>&1
rc=$?
((rc == 0)) && { detail=$(same_curves killed "$reference"); rc=$?; } || detail="resume failed (see $runs/killed.resume.log)"
[[ -n ${stopped:-} ]] || { rc=1; detail="the run did not stop at step 90 ($stops)"; }
verdict kill "$rc" "(killed at step 90; its log had reached step ${at:-?}) $detail"

# eval: a rotary model, sliding windows and YaRN to 16x L.
train rotary --set position.name=rotary &&
  "$EXTRAP" eval --checkpoint "$runs/rotary" --length 64 1024 --stride 32 --rope-scaling none yarn \
    --max-tokens 32768 --json "$runs/rotary.eval.json" > "$runs/rotary.eval.log" 2>&1
verdict eval $? "(rotary, L 64 and 1024, stride 32, none and yarn: $runs/rotary.eval.json)"

# retrieval
"$EXTRAP" eval --checkpoint "$runs/graph-off" --retrieval passkey --length 256 --samples 2 \
  > "$runs/retrieval.log" 2>&1
verdict retrieval $? "($(grep -m1 -E '^256 ' "$runs/retrieval.log" | tr -s ' '))"

# export: Python's reader on the CPU against extrap's evaluation on DEVICE.
"$EXTRAP" eval --checkpoint "$runs/graph-off" --length 64 --max-tokens 4096 --json "$runs/export.eval.json" \
  > "$runs/export.log" 2>&1 &&
  "$EXTRAP" export --checkpoint "$runs/graph-off" --out "$runs/model.safetensors" >> "$runs/export.log" 2>&1 &&
  "$PYTHON" - "$runs/model.safetensors" "$runs/export.eval.json" >> "$runs/export.log" 2>&1 <<'PY'
import json, sys
sys.path.insert(0, "analysis")
import extrap_model, torch
model = extrap_model.load(sys.argv[1], dtype=torch.float64)
row = json.load(open(sys.argv[2]))["results"][0]
tokens = extrap_model.tokens_of_file(model, "data/pydoc/valid.txt")[:4096]
ours = extrap_model.evaluate(model, tokens, 64)
print("extrap", row["perplexity"], "python", ours)
value = ours["perplexity"] if isinstance(ours, dict) else ours
sys.exit(0 if abs(value - row["perplexity"]) <= 1e-4 * row["perplexity"] else 1)
PY
verdict export $? "($(tail -1 "$runs/export.log"))"

# nccl: one rank.
"$EXTRAP" train --nproc 1 --config configs/train_quick.yaml --overwrite --no-eval \
  --set train.device="$DEVICE" --set train.precision=$precision --set train.steps=40 \
  --set train.out_dir="$runs/nccl" > "$runs/nccl.log" 2>&1
verdict nccl $? "($(grep -m1 -E 'trained [0-9]+ steps' "$runs/nccl.log"))"

# sweep: three points, one process and two.
sweep() {  # sweep JOBS: the sweep, then its --status (the same file and overrides) says complete
  local args=(configs/quick.yaml --out "$runs/sweep-jobs$1.h5" --set base.train.device="$DEVICE"
              --set base.train.precision=$precision --set base.train.steps=60 --set base.train.threads=0
              --set 'grid.position=[{name: alibi}, {name: rotary}, {name: t5_bias}]'
              --set output.run_root="$runs/sweep-jobs$1")
  "$EXTRAP" sweep "${args[@]}" --jobs "$1" > "$runs/sweep-jobs$1.log" 2>&1 &&
    "$EXTRAP" sweep "${args[@]}" --status > "$runs/sweep-jobs$1.status" 2>&1 &&
    grep -q "points: 3 complete" "$runs/sweep-jobs$1.status"
}
sweep 1 && sweep 2
rc=$?
verdict sweep "$rc" "($(tail -1 "$runs/sweep-jobs2.status" 2>/dev/null))"

# report, and the two sweeps' tables side by side.
"$EXTRAP" report "$runs/sweep-jobs1.h5" --out "$runs/report1" --python "$(command -v "$PYTHON")" > "$runs/report.log" 2>&1
rc=$?
if ((rc == 0)) && "$EXTRAP" report "$runs/sweep-jobs2.h5" --out "$runs/report2" --python "$(command -v "$PYTHON")" >> "$runs/report.log" 2>&1; then
  same=$(diff <(grep '^|' "$runs/report1/report.md") <(grep '^|' "$runs/report2/report.md") > /dev/null && echo identical || echo "differ (see $runs/report*/report.md)")
  verdict report 0 "(tables of --jobs 1 and --jobs 2: $same)"
else
  verdict report 1 "(see $runs/report.log)"
fi
exit $failed
