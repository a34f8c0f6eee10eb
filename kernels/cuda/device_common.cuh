// Device helpers shared by the kernels of this folder: warp/block reductions and 16-byte
// bf16 vectors. Only for .cu files.
#pragma once

#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <cstdint>

namespace ferry::kernels::cuda {

constexpr int kWarpSize = 32;

__device__ __forceinline__ float WarpSum(float v) {
#pragma unroll
  for (int offset = 16; offset > 0; offset >>= 1) v += __shfl_xor_sync(0xffffffffu, v, offset);
  return v;
}

__device__ __forceinline__ float WarpMax(float v) {
#pragma unroll
  for (int offset = 16; offset > 0; offset >>= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, offset));
  return v;
}

// Sum over the whole block (blockDim.x == kThreads, a multiple of 32); every thread gets it.
// Safe to call repeatedly: the trailing barrier protects the shared slots.
template <int kThreads>
__device__ __forceinline__ float BlockSum(float v) {
  static_assert(kThreads % kWarpSize == 0 && kThreads <= 1024, "block size");
  __shared__ float partial[kThreads / kWarpSize];
  v = WarpSum(v);
  const int lane = threadIdx.x % kWarpSize, warp = threadIdx.x / kWarpSize;
  if (lane == 0) partial[warp] = v;
  __syncthreads();
  float total = 0.f;
#pragma unroll
  for (int w = 0; w < kThreads / kWarpSize; ++w) total += partial[w];
  __syncthreads();
  return total;
}

// Eight bf16 values: one 16-byte load or store.
struct alignas(16) Bf16x8 {
  __nv_bfloat162 h[4];
};

__device__ __forceinline__ void Bf16x8ToFloat(const Bf16x8& v, float* out) {  // out [8]
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    const float2 f = __bfloat1622float2(v.h[i]);
    out[2 * i] = f.x;
    out[2 * i + 1] = f.y;
  }
}

__device__ __forceinline__ Bf16x8 FloatToBf16x8(const float* in) {  // in [8], round to nearest even
  Bf16x8 v;
#pragma unroll
  for (int i = 0; i < 4; ++i) v.h[i] = __floats2bfloat162_rn(in[2 * i], in[2 * i + 1]);
  return v;
}

// 16-byte load of 8 bf16 (ptr 16-byte aligned) through the read-only path.
__device__ __forceinline__ Bf16x8 LoadBf16x8(const __nv_bfloat16* ptr) {
  const uint4 raw = __ldg(reinterpret_cast<const uint4*>(ptr));
  Bf16x8 v;
  static_assert(sizeof(v) == sizeof(raw));
  memcpy(&v, &raw, sizeof(raw));
  return v;
}

__device__ __forceinline__ void StoreBf16x8(__nv_bfloat16* ptr, const Bf16x8& v) {
  *reinterpret_cast<Bf16x8*>(ptr) = v;
}

}  // namespace ferry::kernels::cuda
