#!/usr/bin/env bash
# Packs the whole stack, built HERE, for the GPU machine, which has CUDA but none of Ferry's Debian
# packages (gRPC, protobuf, oneDNN, ...), so that device_check.sh's end-to-end step runs the real
# gateway, scheduler and GPU worker without building them there.
#
#   bash tests/gpu/bundle_stack.sh BUILD_DIR OUT.tar.xz
#
# The archive holds bin/ (ferry-launch, -gateway, -scheduler, -worker, -bench and the engine plugin
# libferry-gpu.so, stripped) and lib/ (every shared library they need except the C runtime
# (glibc, libstdc++, libgcc_s, which the other machine has in a version at least as new) and
# CUDA's (cudart, cuBLAS, NCCL, the driver), which must match the device's driver and come from
# the device's own toolkit). device_check.sh unpacks it and points LD_LIBRARY_PATH at lib/ and at
# the device's CUDA and NCCL folders. Rebuilt only when a binary changed (a hash beside it).
set -euo pipefail
BUILD=${1:?usage: bundle_stack.sh BUILD_DIR OUT.tar.xz}
OUT=${2:?usage: bundle_stack.sh BUILD_DIR OUT.tar.xz}
BINS=(ferry-launch ferry-gateway ferry-scheduler ferry-worker ferry-bench libferry-gpu.so)

ninja -C "$BUILD" -j"${JOBS:-2}" "${BINS[@]/libferry-gpu.so/ferry_gpu_plugin}" >/dev/null
hash=$(cd "$BUILD/bin" && sha256sum "${BINS[@]}" | sha256sum | cut -c1-16)
if [ -f "$OUT" ] && [ "$(cat "$OUT.hash" 2>/dev/null)" = "$hash" ]; then
  echo "stack bundle up to date: $OUT ($(du -h "$OUT" | cut -f1))"
  exit 0
fi

stage=$(mktemp -d)
trap 'rm -rf "$stage"' EXIT
mkdir -p "$stage/bin" "$stage/lib"
for b in "${BINS[@]}"; do strip -o "$stage/bin/$b" "$BUILD/bin/$b"; done
# What the other machine provides: the C runtime and the loader, and CUDA's libraries.
system='^(linux-vdso|ld-linux|libc\.|libm\.|libdl\.|libpthread\.|librt\.|libstdc\+\+|libgcc_s|libcuda\.|libcudart|libcublas|libnccl|libnvidia)'
(cd "$BUILD/bin" && ldd "${BINS[@]}") | awk '/=>/ && $3 ~ /^\// {print $1, $3}' | sort -u |
  while read -r name path; do
    [[ $name =~ $system ]] || cp -L "$path" "$stage/lib/$name"
  done
# A library that cannot be found here would be missing there too.
if (cd "$BUILD/bin" && ldd "${BINS[@]}") | grep -q "not found"; then
  echo "bundle_stack.sh: a library of the stack is not found here:" >&2
  (cd "$BUILD/bin" && ldd "${BINS[@]}") | grep "not found" >&2
  exit 1
fi
tar -C "$stage" -cf - bin lib | xz -T2 -6 >"$OUT.tmp"
mv "$OUT.tmp" "$OUT"
echo "$hash" >"$OUT.hash"
echo "stack bundle: $OUT ($(du -h "$OUT" | cut -f1); $(ls "$stage/lib" | wc -l) libraries)"
