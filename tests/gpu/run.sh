#!/usr/bin/env bash
# The GPU checks of issue #8, in one script for a machine with an NVIDIA GPU (built for sm_90 by
# default: FERRY_GPU_ARCH), CUDA 12.4+ (nvcc, cuBLAS), CMake 3.24+ and Ninja. From the repo root:
#
#   bash tests/gpu/run.sh
#
# 1. builds tests/gpu (the kernels, the GPU engine, their tests and ferry-gpu-bench) for sm_90;
# 2. runs every kernel test against its host reference on fresh random inputs (seed printed);
# 3. runs the engine tests and the engine parity test against the CPU engine on the tiny and
#    qwen2.5-0.5b shapes (greedy tokens identical for 32 steps, logits within bf16 tolerance);
#    where the CPU engine cannot be built here, its recorded result from .gpu-deps/fixtures
#    (tests/gpu/prepare.sh, run beforehand on a machine with the full build);
# 4. compares logits with transformers' Qwen2 on the same checkpoint, and times HF generate with
#    static batches of 32 (skipped cleanly without torch/transformers);
# 5. benchmarks: decode step at batch 1/64/256 vs the memory floor, prefill, and 2,048 requests
#    of 512 prompt / 128 output through the engine; through the whole stack too (ferry-launch +
#    ferry-bench) when the full build's packages are present here;
# and prints a short table last. Needs: nvcc, cmake, ninja, g++ with OpenMP, NCCL (system,
# NCCL_ROOT, or PyTorch's nvidia-nccl wheel), GoogleTest and nlohmann_json (system, or
# .gpu-deps/ from prepare.sh). Logs go to /tmp/ferry-gpu-out (FERRY_GPU_LOGS), and as
# $OUT/gpu-logs.tgz when OUT is set. Budget: < 8 minutes.
# Env: FERRY_GPU_ARCH (90), JOBS (nproc), SKIP_E2E=1 (no full-stack run).
set -uo pipefail
cd "$(dirname "$0")/../.."
ROOT=$PWD
ARCH=${FERRY_GPU_ARCH:-90}
JOBS=${JOBS:-$(nproc)}
LOGS=${FERRY_GPU_LOGS:-/tmp/ferry-gpu-out}
BUILD=${FERRY_GPU_BUILD:-build-gpu-check}
MODELS=${FERRY_GPU_MODELS:-/tmp/ferry-gpu-models}
DEPS=${FERRY_GPU_DEPS:-$ROOT/.gpu-deps}
mkdir -p "$LOGS" "$MODELS"
T0=$(date +%s)
declare -a ROWS
status=0

# run NAME CMD...: logs to $LOGS/NAME.log, records PASS/FAIL/SKIP (exit 77) and seconds.
run() {
  local name=$1 run_start=$(date +%s) rc
  shift
  echo "== $name: $*"
  "$@" >"$LOGS/$name.log" 2>&1
  rc=$?
  local verdict=PASS
  if [ $rc -eq 77 ]; then verdict=SKIP; elif [ $rc -ne 0 ]; then verdict=FAIL; status=1; fi
  ROWS+=("| $name | $verdict | $(($(date +%s) - run_start)) s |")
  if [ $verdict = FAIL ]; then tail -n 40 "$LOGS/$name.log"; else tail -n 3 "$LOGS/$name.log"; fi
  return $rc
}

nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader 2>/dev/null || echo "(no nvidia-smi)"
nvcc --version | tail -n 1

configure() {
  cmake -S tests/gpu -B "$BUILD" -G Ninja -DCMAKE_BUILD_TYPE=Release -DCMAKE_CUDA_ARCHITECTURES="$ARCH" \
    -DFERRY_GPU_DEPS="$DEPS"
}
run configure configure || { echo "configure failed: see $LOGS/configure.log"; exit 1; }
run build ninja -C "$BUILD" -j"$JOBS" || { echo "build failed: see $LOGS/build.log"; exit 1; }

kernel_tests() {
  local rc=0 test_bin
  for test_bin in "$BUILD"/tests/cuda_*_test; do "$test_bin" || rc=1; done
  return $rc
}
run kernel-tests kernel_tests

run engine-tests "$BUILD/tests/gpu_runner_test"

parity() {
  FERRY_GPU_PARITY_MODELS="$MODELS" FERRY_GPU_PARITY_FIXTURES="$DEPS/fixtures" FERRY_GPU_PARITY_QWEN=1 \
    "$BUILD/tests/gpu_runner_parity_test"
}
run engine-parity parity

QWEN="$MODELS/qwen2.5-0.5b"  # written by the parity test (the qwen2.5-0.5b preset's shape)
hf() {
  python3 -c "import torch, transformers" 2>/dev/null || { echo "torch/transformers absent: skipped"; return 77; }
  [ -f "$QWEN/model.safetensors" ] || { echo "no checkpoint at $QWEN"; return 1; }
  python3 tests/gpu/hf_compare.py --model "$QWEN" --tiny "$MODELS/tiny" --build "$BUILD" --json "$LOGS/hf.json"
}
run hf-compare hf

bench() {
  "$BUILD/bin/ferry-gpu-bench" --model-dir "$QWEN" --context 512 --batch 1,64,256 --steps 20 \
    --offline 2048 --output 128 --json "$LOGS/bench.json"
}
run bench bench

# The whole stack, only where the full build's packages are (gRPC, oneDNN, ...).
e2e() {
  [ "${SKIP_E2E:-0}" = 1 ] && { echo "SKIP_E2E=1"; return 77; }
  cmake -S . -B build-full -G Ninja -DCMAKE_BUILD_TYPE=Release -DCMAKE_CUDA_ARCHITECTURES="$ARCH" >/dev/null 2>&1 ||
    { echo "full build's packages absent here: e2e skipped (the engine's offline figure stands in)"; return 77; }
  ninja -C build-full -j"$JOBS" ferry-launch ferry-worker ferry-scheduler ferry-gateway ferry-bench || return 1
  local run_dir=$LOGS/stack ready=$LOGS/stack/stack.json
  mkdir -p "$run_dir"
  build-full/bin/ferry-launch --model "$QWEN" --port 0 --run-dir "$run_dir" --ready-file "$ready" \
    --log-level warn --worker-arg=--device=cuda --worker-arg=--max-num-seqs=256 \
    --scheduler-arg=--max-num-seqs=256 --scheduler-arg=--max-num-batched-tokens=8192 &
  local launch=$!
  for _ in $(seq 600); do [ -f "$ready" ] && break; kill -0 $launch 2>/dev/null || return 1; sleep 0.2; done
  build-full/bin/ferry-bench run --stack-file "$ready" --num-requests 2048 --concurrency 2048 \
    --input-len 512 --output-len 128 --json "$LOGS/e2e.json"
  local rc=$?
  kill -TERM $launch; wait $launch
  return $rc
}
run e2e e2e

echo
echo "| check | result | time |"
echo "|---|---|---|"
printf '%s\n' "${ROWS[@]}"
echo
grep -h -A8 "^| batch" "$LOGS/bench.log" 2>/dev/null
grep -h "offline:\|prefill:" "$LOGS/bench.log" 2>/dev/null
grep -h "^hf " "$LOGS/hf-compare.log" 2>/dev/null
grep -h "^parity" "$LOGS/engine-parity.log" 2>/dev/null
python3 - "$LOGS" <<'PY' 2>/dev/null
import json, sys, pathlib
logs = pathlib.Path(sys.argv[1])
try:
    bench = json.loads((logs / "bench.json").read_text())
except Exception:
    sys.exit()
goals = []
for d in bench["decode"]:
    if d["batch"] == 1:
        goals.append(f"batch 1 step {d['wall_ms']:.3f} ms (goal < 1 ms)")
    if d["batch"] >= 64:
        goals.append(f"batch {d['batch']} step {d['wall_ms'] / d['floor_ms']:.2f}x the memory floor (goal <= 2x)")
ours = bench.get("offline_output_tokens_per_s", 0)
goals.append(f"engine offline {ours:.0f} output tok/s (goal >= 80000 end to end)")
try:
    hf = json.loads((logs / "hf.json").read_text())["hf_generate_tokens_per_s"]
    goals.append(f"{ours / hf:.1f}x HF generate's {hf:.0f} tok/s (goal >= 20x)")
except Exception:
    pass
print("goals: " + "; ".join(goals))
PY
echo "total $(($(date +%s) - T0)) s; logs in $LOGS"
# On the device tool's machine, everything comes back as one archive (it returns few files).
if [ -n "${OUT:-}" ] && [ -d "$OUT" ]; then tar czf "$OUT/gpu-logs.tgz" -C "$LOGS" --exclude=stack . 2>/dev/null; fi
exit $status
