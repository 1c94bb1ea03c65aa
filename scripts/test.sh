#!/usr/bin/env bash
# Sets up (packages, the project's Python environment, default corpus, build) and runs the
# whole test suite through ctest. Checks that cannot run here (no CUDA device, no
# ../shared/data) are reported as skipped, with their reasons summed up at the end.
set -euo pipefail
ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
bash "$ROOT/scripts/setup.sh"
cd "$ROOT/build"
status=0
ctest --output-on-failure --timeout 600 -j "$(nproc 2>/dev/null || echo 2)" "$@" || status=$?
# The skip marker (EXTRAP_SKIP_MARKER in CMakeLists.txt), counted by reason.
reasons=$(grep -h -o 'EXTRAP_SKIPPED: .*' Testing/Temporary/LastTest.log 2>/dev/null | sort | uniq -c || true)
if [[ -n "$reasons" ]]; then
  echo "skipped, by reason:"
  echo "$reasons" | sed 's/EXTRAP_SKIPPED: //'
fi
exit "$status"
