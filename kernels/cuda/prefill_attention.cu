// PrefillAttention (paged_attention.h) with PrefillImpl::kSimt, and the launcher that checks the
// arguments for both kernels (kTensorCore: prefill_attention_tc.cu). Causal attention for ragged query runs, every
// sequence's earlier context read from the paged cache (chunked prefill and prefix caching).
//
// Block (tile, KV head) handles kPrefillQueryTile queries of one sequence for every query
// head of the group: thread r owns row (query r / group, head r % group), keeping its query
// and output accumulator in registers. Keys and values stream through shared memory in chunks
// of kKeyChunk (16-byte bf16 loads, converted to fp32 once), read by every row (broadcast);
// each row runs an online softmax over the keys it may see.
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include "kernels/cuda/attention_internal.h"
#include "kernels/cuda/device_common.cuh"
#include "kernels/cuda/paged_attention.h"

namespace ferry::kernels::cuda {
namespace {

constexpr int kPrefillThreads = 128;
constexpr int kKeyChunk = 32;
static_assert(kPrefillQueryTile * kMaxAttentionGroup <= kPrefillThreads, "one thread per row");

struct PrefillParams {
  const float* __restrict__ q;                // [num_tokens, q_stride]
  const __nv_bfloat16* __restrict__ k_cache;  // [num_blocks, block_size, num_kv_heads, head_dim]
  const __nv_bfloat16* __restrict__ v_cache;  // [num_blocks, block_size, num_kv_heads, head_dim]
  const int32_t* __restrict__ block_tables;   // [num_seqs, max_blocks_per_seq]
  const int32_t* __restrict__ query_start;    // [num_seqs + 1]
  const int32_t* __restrict__ context_lens;   // [num_seqs]
  const int32_t* __restrict__ tile_seq;       // [num_tiles]
  const int32_t* __restrict__ tile_query;     // [num_tiles]
  __nv_bfloat16* __restrict__ out;            // [num_tokens, out_stride]
  int num_kv_heads;
  int group;
  int block_size;
  int max_blocks_per_seq;
  int64_t q_stride;
  int64_t out_stride;
  float scale;
};

// Loads keys [chunk, chunk + kKeyChunk) of one KV head into shared memory as fp32 (zeros past
// num_keys).
template <int kHeadDim>
__device__ void LoadChunk(const PrefillParams& p, const int32_t* table, int kv_head, int chunk, int num_keys,
                          float4 (*k_s)[kHeadDim / 4], float4 (*v_s)[kHeadDim / 4]) {
  constexpr int kVecs = kHeadDim / 8;  // 16-byte bf16 vectors per key row
  for (int idx = threadIdx.x; idx < kKeyChunk * kVecs; idx += kPrefillThreads) {
    const int j = idx / kVecs, part = idx % kVecs, pos = chunk + j;
    float k[8] = {}, v[8] = {};
    if (pos < num_keys) {
      const int64_t slot = static_cast<int64_t>(table[pos / p.block_size]) * p.block_size + pos % p.block_size;
      const int64_t off = (slot * p.num_kv_heads + kv_head) * kHeadDim + part * 8;
      Bf16x8ToFloat(LoadBf16x8(p.k_cache + off), k);
      Bf16x8ToFloat(LoadBf16x8(p.v_cache + off), v);
    }
    k_s[j][2 * part] = make_float4(k[0], k[1], k[2], k[3]);
    k_s[j][2 * part + 1] = make_float4(k[4], k[5], k[6], k[7]);
    v_s[j][2 * part] = make_float4(v[0], v[1], v[2], v[3]);
    v_s[j][2 * part + 1] = make_float4(v[4], v[5], v[6], v[7]);
  }
}

// One row's online-softmax update over a chunk whose first key it can see.
template <int kHeadDim>
__device__ __forceinline__ void AttendChunk(const float (&q)[kHeadDim], float (&acc)[kHeadDim], float& m, float& l,
                                            int chunk, int my_pos, float scale,
                                            const float4 (*k_s)[kHeadDim / 4], const float4 (*v_s)[kHeadDim / 4]) {
  float s[kKeyChunk];
  float chunk_max = -INFINITY;
#pragma unroll
  for (int j = 0; j < kKeyChunk; ++j) {
    float dot = 0.f;
#pragma unroll
    for (int i = 0; i < kHeadDim / 4; ++i) {
      const float4 k = k_s[j][i];
      dot += q[4 * i] * k.x + q[4 * i + 1] * k.y + q[4 * i + 2] * k.z + q[4 * i + 3] * k.w;
    }
    s[j] = chunk + j <= my_pos ? dot * scale : -INFINITY;
    chunk_max = fmaxf(chunk_max, s[j]);
  }
  const float new_max = fmaxf(m, chunk_max);  // finite: key `chunk` is visible
  const float alpha = expf(m - new_max);
  l *= alpha;
#pragma unroll
  for (int d = 0; d < kHeadDim; ++d) acc[d] *= alpha;
#pragma unroll
  for (int j = 0; j < kKeyChunk; ++j) {
    const float prob = expf(s[j] - new_max);
    l += prob;
#pragma unroll
    for (int i = 0; i < kHeadDim / 4; ++i) {
      const float4 v = v_s[j][i];
      acc[4 * i] += prob * v.x;
      acc[4 * i + 1] += prob * v.y;
      acc[4 * i + 2] += prob * v.z;
      acc[4 * i + 3] += prob * v.w;
    }
  }
  m = new_max;
}

template <int kHeadDim>
__global__ void __launch_bounds__(kPrefillThreads) PrefillKernel(PrefillParams p) {
  __shared__ float4 k_s[kKeyChunk][kHeadDim / 4];
  __shared__ float4 v_s[kKeyChunk][kHeadDim / 4];
  const int tile = blockIdx.x, kv_head = blockIdx.y;
  const int seq = p.tile_seq[tile], first_query = p.tile_query[tile];
  const int row0 = p.query_start[seq], num_queries = p.query_start[seq + 1] - row0;
  const int context = p.context_lens[seq];
  const int query_end = min(num_queries, first_query + kPrefillQueryTile);
  const int query = first_query + static_cast<int>(threadIdx.x) / p.group;
  const int head = kv_head * p.group + static_cast<int>(threadIdx.x) % p.group;
  const bool active = static_cast<int>(threadIdx.x) < kPrefillQueryTile * p.group && query < query_end;
  const int my_pos = context + query;
  const int num_keys = context + query_end;  // visible to the tile's last query
  const int32_t* table = p.block_tables + static_cast<int64_t>(seq) * p.max_blocks_per_seq;

  float q[kHeadDim], acc[kHeadDim];
  float m = -INFINITY, l = 0.f;
#pragma unroll
  for (int i = 0; i < kHeadDim / 4; ++i) {
    float4 v = make_float4(0.f, 0.f, 0.f, 0.f);
    if (active) {
      v = reinterpret_cast<const float4*>(p.q + (row0 + query) * p.q_stride + static_cast<int64_t>(head) * kHeadDim)[i];
    }
    q[4 * i] = v.x; q[4 * i + 1] = v.y; q[4 * i + 2] = v.z; q[4 * i + 3] = v.w;
  }
#pragma unroll
  for (int d = 0; d < kHeadDim; ++d) acc[d] = 0.f;

  for (int chunk = 0; chunk < num_keys; chunk += kKeyChunk) {
    LoadChunk<kHeadDim>(p, table, kv_head, chunk, num_keys, k_s, v_s);
    __syncthreads();
    if (active && chunk <= my_pos) AttendChunk<kHeadDim>(q, acc, m, l, chunk, my_pos, p.scale, k_s, v_s);
    __syncthreads();  // the next chunk overwrites k_s and v_s
  }
  if (!active) return;
  __nv_bfloat16* dst = p.out + (row0 + query) * p.out_stride + static_cast<int64_t>(head) * kHeadDim;
  const float inv = 1.f / l;
#pragma unroll
  for (int d = 0; d < kHeadDim; ++d) dst[d] = __float2bfloat16_rn(acc[d] * inv);
}

bool Aligned16(const void* ptr) { return reinterpret_cast<uintptr_t>(ptr) % 16 == 0; }

}  // namespace

int PrefillAttention(const PrefillAttentionArgs& a) {
  if (a.num_tiles <= 0) return 0;
  if (!AttentionSupported(a.head_dim, a.num_heads, a.num_kv_heads) || a.q_stride % 4 != 0 || !Aligned16(a.q) ||
      !Aligned16(a.k_cache) || !Aligned16(a.v_cache)) {
    return static_cast<int>(cudaErrorInvalidValue);
  }
  if (a.impl == PrefillImpl::kTensorCore) {
    // bf16 pairs are stored as one 4-byte word.
    if (a.out_stride % 2 != 0 || reinterpret_cast<uintptr_t>(a.out) % 4 != 0) {
      return static_cast<int>(cudaErrorInvalidValue);
    }
    return internal::PrefillAttentionTensorCore(a);
  }
  if (a.impl != PrefillImpl::kSimt) return static_cast<int>(cudaErrorInvalidValue);
  PrefillParams p;
  p.q = a.q;
  p.k_cache = reinterpret_cast<const __nv_bfloat16*>(a.k_cache);
  p.v_cache = reinterpret_cast<const __nv_bfloat16*>(a.v_cache);
  p.block_tables = a.block_tables;
  p.query_start = a.query_start;
  p.context_lens = a.context_lens;
  p.tile_seq = a.tile_seq;
  p.tile_query = a.tile_query;
  p.out = reinterpret_cast<__nv_bfloat16*>(a.out);
  p.num_kv_heads = a.num_kv_heads;
  p.group = a.num_heads / a.num_kv_heads;
  p.block_size = a.block_size;
  p.max_blocks_per_seq = a.max_blocks_per_seq;
  p.q_stride = a.q_stride;
  p.out_stride = a.out_stride;
  p.scale = a.scale;
  const dim3 grid(a.num_tiles, a.num_kv_heads);
  auto stream = static_cast<cudaStream_t>(a.stream);
  if (a.head_dim == 16) {
    PrefillKernel<16><<<grid, kPrefillThreads, 0, stream>>>(p);
  } else {
    PrefillKernel<64><<<grid, kPrefillThreads, 0, stream>>>(p);
  }
  return static_cast<int>(cudaGetLastError());
}

}  // namespace ferry::kernels::cuda
