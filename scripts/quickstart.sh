#!/usr/bin/env bash
# Sets up (packages, default corpus, build) and runs the main job on the default corpus.
set -euo pipefail
ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
bash "$ROOT/scripts/setup.sh"
cd "$ROOT"
build/extrap train --config configs/train_quick.yaml "$@"
echo "checkpoint and config: runs/quick-alibi/ (evaluate further with build/extrap eval --checkpoint runs/quick-alibi --length L)"
