#!/usr/bin/env bash
# Run HERE (a machine with Ferry's full build, no GPU needed) before tests/gpu/device_check.sh goes to a
# GPU machine that has CUDA but not Ferry's Debian packages. Fills .gpu-deps/ (git-ignored via
# .git/info/exclude) with:
#   include/nlohmann/       nlohmann_json headers (if the GPU machine lacks them)
#   googletest/             GoogleTest sources (built there by tests/gpu/CMakeLists.txt)
#   fixtures/<preset>.bin   the CPU engine's result for each engine parity case (tokens the GPU engine
#                           is teacher-forced with, every row's top logits, some whole rows)
# Then send it along: device run with carry [".gpu-deps"] (tests/gpu/README.md gives the call).
set -euo pipefail
cd "$(dirname "$0")/../.."
DEPS=${FERRY_GPU_DEPS:-.gpu-deps}
BUILD=${FERRY_BUILD_DIR:-build-gpu}
mkdir -p "$DEPS/include" "$DEPS/fixtures"
exclude=$(git rev-parse --git-path info/exclude)
grep -qx "/$DEPS/" "$exclude" 2>/dev/null || echo "/$DEPS/" >>"$exclude"

[ -d "$DEPS/include/nlohmann" ] || cp -r /usr/include/nlohmann "$DEPS/include/"
[ -d "$DEPS/googletest" ] || cp -r /usr/src/googletest "$DEPS/googletest"

[ -f "$BUILD/build.ninja" ] || cmake -S . -B "$BUILD" -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo
ninja -C "$BUILD" -j"${JOBS:-2}" ferry-gpu-parity-fixture
models=$(mktemp -d)
trap 'rm -rf "$models"' EXIT
for preset in tiny qwen2.5-0.5b; do
  "$BUILD/bin/ferry-gpu-parity-fixture" --preset "$preset" --model-dir "$models/$preset" \
    --out "$DEPS/fixtures/$preset.bin"
done
du -sh "$DEPS"
