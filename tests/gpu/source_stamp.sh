#!/usr/bin/env bash
# Prints a hash of every source tests/gpu/CMakeLists.txt builds from, so that device_check.sh can
# tell whether the binaries prepare.sh built here (.gpu-deps/prebuilt) are of this very tree. Run
# from the repository root; needs only find, sort and sha256sum (no git: the device has the
# working tree without its .git).
set -euo pipefail
find common kernels proto structured worker/arch worker/checkpoint worker/comm worker/engine worker/gpu worker/model tests/gpu -type f \
  \( -name '*.h' -o -name '*.cc' -o -name '*.cu' -o -name '*.cuh' -o -name 'CMakeLists.txt' \) -print0 |
  LC_ALL=C sort -z | xargs -0 sha256sum | sha256sum | cut -c1-16
