#include "kernels/cuda/lora.h"

#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <algorithm>

#include "kernels/cuda/device_common.cuh"

namespace ferry::kernels::cuda {
namespace {

constexpr int kThreads = 256;
constexpr int kWarps = kThreads / 32;
constexpr int kMaxGridY = 65535;

struct LoraParams {
  const __nv_bfloat16* __restrict__ x;
  int64_t x_stride;
  float* __restrict__ out;
  int64_t out_stride;
  int64_t out_offset;
  const int32_t* __restrict__ token_slot;
  const LoraSlotWeights* __restrict__ slots;
  int32_t num_slots;
  int64_t k;
  int64_t n;
  int32_t max_rank;
  float* __restrict__ scratch;
};

// The slot of row t whose adapter targets this projection, else null.
__device__ const LoraSlotWeights* SlotOf(const LoraParams& p, int64_t t) {
  const int32_t s = p.token_slot[t];
  if (s < 0 || s >= p.num_slots) return nullptr;
  const LoraSlotWeights* w = p.slots + s;
  return w->a == nullptr ? nullptr : w;
}

// Shrink: grid (num_tokens); each warp takes ranks warp, warp + kWarps, ...; lanes stride k.
__global__ void __launch_bounds__(kThreads) LoraShrinkKernel(LoraParams p) {
  const int64_t t = blockIdx.x;
  const LoraSlotWeights* w = SlotOf(p, t);
  if (w == nullptr) return;
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const __nv_bfloat16* x = p.x + t * p.x_stride;
  const __nv_bfloat16* a = reinterpret_cast<const __nv_bfloat16*>(w->a);
  for (int r = warp; r < w->rank; r += kWarps) {
    const __nv_bfloat16* row = a + static_cast<int64_t>(r) * p.k;
    float acc = 0.f;
    for (int64_t i = lane; i < p.k; i += 32) acc += __bfloat162float(row[i]) * __bfloat162float(x[i]);
    acc = WarpSum(acc);
    if (lane == 0) p.scratch[t * p.max_rank + r] = acc;
  }
}

// Expand: grid (column blocks, rows); a block strides over the rows (grid.y stops at 65,535), each
// thread one column, v in shared memory.
__global__ void __launch_bounds__(kThreads) LoraExpandKernel(LoraParams p, int32_t num_tokens) {
  extern __shared__ float v[];  // [max_rank]
  const int64_t j = static_cast<int64_t>(blockIdx.x) * kThreads + threadIdx.x;
  for (int64_t t = blockIdx.y; t < num_tokens; t += gridDim.y) {
    const LoraSlotWeights* w = SlotOf(p, t);  // the same for the whole block: no divergence
    if (w == nullptr) continue;
    __syncthreads();  // the previous row's v is read by every thread before it is replaced
    for (int r = threadIdx.x; r < w->rank; r += kThreads) v[r] = p.scratch[t * p.max_rank + r];
    __syncthreads();
    if (j >= p.n) continue;
    const __nv_bfloat16* b = reinterpret_cast<const __nv_bfloat16*>(w->b_t) + j;
    float acc = 0.f;
    for (int r = 0; r < w->rank; ++r) acc += __bfloat162float(b[static_cast<int64_t>(r) * p.n]) * v[r];
    p.out[t * p.out_stride + p.out_offset + j] += w->scale * acc;
  }
}

}  // namespace

const char* LoraArgsError(const LoraArgs& a) {
  if (a.num_tokens < 0) return "num_tokens < 0";
  if (a.num_tokens == 0) return "";
  if (a.x == nullptr || a.out == nullptr || a.token_slot == nullptr || a.slots == nullptr || a.scratch == nullptr) {
    return "a null pointer";
  }
  if (a.k <= 0 || a.n <= 0 || a.num_slots <= 0) return "k, n and num_slots must be > 0";
  if (a.x_stride < a.k) return "x_stride < k";
  if (a.max_rank < 1 || a.max_rank > kMaxLoraRank) return "max_rank outside 1..kMaxLoraRank";
  if (a.out_offset < 0 || a.out_offset + a.n > a.out_stride) return "columns out_offset .. out_offset + n outside out_stride";
  return "";
}

int LoraShrinkExpand(const LoraArgs& a) {
  if (*LoraArgsError(a) != '\0') return static_cast<int>(cudaErrorInvalidValue);
  if (a.num_tokens == 0) return 0;
  const LoraParams p{reinterpret_cast<const __nv_bfloat16*>(a.x), a.x_stride, a.out, a.out_stride, a.out_offset,
                     a.token_slot, a.slots, a.num_slots, a.k, a.n, a.max_rank, a.scratch};
  const auto stream = static_cast<cudaStream_t>(a.stream);
  LoraShrinkKernel<<<a.num_tokens, kThreads, 0, stream>>>(p);
  if (const cudaError_t e = cudaGetLastError(); e != cudaSuccess) return static_cast<int>(e);
  const dim3 grid(static_cast<unsigned>((a.n + kThreads - 1) / kThreads), std::min(a.num_tokens, kMaxGridY));
  LoraExpandKernel<<<grid, kThreads, a.max_rank * sizeof(float), stream>>>(p, a.num_tokens);
  return static_cast<int>(cudaGetLastError());
}

}  // namespace ferry::kernels::cuda
