#!/usr/bin/env bash
# Builds Ferry under sanitizers (CMake option FERRY_SANITIZE, GCC 12, CUDA off) and runs its tests there.
#
#   scripts/sanitize.sh [asan|tsan|all] [--quick|--skip-slow]
#
# asan: ASan+UBSan build in build-asan; every C++ test (ctest), then the end-to-end tests that start the
#       three services (pytest, binaries from build-asan through FERRY_BUILD_DIR). The minutes-long
#       simulator and stress tests (ASAN_SLOW) take over an hour of it on 2 cores, and two
#       SimAcceptanceTest cases pass ctest's 600 s limit there (a timeout, not a report).
# tsan: TSan build in build-tsan of the concurrent parts: scheduler engine loop and async scheduling,
#       the scheduler's gRPC service and its worker client (scheduler_service_test, worker_service*_test,
#       worker_loss_test), the gateway's call lifecycle, scheduler client and replica router
#       (gateway_service_test), job store, HTTP front (SSE stream, connection watch). The tests run
#       against Debian's own Abseil and gRPC rebuilt with -fsanitize=thread (scripts/tsan-deps.sh, once,
#       into build-tsan/tsan-deps, about 16 min), so that TSan sees the locks and atomics gRPC orders its
#       callbacks with.
# --skip-slow: asan builds and runs everything but ASAN_SLOW (their code paths are the short
#       tests' own); --slow-only runs just ASAN_SLOW, one at a time and with no time limit
#       (tests/sanitizers/run_without_timeout.py), over an hour here.
# --quick: a subset to run by hand before a commit (docs/testing.md, "Sanitizers"; .ci/run runs no sanitizer:
#       they do not fit its budget from a cold build): asan builds only the parser, scheduler-core
#       and worker-service tests (skipping the minutes-long randomised/simulator ones) and the
#       services, and runs four end-to-end files (E2E_QUICK); tsan unchanged.
#
# A report anywhere fails the run: UBSan and TSan halt on the first one, ASan aborts, and every
# process (services started by the end-to-end tests included) writes its reports under
# <build>/sanitizer-logs, which must stay empty. Suppressions: tests/sanitizers/*.supp (third-party
# code only). ASAN_BUILD_DIR / TSAN_BUILD_DIR move the build dirs. Exit status 0 only when every selected test passed with no report.
set -euo pipefail
cd "$(dirname "$0")/.."
REPO=$PWD
which=${1:-all}
quick=0
skip_slow=0
slow_only=0
usage="usage: $0 [asan|tsan|all] [--quick|--skip-slow|--slow-only]"
case "${2:-}" in
  --quick) quick=1 ;;
  --skip-slow) skip_slow=1 ;;
  --slow-only) slow_only=1 ;;
  "") ;;
  *) echo "$usage" >&2; exit 2 ;;
esac
case "$which" in asan|tsan|all) ;; *) echo "$usage" >&2; exit 2 ;; esac
JOBS=${JOBS:-$(nproc)}
SUPP=$REPO/tests/sanitizers

# The concurrent parts, by test target (tsan builds only these).
TSAN_TARGETS=(engine_loop_test async_scheduling_test gateway_jobs_test sse_stream_test connection_watch_test
              scheduler_service_test worker_service_test worker_service_overlap_test worker_loss_test
              gateway_service_test)
# asan --quick: the hand-written parsers, scheduler core and worker service.
ASAN_QUICK_TARGETS=(json_schema_test regex_dfa_test ebnf_grammar_test grammar_pda_test tokenizer_test
                    incremental_decoder_test bpe_trainer_test utf8_test openai_format_test responses_format_test sse_stream_test
                    safetensors_test block_manager_test scheduler_core_test scheduler_policy_test
                    prefix_cache_test step_alloc_test async_scheduling_test engine_loop_test worker_service_test
                    ferry-launch ferry-gateway ferry-scheduler ferry-worker ferry-make-model)
# asan --quick end-to-end: validation, scheduling, priorities and cancels, jobs (67 tests, 80 s under ASan).
E2E_QUICK=(test_e2e_validation.py test_e2e_scheduler.py test_e2e_priority_cancel.py test_jobs.py)
# Minutes-long simulator and stress tests: the same code paths as the short tests, so --quick skips them.
# (RandomisedTimelineTest: ~100 s per case under ASan, 1.2 s without.)
ASAN_SLOW='SimAcceptanceTest|SchedulerStressTest|Qwen2_0_5BSmokeTest|LinearBatchInvarianceUnder|RandomisedTimelineTest'

# Wall-clock budgets (tokens per ms), which instrumentation breaks by design: not a sanitizer check.
TIMING='PerformanceTest'
# Plain add_test entries tsan does not build: linear_batch_invariance_test (worker/model) and the
# fuzz targets' replays (single-threaded parsers: ASan's and the fuzzers').
TSAN_UNBUILT='LinearBatchInvarianceUnder|fuzz_replay\.'

configure() {  # dir sanitizer
  if [ ! -f "$1/build.ninja" ]; then
    local launcher=()  # ccache where installed (not part of scripts/setup.sh)
    command -v ccache >/dev/null && launcher=(-DCMAKE_C_COMPILER_LAUNCHER=ccache -DCMAKE_CXX_COMPILER_LAUNCHER=ccache)
    nice -n 19 cmake -S . -B "$1" -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo -DFERRY_ENABLE_CUDA=OFF \
      -DFERRY_SANITIZE="$2" "${launcher[@]}" >/dev/null
  fi
}

# Fails when any process wrote a sanitizer report during the run.
check_logs() {  # dir
  if compgen -G "$1/sanitizer-logs/*" >/dev/null; then
    echo "sanitize: reports in $1/sanitizer-logs:" >&2
    for f in "$1"/sanitizer-logs/*; do echo "== $f" >&2; head -60 "$f" >&2; done
    return 1
  fi
}

run_asan() {
  local dir=${ASAN_BUILD_DIR:-build-asan} status=0
  configure "$dir" address,undefined
  # A failed build stops the run here (set -e does not hold inside `run_asan || ...`): the tests of a
  # partial build would run against stale or missing binaries.
  if ((quick)); then
    nice -n 19 cmake --build "$dir" -j "$JOBS" --target "${ASAN_QUICK_TARGETS[@]}" || return 1
  else
    nice -n 19 cmake --build "$dir" -j "$JOBS" || return 1
  fi
  rm -rf "$dir/sanitizer-logs" && mkdir -p "$dir/sanitizer-logs"
  export ASAN_OPTIONS="detect_leaks=1:abort_on_error=1:halt_on_error=1:detect_stack_use_after_return=1:strict_string_checks=1:check_initialization_order=1:log_path=$REPO/$dir/sanitizer-logs/asan:log_exe_name=1"
  export LSAN_OPTIONS="suppressions=$SUPP/lsan.supp:print_suppressions=0"
  export UBSAN_OPTIONS="print_stacktrace=1:halt_on_error=1:suppressions=$SUPP/ubsan.supp:log_path=$REPO/$dir/sanitizer-logs/ubsan:log_exe_name=1"
  if ((slow_only)); then
    python3 tests/sanitizers/run_without_timeout.py "$dir" "$ASAN_SLOW" || status=1
    check_logs "$dir" || status=1
    unset ASAN_OPTIONS LSAN_OPTIONS UBSAN_OPTIONS
    return $status
  fi
  local exclude="_NOT_BUILT|$TIMING"
  ((quick || skip_slow)) && exclude="$exclude|$ASAN_SLOW"
  nice -n 19 ctest --test-dir "$dir" --output-on-failure -j "$JOBS" -E "$exclude" || status=1
  check_logs "$dir" || status=1
  # The end-to-end tests: every process of the stack runs instrumented and logs under sanitizer-logs.
  local e2e=(tests/python)
  ((quick)) && e2e=("${E2E_QUICK[@]/#/tests/python/}")
  FERRY_BUILD_DIR="$REPO/$dir" nice -n 19 .venv/bin/python -m pytest -q "${e2e[@]}" || status=1
  check_logs "$dir" || status=1
  unset ASAN_OPTIONS LSAN_OPTIONS UBSAN_OPTIONS
  return $status
}

run_tsan() {
  local dir=${TSAN_BUILD_DIR:-build-tsan} status=0
  configure "$dir" thread
  nice -n 19 cmake --build "$dir" -j "$JOBS" --target "${TSAN_TARGETS[@]}" || return 1
  bash scripts/tsan-deps.sh "$dir/tsan-deps" || return 1
  rm -rf "$dir/sanitizer-logs" && mkdir -p "$dir/sanitizer-logs"
  # One OpenMP thread: GCC's libgomp is not TSan-aware and none of these parts use OpenMP.
  # The instrumented Abseil and gRPC come first on the loader's path (same SONAMEs as the system's).
  LD_LIBRARY_PATH="$REPO/$dir/tsan-deps/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}" OMP_NUM_THREADS=1 \
  TSAN_OPTIONS="halt_on_error=1:second_deadlock_stack=1:history_size=4:suppressions=$SUPP/tsan.supp:log_path=$REPO/$dir/sanitizer-logs/tsan:log_exe_name=1" \
    nice -n 19 ctest --test-dir "$dir" --output-on-failure -j "$JOBS" -E "_NOT_BUILT|$TSAN_UNBUILT|$TIMING" || status=1
  check_logs "$dir" || status=1
  return $status
}

status=0
start=$SECONDS
if [ "$which" = asan ] || [ "$which" = all ]; then
  run_asan || status=1
  echo "sanitize: asan done in $(((SECONDS - start) / 60)) min (status $status)"
fi
if [ "$which" = tsan ] || [ "$which" = all ]; then
  t=$SECONDS
  run_tsan || status=1
  echo "sanitize: tsan done in $(((SECONDS - t) / 60)) min (status $status)"
fi
exit $status
