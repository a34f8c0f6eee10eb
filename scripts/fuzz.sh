#!/usr/bin/env bash
# Builds Ferry's coverage-guided fuzzers (tests/fuzz/, libFuzzer + ASan + UBSan, Debian's clang) into
# build-fuzz and runs each for SECONDS (default 60) from its seed corpus and regression inputs.
#   bash scripts/fuzz.sh [SECONDS] [TARGET...]     (SECONDS 0: build only)
# Exits nonzero when any target finds a crash, a hang (-timeout), or an allocation past the limits;
# the input that did it is printed (build-fuzz/fuzz-artifacts/<target>/...). New coverage-increasing
# inputs collect in build-fuzz/fuzz-corpus/<target> (not committed; see tests/fuzz/README.md).
# FERRY_FUZZ_FLAGS: more libFuzzer flags (later ones win), e.g. "-malloc_limit_mb=64".
set -euo pipefail
cd "$(dirname "$0")/.."

seconds=${1:-60}
shift || true
BUILD_DIR=${FERRY_FUZZ_BUILD_DIR:-build-fuzz}
mapfile -t all_targets < <(ls tests/fuzz/corpus)
targets=("$@")
((${#targets[@]})) || targets=("${all_targets[@]}")

CLANG_VERSION=${FERRY_FUZZ_CLANG_VERSION:-14}
if [ ! -f "$BUILD_DIR/build.ninja" ]; then
  launcher=()
  command -v ccache >/dev/null && launcher=(-DCMAKE_C_COMPILER_LAUNCHER=ccache -DCMAKE_CXX_COMPILER_LAUNCHER=ccache)
  cmake -S . -B "$BUILD_DIR" -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo -DFERRY_ENABLE_CUDA=OFF -DFERRY_FUZZ=ON \
    -DCMAKE_C_COMPILER="clang-$CLANG_VERSION" -DCMAKE_CXX_COMPILER="clang++-$CLANG_VERSION" "${launcher[@]}" >/dev/null
fi
build_start=$(date +%s)
cmake --build "$BUILD_DIR" -j "$(nproc)" --target "${targets[@]/%/_fuzz}"
echo "fuzz: built ${#targets[@]} targets in $(($(date +%s) - build_start)) s"
((seconds > 0)) || exit 0  # 0: build only (libFuzzer would read -max_total_time=0 as no limit)

failed=()
for t in "${targets[@]}"; do
  work="$BUILD_DIR/fuzz-corpus/$t"
  artifacts="$BUILD_DIR/fuzz-artifacts/$t/"
  mkdir -p "$work" "$artifacts"
  inputs=("$work" "tests/fuzz/corpus/$t")
  [ -d "tests/fuzz/regressions/$t" ] && inputs+=("tests/fuzz/regressions/$t")
  log="$BUILD_DIR/fuzz-artifacts/$t.log"
  echo "fuzz: $t for ${seconds} s (log $log)"
  # -rss_limit_mb: the whole process; -malloc_limit_mb: any one allocation (a hostile size field
  # must be refused before it sizes a buffer); -timeout: one input, in seconds.
  if "$BUILD_DIR/fuzz/${t}_fuzz" -max_total_time="$seconds" -rss_limit_mb=2048 -malloc_limit_mb=512 -timeout=25 \
      -max_len=16384 -print_final_stats=1 -artifact_prefix="$artifacts" ${FERRY_FUZZ_FLAGS:-} "${inputs[@]}" \
      >"$log" 2>&1; then
    grep -E "^stat::number_of_executed_units|^#[0-9]+.*DONE" "$log" | tail -2 | sed "s/^/fuzz: $t: /"
  else
    failed+=("$t")
    tail -n 40 "$log"
    echo "fuzz: $t FAILED; the input: $(grep -oE "(Test unit|artifact_prefix='[^']*'; Test unit) written to [^ ]+" "$log" | tail -1)"
    ls -1 "$artifacts" | sed "s|^|fuzz: $t artifact: $artifacts|"
  fi
done
if ((${#failed[@]})); then
  echo "fuzz: FAILED: ${failed[*]} (keep each input under tests/fuzz/regressions/<target>/ once fixed)"
  exit 1
fi
echo "fuzz: ${#targets[@]} targets, ${seconds} s each, no findings"
