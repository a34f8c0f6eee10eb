#!/usr/bin/env bash
# Runs Ferry's whole test suite: installs and builds first (idempotent), then
# the C++ unit tests (ctest) and the end-to-end and parity tests (pytest).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
BUILD_DIR=${FERRY_BUILD_DIR:-build}
export FERRY_BUILD_DIR="$PWD/$BUILD_DIR"

status=0
ctest --test-dir "$BUILD_DIR" --output-on-failure -j 2 || status=1
.venv/bin/python -m pytest -q tests/python || status=1
exit $status
