#!/usr/bin/env bash
# Downloads, on a machine with network access and Debian 12 package lists, the .deb files
# that the GPU device machine lacks to build extrap (it has CUDA, CMake, a compiler and
# PyTorch, but no network): yaml-cpp, Boost.Program_options, HDF5, Catch2, nlohmann-json,
# xxhash and SentencePiece, with the runtime libraries they load, and the cuDNN frontend's headers
# (from PyPI, scripts/cudnn_frontend.sh). They land in .debs/ (git-ignored), which a device call
# carries (carry: [".debs"]) and scripts/gpu/run_on_device.sh unpacks into a private prefix.
#
#   scripts/gpu/fetch_debs.sh            # everything
#   scripts/gpu/fetch_debs.sh yaml-cpp   # only the yaml-cpp packages (a quick check)
#
# .debs/main/      always unpacked (headers, CMake files, the libraries themselves)
# .debs/fallback/  the libraries HDF5 loads (curl, ssl, ...), put on LD_LIBRARY_PATH only
#                  when the device machine's own copies are missing
set -euo pipefail
cd "$(git -C "$(dirname "$0")" rev-parse --show-toplevel)"

yaml=(libyaml-cpp-dev libyaml-cpp0.7)
main=("${yaml[@]}"
      libboost-program-options-dev libboost-program-options1.74-dev
      libboost-program-options1.74.0 libboost1.74-dev
      libhdf5-dev libhdf5-103-1 libhdf5-cpp-103-1 libhdf5-hl-100 libhdf5-hl-cpp-100
      libsz2 libaec0
      catch2 nlohmann-json3-dev libxxhash-dev libxxhash0
      libsentencepiece-dev libsentencepiece0
      libgloo-dev)  # headers only: c10d's ProcessGroupGloo.hpp includes them
# libhdf5-103-1's runtime dependencies beyond libc and libstdc++ (apt-cache depends --recurse).
fallback=(libcurl4 libssl3 libbrotli1 libgssapi-krb5-2 libk5crypto3 libkrb5-3 libkrb5support0
          libkeyutils1 libcom-err2 libldap-2.5-0 libsasl2-2 libnghttp2-14 libpsl5 librtmp1
          libgnutls30 libhogweed6 libnettle8 libgmp10 libidn2-0 libunistring2 libp11-kit0
          libtasn1-6 libffi8 libssh2-1 libzstd1 zlib1g)

if [[ "${1:-all}" == yaml-cpp ]]; then
  main=("${yaml[@]}")
  fallback=()
fi

download() {  # folder packages...
  local folder=$1
  shift
  mkdir -p "$folder"
  # apt's sandbox user cannot write to every folder; download as the caller then.
  (cd "$folder" && apt-get download -o APT::Sandbox::User=root "$@")
}

download .debs/main "${main[@]}"
if ((${#fallback[@]})); then
  download .debs/fallback "${fallback[@]}"
fi
# The cuDNN frontend's headers (PyPI, not Debian): the GPU build finds them in .debs/cudnn-frontend.
if [[ "${1:-all}" != yaml-cpp ]]; then
  bash scripts/cudnn_frontend.sh .debs/cudnn-frontend "$([[ -x .venv/bin/python ]] && echo .venv/bin/python || echo python3)"
fi
du -sh .debs
debs=(.debs/main/*.deb .debs/fallback/*.deb)
echo "debs: ${#debs[@]}"
