#!/usr/bin/env bash
# The GPU device check (#28): one command, one shot, on a cold machine with an NVIDIA GPU and the CUDA
# toolkit. From the repository root:
#
#   bash tests/gpu/device_check.sh [RESULTS_DIR]
#
# RESULTS_DIR defaults to $OUT (the device tool's folder that comes back), else
# /tmp/ferry-device-check. Everything is written there as it happens, so a run cut short still
# returns what it did; at most 8 files: summary.md (environment, one row per step, the figures),
# env.txt, build.log, tests.log (every gtest binary's output), results.json (the gtest, benchmark
# and HF results, merged at the end), bench.log, hf.log, e2e.log.
#
# Every step runs under its own timeout, clamped to an overall deadline (DEADLINE_S, at most 540 s,
# so that one device call of 600 s returns its files); no step depends on another having passed
# (each makes the checkpoint it needs if it is not there); the build keeps going past a broken
# target (ninja -k 0); a gtest binary whose tests all skipped counts as a failure, as does one
# that is missing. Order: environment, build, kernel tests, runner tests, parity, benchmark, HF
# comparison, the three services end to end. Without a GPU it reports "no GPU" and stops cleanly
# after the build (exit 3).
# Env: DEADLINE_S (540), FERRY_GPU_ARCH (90), JOBS (nproc), FERRY_GPU_BUILD (build-gpu-check),
# FERRY_GPU_DEPS (.gpu-deps, from tests/gpu/prepare.sh), SKIP_E2E=1, SKIP_BUILD=1 (use FERRY_GPU_BUILD as is),
# PREBUILT=0 (build here even when prepare.sh's prebuilt binaries are of this tree).
set -uo pipefail
cd "$(dirname "$0")/../.." || exit 1
ROOT=$PWD
T0=$(date +%s)
DEADLINE_S=${DEADLINE_S:-540}
[ "$DEADLINE_S" -gt 540 ] && DEADLINE_S=540
R=${1:-${OUT:-/tmp/ferry-device-check}}
ARCH=${FERRY_GPU_ARCH:-90}
JOBS=${JOBS:-$(nproc)}
BUILD=${FERRY_GPU_BUILD:-build-gpu-check}
DEPS=${FERRY_GPU_DEPS:-$ROOT/.gpu-deps}
MODELS=${FERRY_GPU_MODELS:-/tmp/ferry-gpu-models}
PREBUILT_DIR=/tmp/ferry-gpu-prebuilt
QWEN=$MODELS/qwen2.5-0.5b
mkdir -p "$R" "$MODELS"
SUMMARY=$R/summary.md
: >"$SUMMARY"
JSON_DIR=$(mktemp -d)
trap 'rm -rf "$JSON_DIR"' EXIT
status=0
have_gpu=0

say() { echo "$*" | tee -a "$SUMMARY"; }
left_s() { echo $((DEADLINE_S - ($(date +%s) - T0))); }

# step NAME LOG LIMIT_S CMD...: runs CMD with its output tee'd into $R/LOG, under LIMIT_S clamped to
# what the deadline leaves; one summary row: PASS, FAIL (exit code), TIMEOUT, SKIP (exit 77, or no
# time left), and its seconds.
step() {
  local name=$1 log=$2 limit=$3 start rc verdict
  shift 3
  local left
  left=$(($(left_s) - 5))
  [ "$limit" -gt "$left" ] && limit=$left
  if [ "$limit" -le 0 ]; then
    say "| $name | SKIP (no time left before the ${DEADLINE_S} s deadline) | 0 s |"
    return 0
  fi
  start=$(date +%s)
  echo "== $name (up to $limit s): $*" | tee -a "$R/$log"
  # A child bash, so that CMD may be one of the functions below (exported at the end of them).
  timeout --kill-after=5 "$limit" bash -c '"$@"' step "$@" 2>&1 | tee -a "$R/$log"
  rc=${PIPESTATUS[0]}
  case $rc in
    0) verdict=PASS ;;
    77) verdict=SKIP ;;
    124 | 137) verdict="TIMEOUT after $limit s"; status=1 ;;
    *) verdict="FAIL (exit $rc)"; status=1 ;;
  esac
  say "| $name | $verdict | $(($(date +%s) - start)) s |"
  return 0
}

# Where libNAME.so is: the loader's cache, else the CUDA toolkit's folders, else torch's pip wheels,
# else "not found".
library() {
  local found
  local pip_nvidia  # torch's wheels bring their own cuBLAS and NCCL (site-packages/nvidia/*/lib)
  pip_nvidia=$(python3 -c 'import nvidia; print(" ".join(nvidia.__path__))' 2>/dev/null)
  found=$( (ldconfig -p 2>/dev/null; find /usr/local/cuda*/lib* -maxdepth 1 -name "lib$1.so*" 2>/dev/null
    [ -n "$pip_nvidia" ] && find $pip_nvidia -maxdepth 3 -name "lib$1.so*" 2>/dev/null) |
    grep -o "/[^ ]*lib$1\.so[^ ]*" | head -n 1)
  echo "${found:-not found}"
}

# LD_LIBRARY_PATH gains the folders of CUDA's runtime, cuBLAS and NCCL, wherever they are here, so
# that binaries built elsewhere (prebuilt.tar.xz, the stack bundle) find them.
cuda_library_path() {
  local lib path
  for lib in cudart cublas cublasLt nccl; do
    path=$(library $lib)
    [ "$path" = "not found" ] || LD_LIBRARY_PATH="$(dirname "$path")${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
  done
  export LD_LIBRARY_PATH
}

# Whether prepare.sh's binaries (built on the development machine with the same nvcc) are of this
# very tree and load here; then the build is skipped.
use_prebuilt() {
  local want got
  [ "${PREBUILT:-1}" = 1 ] || { echo "PREBUILT=0: building here"; return 1; }
  [ -f "$DEPS/prebuilt.stamp" ] && [ -f "$DEPS/prebuilt.tar.xz" ] ||
    { echo "no prebuilt binaries in $DEPS: building here"; return 1; }
  want=$(cat "$DEPS/prebuilt.stamp")
  got=$(bash tests/gpu/source_stamp.sh)
  [ "$want" = "$got" ] || { echo "prebuilt binaries are of another tree ($want, this one is $got): building here"; return 1; }
  rm -rf "$PREBUILT_DIR" && mkdir -p "$PREBUILT_DIR" && xz -dc "$DEPS/prebuilt.tar.xz" | tar -C "$PREBUILT_DIR" -xf - ||
    { echo "prebuilt.tar.xz does not unpack: building here"; return 1; }
  if ldd "$PREBUILT_DIR"/bin/* "$PREBUILT_DIR"/tests/* 2>&1 | grep "not found"; then
    echo "prebuilt binaries miss libraries here: building here"
    return 1
  fi
  echo "prebuilt binaries of this tree ($got): no build"
}

environment() {
  echo "date: $(date -u +%FT%TZ); host: $(hostname); cores: $(nproc)"
  echo "git: $(git rev-parse --short HEAD 2>/dev/null) $(git status --porcelain 2>/dev/null | wc -l) changed files"
  if command -v nvidia-smi >/dev/null && nvidia-smi -L >/dev/null 2>&1; then
    nvidia-smi --query-gpu=name,memory.total,driver_version,compute_cap --format=csv,noheader
    nvidia-smi
  else
    echo "nvidia-smi: $(command -v nvidia-smi || echo absent); no GPU answers"
  fi
  echo "nvcc: $(command -v nvcc || echo absent) $(nvcc --version 2>/dev/null | tail -n 1)"
  echo "cmake: $(cmake --version 2>/dev/null | head -n 1); ninja: $(ninja --version 2>/dev/null); g++: $(g++ -dumpversion 2>/dev/null)"
  echo "cuBLAS: $(library cublas)"
  echo "NCCL: $(library nccl)"
  echo "python: $(python3 -c 'import sys; print(sys.version.split()[0])' 2>/dev/null)" \
    "torch: $(python3 -c 'import torch; print(torch.__version__, torch.cuda.is_available())' 2>/dev/null || echo absent)"
}

build() {
  [ "${SKIP_BUILD:-0}" = 1 ] && { echo "SKIP_BUILD=1: using $BUILD as it is"; return 0; }
  cmake -S tests/gpu -B "$BUILD" -G Ninja -DCMAKE_BUILD_TYPE=Release -DCMAKE_CUDA_ARCHITECTURES="$ARCH" \
    -DFERRY_GPU_DEPS="$DEPS" || return 1
  ninja -C "$BUILD" -k 0 -j"$JOBS"  # a broken target does not stop the others
}

# gtest BINARY [ARGS...]: its results into $JSON_DIR; fails when missing, failing, or all skipped.
gtest() {
  local bin=$1 name
  shift
  name=$(basename "$bin")
  [ -x "$bin" ] || { echo "$name: not built (see build.log)"; return 1; }
  "$bin" --gtest_output="json:$JSON_DIR/$name.json" "$@"
  local rc=$?
  python3 - "$JSON_DIR/$name.json" "$name" <<'PY' || rc=1
import json, sys
try:
    doc = json.load(open(sys.argv[1]))
except Exception as e:
    sys.exit(f"{sys.argv[2]}: no results ({e})")
cases = [t for s in doc.get("testsuites", []) for t in s.get("testsuite", [])]
skipped = sum(1 for t in cases if t.get("result") == "SKIPPED")
print(f"{sys.argv[2]}: {len(cases)} tests, {skipped} skipped, {doc.get('failures', 0)} failed")
if skipped == len(cases):  # none ran (a filter matched nothing), or every one skipped
    sys.exit(f"{sys.argv[2]}: every test skipped: nothing was checked")
PY
  return $rc
}

kernel_tests() {
  local rc=0 found=0 bin
  for bin in "$BUILD"/tests/cuda_*_test; do
    [ -e "$bin" ] || continue
    found=1
    gtest "$bin" || rc=1
  done
  [ $found = 1 ] || { echo "no kernel test was built (see build.log)"; return 1; }
  return $rc
}

# The checkpoint of PRESET in $MODELS, written by the parity test when absent (it writes before it
# compares, so its verdict does not matter here).
ensure_model() {
  local preset=$1 filter=TinyMatchesCpu
  [ "$preset" = qwen2.5-0.5b ] && filter=Qwen2_5_0_5BMatchesCpu
  [ -f "$MODELS/$preset/model.safetensors" ] && return 0
  FERRY_GPU_PARITY_MODELS="$MODELS" FERRY_GPU_PARITY_QWEN=1 FERRY_GPU_PARITY_FIXTURES="$DEPS/fixtures" \
    "$BUILD/tests/gpu_runner_parity_test" --gtest_filter="*$filter" >/dev/null 2>&1
  [ -f "$MODELS/$preset/model.safetensors" ] || { echo "could not write the $preset checkpoint"; return 1; }
}

parity() {
  FERRY_GPU_PARITY_MODELS="$MODELS" FERRY_GPU_PARITY_FIXTURES="$DEPS/fixtures" FERRY_GPU_PARITY_QWEN=1 \
    gtest "$BUILD/tests/gpu_runner_parity_test"
}

bench() {
  ensure_model qwen2.5-0.5b || return 1
  "$BUILD/bin/ferry-gpu-bench" --model-dir "$QWEN" --context 512 --batch 1,8,64,256 --steps 20 \
    --attention new --attention old --offline 2048 --output 128 --sampled --json "$JSON_DIR/bench.json"
}

hf() {
  python3 -c "import torch, transformers" 2>/dev/null || { echo "torch/transformers absent: skipped"; return 77; }
  ensure_model qwen2.5-0.5b && ensure_model tiny || return 1
  python3 tests/gpu/hf_compare.py --model "$QWEN" --tiny "$MODELS/tiny" --build "$BUILD" --json "$JSON_DIR/hf.json"
}

# STACK_BIN: the stack's binaries. From the bundle prepare.sh packed on the development machine
# (tests/gpu/bundle_stack.sh: the stack and its libraries, CUDA's excepted), else built here where
# the full build's packages are (gRPC, oneDNN, ...). Returns 77 when neither can be had.
stack() {
  if [ -f "$DEPS/stack.tar.xz" ]; then
    local dir=/tmp/ferry-stack missing
    rm -rf "$dir" && mkdir -p "$dir" && xz -dc "$DEPS/stack.tar.xz" | tar -C "$dir" -xf - || return 1
    export LD_LIBRARY_PATH="$dir/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
    missing=$(ldd "$dir"/bin/* 2>&1 | grep "not found" | sort -u)
    [ -z "$missing" ] || { echo "the stack bundle's libraries are incomplete here:"; echo "$missing"; return 1; }
    STACK_BIN=$dir/bin
    echo "stack: the bundle from $DEPS/stack.tar.xz; LD_LIBRARY_PATH=$LD_LIBRARY_PATH"
    return 0
  fi
  cmake -S . -B build-full -G Ninja -DCMAKE_BUILD_TYPE=Release -DCMAKE_CUDA_ARCHITECTURES="$ARCH" >/dev/null 2>&1 ||
    { echo "no stack bundle ($DEPS/stack.tar.xz) and the full build's packages are absent: skipped"; return 77; }
  ninja -C build-full -j"$JOBS" ferry-launch ferry-worker ferry-scheduler ferry-gateway ferry-bench ferry_gpu_plugin ||
    return 1
  STACK_BIN=$ROOT/build-full/bin
}

# Gateway, scheduler and GPU worker, real processes: 2,048 requests of 512 prompt / 128 output
# tokens, all at once, once greedy and once with Qwen2.5-Instruct's sampling defaults.
e2e() {
  [ "${SKIP_E2E:-0}" = 1 ] && { echo "SKIP_E2E=1"; return 77; }
  ensure_model qwen2.5-0.5b || return 1
  stack || return $?
  local run_dir ready launch rc=0 mode
  run_dir=$(mktemp -d)
  ready=$run_dir/stack.json
  "$STACK_BIN/ferry-launch" --model "$QWEN" --port 0 --run-dir "$run_dir" --ready-file "$ready" \
    --log-level warn --worker-arg=--device=cuda --max-num-seqs 256 --max-num-batched-tokens 8192 &
  launch=$!
  for _ in $(seq 900); do [ -f "$ready" ] && break; kill -0 $launch 2>/dev/null || return 1; sleep 0.2; done
  [ -f "$ready" ] || { echo "the stack was not ready within 180 s"; kill -TERM $launch; return 1; }
  for mode in greedy sampled; do
    local sampling=(--temperature 0)
    [ $mode = sampled ] && sampling=(--temperature 0.7 --top-p 0.8 --top-k 20 --repetition-penalty 1.05)
    "$STACK_BIN/ferry-bench" run --stack-file "$ready" --no-progress --num-requests 2048 --concurrency 2048 \
      --input-len 512 --output-len 128 --token-id-min 10 --token-id-max 150000 --request-timeout-s 120 \
      --label "e2e $mode" --json "$JSON_DIR/e2e_$mode.json" "${sampling[@]}" || rc=1
    python3 -c 'import json, sys; r = json.load(open(sys.argv[1]))
print(f"e2e {sys.argv[2]}: {r[\"completed\"]} of 2048 completed, {r[\"output_throughput\"]:.0f} output tokens/s")' \
      "$JSON_DIR/e2e_$mode.json" $mode || rc=1
  done
  kill -TERM $launch
  wait $launch
  return $rc
}

export ROOT ARCH JOBS BUILD DEPS MODELS QWEN JSON_DIR
export -f library build gtest kernel_tests ensure_model parity bench hf stack e2e

say "# Ferry device check, $(date -u +%FT%TZ)"
say ""
environment >"$R/env.txt" 2>&1
sed 's/^/    /' "$R/env.txt" | tee -a "$SUMMARY"
nvidia-smi -L >/dev/null 2>&1 && have_gpu=1
say ""
say "| step | result | time |"
say "|---|---|---|"
cuda_library_path
if use_prebuilt >>"$R/build.log" 2>&1; then
  BUILD=$PREBUILT_DIR
  say "| build | prebuilt on the development machine ($(cat "$DEPS/prebuilt.stamp")) | 0 s |"
else
  step build build.log 360 build
fi
if [ $have_gpu = 0 ]; then
  say "| kernel tests and everything after | no GPU: nothing to run on a device | 0 s |"
  say "total $(($(date +%s) - T0)) s"
  exit 3
fi
step "kernel tests" tests.log 60 kernel_tests
step "runner tests" tests.log 60 gtest "$BUILD/tests/gpu_runner_test"
step "device sampler tests" tests.log 60 gtest "$BUILD/tests/gpu_device_sampler_test"
step parity tests.log 120 parity
step benchmark bench.log 180 bench
# The benchmark's table, as soon as it exists.
grep -h -A10 "^| attention | batch" "$R/bench.log" 2>/dev/null | tee -a "$SUMMARY"
grep -h "^offline\|^prefill\|^mixed" "$R/bench.log" 2>/dev/null | tee -a "$SUMMARY"
step "HF comparison" hf.log 120 hf
grep -h "^hf " "$R/hf.log" 2>/dev/null | tee -a "$SUMMARY"
step "end to end" e2e.log 240 e2e
grep -h "^e2e " "$R/e2e.log" 2>/dev/null | tee -a "$SUMMARY"
python3 - "$JSON_DIR" "$R/results.json" <<'PY'
import json, pathlib, sys
merged = {p.stem: json.loads(p.read_text()) for p in sorted(pathlib.Path(sys.argv[1]).glob("*.json"))}
pathlib.Path(sys.argv[2]).write_text(json.dumps(merged, indent=1))
PY
say "total $(($(date +%s) - T0)) s; results in $R"
exit $status
