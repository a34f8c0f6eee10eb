#include "kernels/cuda/rmsnorm.h"

#include <cuda_runtime.h>

namespace ferry::kernels::cuda {
namespace {

// Sum over a warp with shuffles; every lane gets the total.
__device__ __forceinline__ float WarpSum(float v) {
  for (int offset = 16; offset > 0; offset >>= 1) v += __shfl_xor_sync(0xffffffffu, v, offset);
  return v;
}

// Sum over the block: warp sums into shared memory, then one warp reduces them.
template <int kThreads>
__device__ float BlockSum(float v) {
  __shared__ float partial[kThreads / 32];
  __shared__ float total;
  v = WarpSum(v);
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
  if (lane == 0) partial[warp] = v;
  __syncthreads();
  if (warp == 0) {
    float s = lane < kThreads / 32 ? partial[lane] : 0.f;
    s = WarpSum(s);
    if (lane == 0) total = s;
  }
  __syncthreads();
  return total;
}

struct RmsNormParams {
  const float* __restrict__ input;   // [num_tokens, hidden_size]
  const float* __restrict__ weight;  // [hidden_size]
  float* output;                     // [num_tokens, hidden_size]
  int hidden_size;
  float eps;
};

// One block per token row.
template <int kThreads>
__global__ void RmsNormKernel(RmsNormParams p) {
  const float* x = p.input + static_cast<size_t>(blockIdx.x) * p.hidden_size;
  float* y = p.output + static_cast<size_t>(blockIdx.x) * p.hidden_size;
  float sum_sq = 0.f;
  for (int i = threadIdx.x; i < p.hidden_size; i += kThreads) sum_sq += x[i] * x[i];
  const float inv_rms = rsqrtf(BlockSum<kThreads>(sum_sq) / p.hidden_size + p.eps);
  for (int i = threadIdx.x; i < p.hidden_size; i += kThreads) y[i] = x[i] * inv_rms * p.weight[i];
}

}  // namespace

int RmsNorm(const RmsNormArgs& args) {
  if (args.num_tokens <= 0) return 0;
  RmsNormParams p{args.input, args.weight, args.output, args.hidden_size, args.eps};
  auto stream = static_cast<cudaStream_t>(args.stream);
  // Small rows waste threads on a large block; dispatch the block size at run time.
  if (args.hidden_size <= 256) {
    RmsNormKernel<128><<<args.num_tokens, 128, 0, stream>>>(p);
  } else {
    RmsNormKernel<256><<<args.num_tokens, 256, 0, stream>>>(p);
  }
  return static_cast<int>(cudaGetLastError());
}

}  // namespace ferry::kernels::cuda
