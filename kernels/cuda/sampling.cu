#include "kernels/cuda/sampling.h"

#include <cuda_runtime.h>

#include "kernels/cuda/device_common.cuh"

namespace ferry::kernels::cuda {
namespace {

constexpr int kArgmaxThreads = 1024;

struct Best {
  float value;
  int32_t id;
};

// Larger value wins; the lower id among equal values (the CPU sampler's first maximum).
__device__ __forceinline__ Best Better(Best a, Best b) {
  return (b.value > a.value || (b.value == a.value && b.id < a.id)) ? b : a;
}

__device__ __forceinline__ Best WarpBest(Best b) {
#pragma unroll
  for (int offset = 16; offset > 0; offset >>= 1) {
    const Best other{__shfl_xor_sync(0xffffffffu, b.value, offset), __shfl_xor_sync(0xffffffffu, b.id, offset)};
    b = Better(b, other);
  }
  return b;
}

struct ArgmaxParams {
  const float* __restrict__ logits;  // [num_rows, vocab]
  int32_t* __restrict__ out;         // [num_rows]
  int vocab;
};

// One block per row.
__global__ void __launch_bounds__(kArgmaxThreads) ArgmaxKernel(ArgmaxParams p) {
  __shared__ Best partial[kArgmaxThreads / kWarpSize];
  const float* row = p.logits + static_cast<int64_t>(blockIdx.x) * p.vocab;
  Best best{-INFINITY, p.vocab};  // loses to any real logit (and, by id, to -inf logits)
  for (int i = threadIdx.x; i < p.vocab; i += kArgmaxThreads) best = Better(best, Best{row[i], i});
  best = WarpBest(best);
  const int lane = threadIdx.x % kWarpSize, warp = threadIdx.x / kWarpSize;
  if (lane == 0) partial[warp] = best;
  __syncthreads();
  if (warp == 0) {
    best = WarpBest(partial[lane]);
    if (lane == 0) p.out[blockIdx.x] = best.id < p.vocab ? best.id : 0;  // an all-NaN row: 0
  }
}

}  // namespace

int Argmax(const ArgmaxArgs& args) {
  if (args.num_rows <= 0) return 0;
  if (args.vocab <= 0) return static_cast<int>(cudaErrorInvalidValue);
  ArgmaxKernel<<<args.num_rows, kArgmaxThreads, 0, static_cast<cudaStream_t>(args.stream)>>>(
      ArgmaxParams{args.logits, args.out, args.vocab});
  return static_cast<int>(cudaGetLastError());
}

}  // namespace ferry::kernels::cuda
