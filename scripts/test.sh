#!/usr/bin/env bash
# Sets up (packages, default corpus, build) and runs the whole test suite through ctest.
# Tests that use ../shared/data skip cleanly where it does not exist.
set -euo pipefail
ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
bash "$ROOT/scripts/setup.sh"
cd "$ROOT/build"
ctest --output-on-failure --timeout 600 "$@"
