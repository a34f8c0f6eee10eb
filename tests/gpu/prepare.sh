#!/usr/bin/env bash
# Run HERE (a machine with Ferry's full build, no GPU needed) before tests/gpu/device_check.sh goes
# to a GPU machine that has CUDA but not Ferry's Debian packages. Fills .gpu-deps/ (git-ignored via
# .git/info/exclude) with:
#   include/nlohmann/       nlohmann_json headers (if the GPU machine lacks them)
#   googletest/             GoogleTest sources (built there by tests/gpu/CMakeLists.txt)
#   fixtures/<preset>.bin   the CPU engine's result for each engine parity case (tokens the GPU engine
#                           is teacher-forced with, every row's top logits, some whole rows)
#   prebuilt.tar.xz         tests/gpu/CMakeLists.txt built here for sm_90 with the same nvcc:
#                           bin/ and tests/, stripped; prebuilt.stamp (tests/gpu/source_stamp.sh of
#                           the tree it was built from); device_check.sh uses it when the stamp
#                           matches and every library resolves there, and builds there otherwise
#                           (PREBUILT=0 skips it)
#   stack.tar.xz            the gateway, scheduler, worker, launcher and bench with their libraries
#                           (tests/gpu/bundle_stack.sh), for the end-to-end step
# Then send it along: device run with carry [".gpu-deps"], command `bash tests/gpu/device_check.sh "$OUT"`.
set -euo pipefail
cd "$(dirname "$0")/../.."
DEPS=${FERRY_GPU_DEPS:-.gpu-deps}
BUILD=${FERRY_BUILD_DIR:-build}
mkdir -p "$DEPS/include" "$DEPS/fixtures"
exclude=$(git rev-parse --git-path info/exclude)
grep -qx "/$DEPS/" "$exclude" 2>/dev/null || echo "/$DEPS/" >>"$exclude"

[ -d "$DEPS/include/nlohmann" ] || cp -r /usr/include/nlohmann "$DEPS/include/"
[ -d "$DEPS/googletest" ] || cp -r /usr/src/googletest "$DEPS/googletest"

[ -f "$BUILD/build.ninja" ] || cmake -S . -B "$BUILD" -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo
ninja -C "$BUILD" -j"${JOBS:-2}" ferry-gpu-parity-fixture
models=$(mktemp -d)
trap 'rm -rf "$models"' EXIT
for preset in tiny qwen2.5-0.5b tiny-qwen3 tiny-llama tiny-mistral tiny-lora; do
  "$BUILD/bin/ferry-gpu-parity-fixture" --preset "$preset" --model-dir "$models/$preset" \
    --out "$DEPS/fixtures/$preset.bin"
done
bash tests/gpu/bundle_stack.sh "$BUILD" "$DEPS/stack.tar.xz"

# The device check's own build, done here: minutes of device time saved, and a compile error
# seen here rather than there.
if [ "${PREBUILT:-1}" = 1 ]; then
  here=${FERRY_GPU_BUILD_HERE:-build-gpu-check-here}
  launcher=()
  command -v ccache >/dev/null && launcher=(-DCMAKE_CXX_COMPILER_LAUNCHER=ccache -DCMAKE_CUDA_COMPILER_LAUNCHER=ccache)
  cmake -S tests/gpu -B "$here" -G Ninja -DCMAKE_BUILD_TYPE=Release -DCMAKE_CUDA_ARCHITECTURES="${FERRY_GPU_ARCH:-90}" \
    -DFERRY_GPU_DEPS="$PWD/$DEPS" "${launcher[@]}" >/dev/null
  ninja -C "$here" -j"${JOBS:-2}"
  stage=$(mktemp -d)
  mkdir -p "$stage/bin" "$stage/tests"
  for dir in bin tests; do
    for f in "$here/$dir"/*; do
      [ -f "$f" ] && [ -x "$f" ] && strip -o "$stage/$dir/$(basename "$f")" "$f"
    done
  done
  rm -rf "$DEPS/prebuilt"  # an older layout
  tar -C "$stage" -cf - bin tests | xz -T2 -6 >"$DEPS/prebuilt.tar.xz"
  rm -rf "$stage"
  bash tests/gpu/source_stamp.sh >"$DEPS/prebuilt.stamp"
fi
# The device tool carries the working tree and these together, 64 MiB at most.
deps_kb=$(du -sk "$DEPS" | cut -f1)
tree_kb=$(git ls-files -z | xargs -0 du -ck 2>/dev/null | tail -n 1 | cut -f1)
echo "$DEPS: $((deps_kb / 1024)) MiB; with the tracked tree $(((deps_kb + tree_kb) / 1024)) MiB of the 64 MiB a device call carries"
if [ $((deps_kb + tree_kb)) -gt $((60 * 1024)) ]; then
  echo "prepare.sh: over 60 MiB: the device call would refuse it" >&2
  exit 1
fi
