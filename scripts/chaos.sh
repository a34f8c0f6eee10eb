#!/usr/bin/env bash
# Faults, by hand, against a Ferry stack running on this machine under ferry-launch: kills and
# stops its processes to watch the stack recover (issue #27). It reads the pids from the
# launcher's --ready-file (rewritten by the launcher after every restart), signals only those,
# and only after checking that /proc/PID/cmdline names the expected ferry binary. It sends
# signals and nothing else: no network, nothing outside this machine. Every action is bounded in
# count and time. The end-to-end tests (tests/python/test_launch_supervision.py) use it too.
set -euo pipefail

readonly MAX_STOP_S=600
readonly MAX_RANDOM_N=20
readonly MAX_INTERVAL_S=600

usage() {
  cat >&2 <<'EOF'
usage: scripts/chaos.sh READY_FILE ACTION [ARGS]

READY_FILE is ferry-launch's --ready-file. ACTION is one of:
  kill-worker [RANK]        SIGKILL worker rank RANK (default 0)
  stop-worker RANK SECONDS  SIGSTOP worker rank RANK, then SIGCONT it after SECONDS (1..600) if the
                            same process still exists (ferry-launch kills a worker silent for longer
                            than --step-timeout-s and starts a new one)
  kill-scheduler            SIGKILL the scheduler
  kill-gateway              SIGKILL the gateway
  random N INTERVAL_S       N (1..20) SIGKILLs, each of a random worker rank or the scheduler at a
                            random point of its own INTERVAL_S (1..600) seconds; takes at most
                            N * INTERVAL_S seconds

Each action prints what it did, one line per signal, e.g. "kill-worker: SIGKILL worker-0 (pid 123)".
EOF
  exit 2
}

die() {
  echo "chaos.sh: $*" >&2
  exit 1
}

# An integer argument within [lo, hi], or a clear error naming it.
int_arg() {
  local name=$1 value=$2 lo=$3 hi=$4
  [[ $value =~ ^[0-9]{1,9}$ ]] || die "$name must be a whole number in [$lo, $hi], got '$value'"
  value=$((10#$value))
  ((value >= lo && value <= hi)) || die "$name must be in [$lo, $hi], got $value"
  echo "$value"
}

num_workers() { python3 -c 'import json, sys; print(len(json.load(open(sys.argv[1])).get("workers", [])))' "$READY_FILE"; }

# The pid of a service (worker-RANK, scheduler or gateway) as the ready file has it now.
service_pid() {
  local pid
  pid=$(python3 - "$READY_FILE" "$1" <<'EOF'
import json, sys
state, service = json.load(open(sys.argv[1])), sys.argv[2]
try:
    print((state["workers"][int(service[7:])] if service.startswith("worker-") else state[service])["pid"])
except (LookupError, ValueError, TypeError):
    pass
EOF
  )
  [[ $pid =~ ^[0-9]+$ ]] || die "$READY_FILE has no pid for $1"
  echo "$pid"
}

# Whether pid runs the ferry binary expected for service (ferry-worker for worker-N).
is_ferry() {
  local pid=$1 service=$2 exe
  [[ -r /proc/$pid/cmdline ]] || return 1
  exe=$(tr '\0' '\n' <"/proc/$pid/cmdline" | head -n 1)
  [[ $(basename -- "$exe") == "ferry-${service%%-[0-9]*}" ]]
}

# Sends signal to service's current pid after checking it; the action's name first in the log line.
signal_service() {
  local action=$1 signal=$2 service=$3 pid
  pid=$(service_pid "$service")
  is_ferry "$pid" "$service" || die "refusing to signal pid $pid ($service in $READY_FILE): it is not a running ferry-${service%%-[0-9]*} (restarting, or the ready file is stale)"
  kill "-$signal" "$pid"
  echo "$action: SIG$signal $service (pid $pid)"
}

worker_rank() {
  local n
  n=$(num_workers)
  ((n > 0)) || die "$READY_FILE lists no workers"
  int_arg RANK "$1" 0 $((n - 1))
}

stop_worker() {
  local rank seconds pid
  rank=$(worker_rank "$1")
  seconds=$(int_arg SECONDS "$2" 1 "$MAX_STOP_S")
  pid=$(service_pid "worker-$rank")
  signal_service stop-worker STOP "worker-$rank"
  sleep "$seconds"
  # The launcher may have killed it (hung past --step-timeout-s) and a new process may have its
  # pid by now: continue only the same ferry-worker.
  if is_ferry "$pid" "worker-$rank"; then
    kill -CONT "$pid"
    echo "stop-worker: SIGCONT worker-$rank (pid $pid) after $seconds s"
  else
    echo "stop-worker: worker-$rank (pid $pid) is gone after $seconds s (killed by the supervisor?)"
  fi
}

random_kills() {
  local n interval i at target workers pid
  n=$(int_arg N "$1" 1 "$MAX_RANDOM_N")
  interval=$(int_arg INTERVAL_S "$2" 1 "$MAX_INTERVAL_S")
  for ((i = 1; i <= n; i++)); do
    at=$(((RANDOM * 32768 + RANDOM) % (interval * 1000)))  # ms into this kill's interval
    sleep "$((at / 1000)).$(printf '%03d' $((at % 1000)))"
    workers=$(num_workers)
    if ((RANDOM % (workers + 1) == workers)); then target=scheduler; else target=worker-$((RANDOM % workers)); fi
    # A target still restarting from an earlier kill is skipped, not waited for: the run stays bounded.
    pid=$(service_pid "$target")
    if is_ferry "$pid" "$target"; then
      signal_service "random $i/$n" KILL "$target"
    else
      echo "random $i/$n: $target is not running (restarting?); skipped"
    fi
    sleep "$(((interval * 1000 - at) / 1000)).$(printf '%03d' $(((interval * 1000 - at) % 1000)))"
  done
}

(($# >= 2)) || usage
READY_FILE=$1
ACTION=$2
shift 2
[[ -r $READY_FILE ]] || die "cannot read the ready file '$READY_FILE' (ferry-launch --ready-file)"
case $ACTION in
  kill-worker)
    (($# <= 1)) || usage
    rank=$(worker_rank "${1:-0}")
    signal_service kill-worker KILL "worker-$rank"
    ;;
  stop-worker)
    (($# == 2)) || usage
    stop_worker "$1" "$2"
    ;;
  kill-scheduler | kill-gateway)
    (($# == 0)) || usage
    signal_service "$ACTION" KILL "${ACTION#kill-}"
    ;;
  random)
    (($# == 2)) || usage
    random_kills "$1" "$2"
    ;;
  *)
    echo "chaos.sh: unknown action '$ACTION'" >&2
    usage
    ;;
esac
