#!/bin/bash
# ctest splits a test name at ';' (CMake's list separator) into names that match no test, and
# those fail. Lists extrap_tests' names and refuses any with a ';'.
#   bash scripts/check_test_names.sh build/tests/extrap_tests
set -euo pipefail
# Catch2 exits with the number of tests listed: the names are what counts.
names=$("$1" --list-test-names-only || true)
[ -n "$names" ] || { echo "$1 listed no tests" >&2; exit 1; }
if bad=$(grep -n ';' <<<"$names"); then
  echo "test names with a ';' (ctest splits them; use ',' or 'and'):" >&2
  echo "$bad" >&2
  exit 1
fi
echo "$(wc -l <<<"$names") test names, none with a ';'"
