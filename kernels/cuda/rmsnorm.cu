#include "kernels/cuda/rmsnorm.h"

#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include "kernels/cuda/device_common.cuh"

namespace ferry::kernels::cuda {
namespace {

struct RmsNormParams {
  const float* input;   // [num_tokens, hidden_size]
  const float* weight;  // [hidden_size]
  float* output;        // [num_tokens, hidden_size] (may alias input: no __restrict__)
  int hidden_size;
  float eps;
};

// One block per token row.
template <int kThreads>
__global__ void __launch_bounds__(kThreads) RmsNormKernel(RmsNormParams p) {
  const float* x = p.input + static_cast<size_t>(blockIdx.x) * p.hidden_size;
  float* y = p.output + static_cast<size_t>(blockIdx.x) * p.hidden_size;
  float sum_sq = 0.f;
  for (int i = threadIdx.x; i < p.hidden_size; i += kThreads) sum_sq += x[i] * x[i];
  const float inv_rms = 1.f / sqrtf(BlockSum<kThreads>(sum_sq) / p.hidden_size + p.eps);
  for (int i = threadIdx.x; i < p.hidden_size; i += kThreads) y[i] = p.weight[i] * (x[i] * inv_rms);
}

struct AddRmsNormParams {
  float* residual;                      // [rows, hidden]
  const float* delta;                   // [rows, hidden] or nullptr
  const float* __restrict__ weight;     // [hidden]
  __nv_bfloat16* __restrict__ output;   // [num_rows, hidden]
  const int32_t* __restrict__ rows;     // [num_rows] or nullptr
  int hidden_size;
  float eps;
};

// One block per output row. Each thread keeps its (at most kPerThread) summed values in
// registers between the reduction and the scaling, so the residual is read once.
template <int kThreads, int kPerThread>
__global__ void __launch_bounds__(kThreads) AddRmsNormKernel(AddRmsNormParams p) {
  const int64_t row = p.rows != nullptr ? p.rows[blockIdx.x] : blockIdx.x;
  float* x = p.residual + row * p.hidden_size;
  const float* d = p.delta != nullptr ? p.delta + row * p.hidden_size : nullptr;
  float values[kPerThread];
  float sum_sq = 0.f;
#pragma unroll
  for (int j = 0; j < kPerThread; ++j) {
    const int i = threadIdx.x + j * kThreads;
    values[j] = 0.f;
    if (i < p.hidden_size) {
      float v = x[i];
      if (d != nullptr) {
        v += d[i];
        x[i] = v;
      }
      values[j] = v;
      sum_sq += v * v;
    }
  }
  const float inv_rms = 1.f / sqrtf(BlockSum<kThreads>(sum_sq) / p.hidden_size + p.eps);
  __nv_bfloat16* y = p.output + static_cast<int64_t>(blockIdx.x) * p.hidden_size;
#pragma unroll
  for (int j = 0; j < kPerThread; ++j) {
    const int i = threadIdx.x + j * kThreads;
    if (i < p.hidden_size) y[i] = __float2bfloat16_rn(p.weight[i] * (values[j] * inv_rms));
  }
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

int AddRmsNorm(const AddRmsNormArgs& args) {
  if (args.num_rows <= 0) return 0;
  if (args.hidden_size <= 0) return static_cast<int>(cudaErrorInvalidValue);
  AddRmsNormParams p{args.residual, args.delta, args.weight,
                     reinterpret_cast<__nv_bfloat16*>(args.output), args.rows, args.hidden_size,
                     args.eps};
  auto stream = static_cast<cudaStream_t>(args.stream);
  // Rows up to 8192 (Qwen2 hidden sizes are 896..8192) stay in registers.
  if (args.hidden_size <= 256) {
    AddRmsNormKernel<128, 2><<<args.num_rows, 128, 0, stream>>>(p);
  } else if (args.hidden_size <= 1024) {
    AddRmsNormKernel<256, 4><<<args.num_rows, 256, 0, stream>>>(p);
  } else if (args.hidden_size <= 8192) {
    AddRmsNormKernel<1024, 8><<<args.num_rows, 1024, 0, stream>>>(p);
  } else {
    return static_cast<int>(cudaErrorInvalidValue);
  }
  return static_cast<int>(cudaGetLastError());
}

}  // namespace ferry::kernels::cuda
