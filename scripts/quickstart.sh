#!/usr/bin/env bash
# Sets up (packages, default corpus, build), runs the main job (configs/quick.yaml: six
# position methods trained at L = 32 bytes and evaluated to 16x that) and writes its report.
# Interrupted? Run it again: the sweep continues where it stopped.
set -euo pipefail
ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
bash "$ROOT/scripts/setup.sh"
cd "$ROOT"
build/extrap sweep configs/quick.yaml "$@"
build/extrap report results/quick.h5 --out reports/quick
echo
echo "results: results/quick.h5 (HDF5; schema in docs/formats.md)"
echo "report:  reports/quick/report.md (tables and plots)"
