#!/usr/bin/env bash
# The soak test (#29): the real stack on loopback, open-loop load at 70% of its measured capacity
# on a random qwen2.5-0.5b-shape model for MINUTES (default 30), 20% of requests cancelled at
# random points and 5% with deadlines that expire; passes when no process's RSS grows by more than
# 50 MB after warm-up, the KV cache is back to idle, and nothing else failed. Options after MINUTES
# go to tools/soak/soak.py (--help). Needs the build (scripts/setup.sh).
set -euo pipefail
cd "$(dirname "$0")/.."
minutes=${1:-30}
shift || true
exec .venv/bin/python tools/soak/soak.py --minutes "$minutes" --json "${SOAK_JSON:-/tmp/ferry-soak.json}" "$@"
