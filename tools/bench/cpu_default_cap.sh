#!/usr/bin/env bash
# Issue #52's acceptance through the real stack on the CPU engine: the quickstart's 0.5B stack
# (--max-num-seqs 16, every other flag at its default) under closed loops of 1, 4, 16 and 64 clients
# and an open loop at twice static 16's capacity, each load run at static caps (held with
# SetMaxNumSeqs, as ferry-bench sweep does) and then with the default controller (the hold released).
# 128-token prompts, 64-token replies (ignore_eos), greedy, gRPC streaming, batch lane as the issue.
#   bash tools/bench/cpu_default_cap.sh OUT_DIR [EXTRA ferry-launch ARGS...]
# Prints one table row per load and writes each run's JSON under OUT_DIR.
set -euo pipefail
cd "$(dirname "$0")/../.."
out=${1:?usage: $0 OUT_DIR [ferry-launch args]}
shift
mkdir -p "$out"
model=models/qwen2.5-0.5b-random
[ -f "$model/config.json" ] || build/bin/ferry-make-model --preset qwen2.5-0.5b --seed 0 --out "$model"
launch=0
trap '[ "$launch" != 0 ] && kill $launch 2>/dev/null; wait 2>/dev/null' EXIT
start_stack() {  # name, ferry-launch args...: sets ready and launch
  local name=$1
  shift
  ready="$out/$name-stack.json"
  rm -f "$ready"
  build/bin/ferry-launch --model "$model" --port 0 --http-port 0 --max-num-seqs 16 --ready-file "$ready" "$@" \
    > "$out/$name-launch.log" 2>&1 &
  launch=$!
  for _ in $(seq 300); do [ -s "$ready" ] && break; sleep 1; done
  [ -s "$ready" ] || { echo "stack did not start"; tail -20 "$out/$name-launch.log"; exit 1; }
}
stop_stack() { kill "$launch"; wait "$launch" || true; launch=0; }
# Goodput at targets this machine can meet (a step of 16 sequences takes ~75 ms here) unless GOODPUT is
# set; the defaults the issue names (1 s, 50 ms) are met by no cap above 1 under load.
read -r -a goodput <<< "${GOODPUT:-ttft:10000 tpot:150}"
bench_args() {
  echo --stack-file "$ready" --input-len 128 --output-len 64 --lane batch=1 --seed 7 --no-progress \
    --num-warmup 2 --goodput "${goodput[@]}" --request-timeout-s 600
}
run_load() {  # name, caps (empty: the default controller only), load args...
  local name=$1 caps=$2
  shift 2
  if [ -n "$caps" ]; then
    build/bin/ferry-bench sweep $(bench_args) "$@" --max-num-seqs "$caps" --out-dir "$out/$name-static" \
      > "$out/$name-static.log" 2>&1
  fi
  build/bin/ferry-bench run $(bench_args) "$@" --json "$out/$name-default.json" --label "$name default" \
    > "$out/$name-default.log" 2>&1
}
start_stack quickstart "$@"
# One client: no cap binds (one request at a time), so caps 1, 4 and 16 and the default run the same and
# differ only by this VM's run-to-run spread (7-12% between two runs of 12-48 requests). Three rounds of
# every cap and the default, interleaved so that a slow minute falls on all of them; the report averages.
for round in 1 2 3; do
  run_load "c1-r$round" 1,4,16 --concurrency 1 --num-requests 24
done
run_load c4 4,8,16 --concurrency 4 --num-requests 32
run_load c16 4,8,16 --concurrency 16 --num-requests 64
run_load c64 8,16 --concurrency 64 --num-requests 128
# Twice what static 16 completed per second at 64 clients.
rate=$(.venv/bin/python - "$out/c64-static/sweep.json" <<'PY'
import json, sys
points = json.load(open(sys.argv[1]))["points"]
print(f'{2 * max(p["request_throughput"] for p in points):.2f}')
PY
)
run_load open2x 8,16 --request-rate "$rate" --num-requests 96 --max-concurrency 1000
stop_stack
# The issue's own case: the same stack with the targets stated (1 s, 50 ms), out of reach here. Its
# default runs compare with the static caps above (the same engine and flags; static ignores targets).
start_stack stated "$@" --scheduler-arg=--slo-ttft-ms=1000 --scheduler-arg=--slo-tpot-ms=50
run_load stated-c16 "" --concurrency 16 --num-requests 64
run_load stated-c64 "" --concurrency 64 --num-requests 128
run_load stated-open2x "" --request-rate "$rate" --num-requests 96 --max-concurrency 1000
stop_stack
.venv/bin/python tools/bench/cpu_default_cap_report.py "$out"
