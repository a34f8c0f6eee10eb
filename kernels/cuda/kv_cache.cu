#include "kernels/cuda/kv_cache.h"

#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include "kernels/cuda/device_common.cuh"

namespace ferry::kernels::cuda {
namespace {

struct WriteKvCacheParams {
  const float* __restrict__ k;               // [num_tokens, src_stride]
  const float* __restrict__ v;               // [num_tokens, src_stride]
  const int32_t* __restrict__ slot_mapping;  // [num_tokens]
  __nv_bfloat16* __restrict__ k_cache;       // [num_slots, row]
  __nv_bfloat16* __restrict__ v_cache;       // [num_slots, row]
  int row;                                   // num_kv_heads * head_dim
  int64_t src_stride;
};

__device__ __forceinline__ Bf16x8 Load8(const float* src) {  // src 16-byte aligned
  const float4 a = reinterpret_cast<const float4*>(src)[0];
  const float4 b = reinterpret_cast<const float4*>(src)[1];
  const float f[8] = {a.x, a.y, a.z, a.w, b.x, b.y, b.z, b.w};
  return FloatToBf16x8(f);
}

// One block per token; each thread moves 8 elements of K and of V (16-byte stores).
template <int kThreads>
__global__ void __launch_bounds__(kThreads) WriteKvCacheKernel(WriteKvCacheParams p) {
  const int64_t slot = p.slot_mapping[blockIdx.x];
  if (slot < 0) return;
  const float* k = p.k + static_cast<int64_t>(blockIdx.x) * p.src_stride;
  const float* v = p.v + static_cast<int64_t>(blockIdx.x) * p.src_stride;
  for (int i = threadIdx.x * 8; i < p.row; i += kThreads * 8) {
    StoreBf16x8(p.k_cache + slot * p.row + i, Load8(k + i));
    StoreBf16x8(p.v_cache + slot * p.row + i, Load8(v + i));
  }
}

bool Aligned16(const void* ptr) { return reinterpret_cast<uintptr_t>(ptr) % 16 == 0; }

}  // namespace

int WriteKvCache(const WriteKvCacheArgs& args) {
  if (args.num_tokens <= 0) return 0;
  if (args.head_dim % 8 != 0 || args.src_stride % 4 != 0 || !Aligned16(args.k) || !Aligned16(args.v) ||
      !Aligned16(args.k_cache) || !Aligned16(args.v_cache)) {
    return static_cast<int>(cudaErrorInvalidValue);
  }
  WriteKvCacheParams p{args.k, args.v, args.slot_mapping,
                       reinterpret_cast<__nv_bfloat16*>(args.k_cache),
                       reinterpret_cast<__nv_bfloat16*>(args.v_cache), args.num_kv_heads * args.head_dim,
                       args.src_stride};
  WriteKvCacheKernel<64><<<args.num_tokens, 64, 0, static_cast<cudaStream_t>(args.stream)>>>(p);
  return static_cast<int>(cudaGetLastError());
}

}  // namespace ferry::kernels::cuda
