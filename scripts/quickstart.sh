#!/usr/bin/env bash
# Installs, builds, and starts a Ferry stack on 127.0.0.1 serving the embedded
# default model: a random-weight checkpoint with the exact shape and layout of
# Qwen2.5-0.5B-Instruct, written by ferry-make-model (no download needed).
# Point FERRY_MODEL at a real Hugging Face checkpoint directory to serve it instead.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
MODEL=${FERRY_MODEL:-models/qwen2.5-0.5b-random}
if [ ! -f "$MODEL/config.json" ]; then
  echo "quickstart: writing the default random-weight model to $MODEL"
  build/bin/ferry-make-model --preset qwen2.5-0.5b --seed 0 --out "$MODEL"
fi
PORT=${FERRY_PORT:-50051}
HTTP_PORT=${FERRY_HTTP_PORT:-8000}
echo "quickstart: starting the stack: gRPC on 127.0.0.1:$PORT, OpenAI HTTP on 127.0.0.1:$HTTP_PORT (Ctrl-C stops it)"
echo "quickstart: call it with: build/bin/ferry-client --target 127.0.0.1:$PORT --stream \"Hello\""
echo "quickstart:           or: curl 127.0.0.1:$HTTP_PORT/v1/completions -H 'Content-Type: application/json' \\"
echo "quickstart:                 -d '{\"prompt\": \"Hello\", \"max_tokens\": 16}'"
# Any further arguments go to ferry-launch, e.g. --max-num-seqs 64 --max-model-len 4096, or for a
# model whose template is not in its directory, --chat-template FILE (and --tool-call-parser NAME).
exec build/bin/ferry-launch --model "$MODEL" --port "$PORT" --http-port "$HTTP_PORT" \
  --metrics-port "${FERRY_METRICS_PORT:-9400}" "$@"
