#!/usr/bin/env bash
# Puts the cuDNN frontend's C++ headers (header-only; PyPI's nvidia-cudnn-frontend wheel, pinned
# below) into DEST/include, for extrap's cuDNN attention (core/attention/cuda/cudnn_attention.cpp).
# Only the headers: the wheel's Python module and its dependencies (CUTLASS's DSL, ...) are not
# installed. Idempotent: nothing happens when DEST holds this version already.
#
#   scripts/cudnn_frontend.sh DEST [PYTHON]    PYTHON: the pip to download with (default python3)
#
# scripts/setup.sh puts them in .venv/cudnn-frontend, scripts/gpu/fetch_debs.sh in
# .debs/cudnn-frontend (the GPU machine has no network); CMake looks in both.
set -euo pipefail
VERSION=1.32.0
dest=${1:?usage: $0 DEST [PYTHON]}
python=${2:-python3}
[[ "$(cat "$dest/VERSION" 2>/dev/null)" == "$VERSION" && -f "$dest/include/cudnn_frontend.h" ]] && exit 0
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
"$python" -m pip download --quiet --disable-pip-version-check --no-deps --only-binary=:all: \
  --dest "$tmp" "nvidia-cudnn-frontend==$VERSION" || {
  echo "cudnn_frontend: pip could not download nvidia-cudnn-frontend==$VERSION (see above); extrap builds without cuDNN's attention" >&2
  exit 1
}
rm -rf "$dest"
mkdir -p "$dest"
"$python" - "$tmp" "$dest" <<'PY'
import pathlib, sys, zipfile
wheel = next(pathlib.Path(sys.argv[1]).glob("*.whl"))
with zipfile.ZipFile(wheel) as z:
    headers = [n for n in z.namelist() if n.startswith("include/") and not n.endswith("/")]
    if not any(n == "include/cudnn_frontend.h" for n in headers):
        sys.exit(f"cudnn_frontend: {wheel.name} has no include/cudnn_frontend.h")
    for name in headers:
        z.extract(name, sys.argv[2])
    license = [n for n in z.namelist() if n.endswith("LICENSE.txt") or n.endswith("LICENSE")]
    for name in license[:1]:
        (pathlib.Path(sys.argv[2]) / "LICENSE").write_bytes(z.read(name))
PY
echo "$VERSION" >"$dest/VERSION"
echo "cudnn_frontend: headers of nvidia-cudnn-frontend $VERSION in $dest/include"
