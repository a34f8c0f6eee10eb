// DecodeAttention (paged_attention.h): flash-decoding over the paged bf16 cache, two kernels
// with the same work split and math: DecodeKernel (DecodeImpl::kBaseline, loads straight from
// global memory: a chunk's K, then after the softmax its V) and DecodePrefetchKernel
// (kPrefetch, K and V of a chunk requested together by cp.async, the next chunk's before the
// current one is computed; see below).
//
// Block (KV head, sequence, split) owns the keys [begin, end) of its split, in chunks of
// kChunk. A key row of one KV head is head_dim bf16 = head_dim / 8 16-byte vectors; each lane
// holds one vector, so a warp reads 32 * 8 / head_dim keys at once, and each loaded key serves
// every query head of the group (q of all group heads sits in registers).
// Per chunk: (A) scores into shared memory, (B) every warp computes the same running max and
// sum per head (an online softmax), (C) each lane accumulates probability * V for its tokens
// and dims. At the end the lanes' partial outputs are summed across tokens (shuffles, then
// shared memory across warps). With one split the block writes the normalised output; with
// several, the partial (max, sum, unnormalised output) goes to the workspace and
// DecodeMergeKernel combines them: out = sum_i e^(m_i - M) o_i / sum_i e^(m_i - M) l_i.
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <algorithm>

#include "kernels/cuda/device_common.cuh"
#include "kernels/cuda/mma_common.cuh"
#include "kernels/cuda/paged_attention.h"

namespace ferry::kernels::cuda {
namespace {

constexpr int kDecodeThreads = 128;
constexpr int kDecodeWarps = kDecodeThreads / kWarpSize;
constexpr int kChunk = 64;  // keys per chunk; split boundaries are multiples of it

struct DecodeParams {
  const float* __restrict__ q;                   // [num_seqs, q_stride]
  const __nv_bfloat16* __restrict__ k_cache;     // [num_blocks, block_size, num_kv_heads, head_dim]
  const __nv_bfloat16* __restrict__ v_cache;     // [num_blocks, block_size, num_kv_heads, head_dim]
  const int32_t* __restrict__ block_tables;      // [num_seqs, max_blocks_per_seq]
  const int32_t* __restrict__ seq_lens;          // [num_seqs]
  __nv_bfloat16* __restrict__ out;               // [num_seqs, out_stride]
  float* __restrict__ part_out;                  // [num_seqs, num_heads, num_splits, head_dim]
  float* __restrict__ part_max;                  // [num_seqs, num_heads, num_splits]
  float* __restrict__ part_sum;                  // [num_seqs, num_heads, num_splits]
  int num_heads;
  int num_kv_heads;
  int group;
  int block_size;
  int max_blocks_per_seq;
  int num_splits;
  int64_t q_stride;
  int64_t out_stride;
  float scale;
};

// Keys per split: a multiple of kChunk, so chunks never straddle two splits.
__host__ __device__ __forceinline__ int PartitionSize(int seq_len, int num_splits) {
  const int per_split = (seq_len + num_splits - 1) / num_splits;
  return (per_split + kChunk - 1) / kChunk * kChunk;
}

__host__ __device__ __forceinline__ int NumValidSplits(int seq_len, int num_splits) {
  if (seq_len <= 0) return 0;
  const int partition = PartitionSize(seq_len, num_splits);
  return (seq_len + partition - 1) / partition;
}

__device__ __forceinline__ int64_t CacheOffset(const int32_t* table, int pos, int block_size, int num_kv_heads,
                                               int kv_head, int head_dim) {
  const int64_t slot = static_cast<int64_t>(table[pos / block_size]) * block_size + pos % block_size;
  return (slot * num_kv_heads + kv_head) * head_dim;
}

// Loads 8 consecutive fp32 values (16-byte aligned).
__device__ __forceinline__ void Load8(const float* src, float* dst) {
  const float4 a = reinterpret_cast<const float4*>(src)[0];
  const float4 b = reinterpret_cast<const float4*>(src)[1];
  dst[0] = a.x; dst[1] = a.y; dst[2] = a.z; dst[3] = a.w;
  dst[4] = b.x; dst[5] = b.y; dst[6] = b.z; dst[7] = b.w;
}

template <int kHeadDim>
struct DecodeShape {
  static constexpr int kLanesPerToken = kHeadDim / 8;                      // 16-byte vectors per key row
  static constexpr int kTokensPerWarp = kWarpSize / kLanesPerToken;
  static constexpr int kTokensPerPass = kTokensPerWarp * kDecodeWarps;
  static constexpr int kPasses = kChunk / kTokensPerPass;
  static_assert(kHeadDim % 8 == 0 && kWarpSize % kLanesPerToken == 0, "head_dim");
  static_assert(kChunk % kTokensPerPass == 0, "chunk");
};

// Zeros the group's output rows of a padding sequence (seq_len 0) when there is no merge.
template <int kHeadDim>
__device__ void WriteZeros(const DecodeParams& p, int seq, int kv_head) {
  for (int i = threadIdx.x; i < p.group * kHeadDim; i += kDecodeThreads) {
    const int head = kv_head * p.group + i / kHeadDim;
    p.out[seq * p.out_stride + static_cast<int64_t>(head) * kHeadDim + i % kHeadDim] = __float2bfloat16_rn(0.f);
  }
}

// Sums the per-lane partial outputs of the block and writes the output or the split's partial.
template <int kHeadDim>
__device__ void FinishDecode(const DecodeParams& p, float (&acc)[kMaxAttentionGroup][8], const float* m,
                             const float* l, int seq, int kv_head, int split) {
  using S = DecodeShape<kHeadDim>;
  __shared__ float reduce[kDecodeWarps][kMaxAttentionGroup][kHeadDim];
  const int warp = threadIdx.x / kWarpSize, lane = threadIdx.x % kWarpSize;
  const int slice = lane % S::kLanesPerToken;
#pragma unroll
  for (int g = 0; g < kMaxAttentionGroup; ++g) {
#pragma unroll
    for (int i = 0; i < 8; ++i) {
#pragma unroll
      for (int off = S::kLanesPerToken; off < kWarpSize; off <<= 1) {
        acc[g][i] += __shfl_xor_sync(0xffffffffu, acc[g][i], off);
      }
      if (lane < S::kLanesPerToken && g < p.group) reduce[warp][g][slice * 8 + i] = acc[g][i];
    }
  }
  __syncthreads();
  for (int idx = threadIdx.x; idx < p.group * kHeadDim; idx += kDecodeThreads) {
    const int g = idx / kHeadDim, d = idx % kHeadDim;
    float sum = 0.f;
#pragma unroll
    for (int w = 0; w < kDecodeWarps; ++w) sum += reduce[w][g][d];
    const int head = kv_head * p.group + g;
    if (p.num_splits == 1) {
      p.out[seq * p.out_stride + static_cast<int64_t>(head) * kHeadDim + d] = __float2bfloat16_rn(sum / l[g]);
    } else {
      const int64_t part = (static_cast<int64_t>(seq) * p.num_heads + head) * p.num_splits + split;
      p.part_out[part * kHeadDim + d] = sum;
      if (d == 0) {
        p.part_max[part] = m[g];
        p.part_sum[part] = l[g];
      }
    }
  }
}

// (B) of a chunk: every warp computes the same new running max and sum per head of the group
// from the chunk's scores, and rescales its lanes' accumulators.
__device__ __forceinline__ void ChunkSoftmax(const float (*scores)[kChunk], int group, int lane,
                                             float (&m)[kMaxAttentionGroup], float (&l)[kMaxAttentionGroup],
                                             float (&acc)[kMaxAttentionGroup][8]) {
#pragma unroll
  for (int g = 0; g < kMaxAttentionGroup; ++g) {
    if (g >= group) continue;
    float chunk_max = -INFINITY;
    for (int t = lane; t < kChunk; t += kWarpSize) chunk_max = fmaxf(chunk_max, scores[g][t]);
    const float new_max = fmaxf(m[g], WarpMax(chunk_max));  // finite: the chunk has a key
    float chunk_sum = 0.f;
    for (int t = lane; t < kChunk; t += kWarpSize) chunk_sum += expf(scores[g][t] - new_max);
    const float alpha = expf(m[g] - new_max);  // 0 on the first chunk
    l[g] = l[g] * alpha + WarpSum(chunk_sum);
    m[g] = new_max;
#pragma unroll
    for (int i = 0; i < 8; ++i) acc[g][i] *= alpha;
  }
}

template <int kHeadDim>
__global__ void __launch_bounds__(kDecodeThreads) DecodeKernel(DecodeParams p) {
  using S = DecodeShape<kHeadDim>;
  __shared__ float scores[kMaxAttentionGroup][kChunk];
  __shared__ float final_max[kMaxAttentionGroup];
  __shared__ float final_sum[kMaxAttentionGroup];
  const int kv_head = blockIdx.x, seq = blockIdx.y, split = blockIdx.z;
  const int seq_len = p.seq_lens[seq];
  const int partition = PartitionSize(seq_len, p.num_splits);
  const int begin = split * partition;
  const int end = min(seq_len, begin + partition);
  if (begin >= end) {
    if (p.num_splits == 1) WriteZeros<kHeadDim>(p, seq, kv_head);  // seq_len == 0
    return;  // an empty split: the merge counts only the valid ones
  }
  const int warp = threadIdx.x / kWarpSize, lane = threadIdx.x % kWarpSize;
  const int slice = lane % S::kLanesPerToken;           // which 8 dims of a key row
  const int token_in_warp = lane / S::kLanesPerToken;   // which key of the warp's pass
  const int group = p.group;

  float q[kMaxAttentionGroup][8];
  float acc[kMaxAttentionGroup][8];
  float m[kMaxAttentionGroup], l[kMaxAttentionGroup];
#pragma unroll
  for (int g = 0; g < kMaxAttentionGroup; ++g) {
    m[g] = -INFINITY;
    l[g] = 0.f;
#pragma unroll
    for (int i = 0; i < 8; ++i) q[g][i] = acc[g][i] = 0.f;
    if (g < group) {
      Load8(p.q + seq * p.q_stride + static_cast<int64_t>(kv_head * group + g) * kHeadDim + slice * 8, q[g]);
    }
  }
  const int32_t* table = p.block_tables + static_cast<int64_t>(seq) * p.max_blocks_per_seq;

  for (int chunk = begin; chunk < end; chunk += kChunk) {
    // (A) Scores of the chunk's keys for every head of the group.
#pragma unroll
    for (int pass = 0; pass < S::kPasses; ++pass) {
      const int t = pass * S::kTokensPerPass + warp * S::kTokensPerWarp + token_in_warp;
      const int pos = chunk + t;
      float dots[kMaxAttentionGroup];
      float k[8] = {};
      if (pos < end) {
        const int64_t off = CacheOffset(table, pos, p.block_size, p.num_kv_heads, kv_head, kHeadDim);
        Bf16x8ToFloat(LoadBf16x8(p.k_cache + off + slice * 8), k);
      }
#pragma unroll
      for (int g = 0; g < kMaxAttentionGroup; ++g) {
        float dot = 0.f;
#pragma unroll
        for (int i = 0; i < 8; ++i) dot += q[g][i] * k[i];
#pragma unroll
        for (int off = S::kLanesPerToken / 2; off > 0; off >>= 1) dot += __shfl_xor_sync(0xffffffffu, dot, off);
        dots[g] = dot;
      }
      if (slice == 0) {
#pragma unroll
        for (int g = 0; g < kMaxAttentionGroup; ++g) {
          if (g < group) scores[g][t] = pos < end ? dots[g] * p.scale : -INFINITY;
        }
      }
    }
    __syncthreads();
    // (B) Online softmax: every warp computes the same new max and sum per head.
    ChunkSoftmax(scores, group, lane, m, l, acc);
    // (C) Probability-weighted values, for the same keys and dims as in (A).
#pragma unroll
    for (int pass = 0; pass < S::kPasses; ++pass) {
      const int t = pass * S::kTokensPerPass + warp * S::kTokensPerWarp + token_in_warp;
      const int pos = chunk + t;
      if (pos >= end) continue;
      const int64_t off = CacheOffset(table, pos, p.block_size, p.num_kv_heads, kv_head, kHeadDim);
      float v[8];
      Bf16x8ToFloat(LoadBf16x8(p.v_cache + off + slice * 8), v);
#pragma unroll
      for (int g = 0; g < kMaxAttentionGroup; ++g) {
        if (g >= group) continue;
        const float prob = expf(scores[g][t] - m[g]);
#pragma unroll
        for (int i = 0; i < 8; ++i) acc[g][i] += prob * v[i];
      }
    }
    __syncthreads();  // scores is rewritten by the next chunk
  }
  if (threadIdx.x == 0) {
#pragma unroll
    for (int g = 0; g < kMaxAttentionGroup; ++g) {
      final_max[g] = m[g];
      final_sum[g] = l[g];
    }
  }
  __syncthreads();
  FinishDecode<kHeadDim>(p, acc, final_max, final_sum, seq, kv_head, split);
}

// kPrefetch: a chunk's K and V rows go to shared memory by cp.async, both requested together and
// one chunk ahead, so the memory system has two chunks in flight while the block computes.
// Thread i copies exactly the 16-byte vectors it later reads (vector pass * kDecodeThreads + i
// of the chunk, the (token, slice) of DecodeKernel's passes), so its own cp.async.wait_group
// makes them visible to it; a warp reads 512 contiguous bytes (no bank conflicts).
template <int kHeadDim>
struct DecodeStage {
  uint4 k[DecodeShape<kHeadDim>::kPasses][kDecodeThreads];  // bf16 x 8 each
  uint4 v[DecodeShape<kHeadDim>::kPasses][kDecodeThreads];
};

// Requests the thread's K and V vectors of keys [chunk, chunk + kChunk) as one cp.async group;
// keys at or past `end` are zero-filled without reading the block table or the cache.
template <int kHeadDim>
__device__ __forceinline__ void RequestChunk(const DecodeParams& p, const int32_t* table, int kv_head, int chunk,
                                             int end, DecodeStage<kHeadDim>& stage) {
  using S = DecodeShape<kHeadDim>;
  const int warp = threadIdx.x / kWarpSize, lane = threadIdx.x % kWarpSize;
  const int slice = lane % S::kLanesPerToken, token_in_warp = lane / S::kLanesPerToken;
#pragma unroll
  for (int pass = 0; pass < S::kPasses; ++pass) {
    const int pos = chunk + pass * S::kTokensPerPass + warp * S::kTokensPerWarp + token_in_warp;
    int64_t off = 0;
    int bytes = 0;
    if (pos < end) {
      off = CacheOffset(table, pos, p.block_size, p.num_kv_heads, kv_head, kHeadDim) + slice * 8;
      bytes = 16;
    }
    CpAsync16(&stage.k[pass][threadIdx.x], p.k_cache + off, bytes);
    CpAsync16(&stage.v[pass][threadIdx.x], p.v_cache + off, bytes);
  }
  CpAsyncCommit();
}

__device__ __forceinline__ void SharedBf16x8ToFloat(const uint4& raw, float* out) {  // out [8]
  Bf16x8 v;
  memcpy(&v, &raw, sizeof(raw));
  Bf16x8ToFloat(v, out);
}

// (A) and (C) of DecodeKernel, reading the chunk from its stage.
template <int kHeadDim>
__device__ __forceinline__ void AttendStagedChunk(const DecodeParams& p, const DecodeStage<kHeadDim>& stage,
                                                  const float (&q)[kMaxAttentionGroup][8], int chunk, int end,
                                                  float (*scores)[kChunk], float (&m)[kMaxAttentionGroup],
                                                  float (&l)[kMaxAttentionGroup], float (&acc)[kMaxAttentionGroup][8]) {
  using S = DecodeShape<kHeadDim>;
  const int warp = threadIdx.x / kWarpSize, lane = threadIdx.x % kWarpSize;
  const int slice = lane % S::kLanesPerToken, token_in_warp = lane / S::kLanesPerToken;
#pragma unroll
  for (int pass = 0; pass < S::kPasses; ++pass) {
    const int t = pass * S::kTokensPerPass + warp * S::kTokensPerWarp + token_in_warp;
    float k[8];
    SharedBf16x8ToFloat(stage.k[pass][threadIdx.x], k);  // zeros past `end`
#pragma unroll
    for (int g = 0; g < kMaxAttentionGroup; ++g) {
      float dot = 0.f;
#pragma unroll
      for (int i = 0; i < 8; ++i) dot += q[g][i] * k[i];
#pragma unroll
      for (int off = S::kLanesPerToken / 2; off > 0; off >>= 1) dot += __shfl_xor_sync(0xffffffffu, dot, off);
      if (slice == 0 && g < p.group) scores[g][t] = chunk + t < end ? dot * p.scale : -INFINITY;
    }
  }
  __syncthreads();
  ChunkSoftmax(scores, p.group, lane, m, l, acc);
#pragma unroll
  for (int pass = 0; pass < S::kPasses; ++pass) {
    const int t = pass * S::kTokensPerPass + warp * S::kTokensPerWarp + token_in_warp;
    if (chunk + t >= end) continue;
    float v[8];
    SharedBf16x8ToFloat(stage.v[pass][threadIdx.x], v);
#pragma unroll
    for (int g = 0; g < kMaxAttentionGroup; ++g) {
      if (g >= p.group) continue;
      const float prob = expf(scores[g][t] - m[g]);
#pragma unroll
      for (int i = 0; i < 8; ++i) acc[g][i] += prob * v[i];
    }
  }
}

template <int kHeadDim>
__global__ void __launch_bounds__(kDecodeThreads) DecodePrefetchKernel(DecodeParams p) {
  __shared__ float scores[kMaxAttentionGroup][kChunk];
  __shared__ float final_max[kMaxAttentionGroup];
  __shared__ float final_sum[kMaxAttentionGroup];
  __shared__ DecodeStage<kHeadDim> stages[2];
  const int kv_head = blockIdx.x, seq = blockIdx.y, split = blockIdx.z;
  const int seq_len = p.seq_lens[seq];
  const int partition = PartitionSize(seq_len, p.num_splits);
  const int begin = split * partition;
  const int end = min(seq_len, begin + partition);
  if (begin >= end) {
    if (p.num_splits == 1) WriteZeros<kHeadDim>(p, seq, kv_head);  // seq_len == 0
    return;  // an empty split: the merge counts only the valid ones
  }
  const int32_t* table = p.block_tables + static_cast<int64_t>(seq) * p.max_blocks_per_seq;
  RequestChunk<kHeadDim>(p, table, kv_head, begin, end, stages[0]);  // in flight while q loads
  const int slice = (threadIdx.x % kWarpSize) % DecodeShape<kHeadDim>::kLanesPerToken;
  float q[kMaxAttentionGroup][8];
  float acc[kMaxAttentionGroup][8];
  float m[kMaxAttentionGroup], l[kMaxAttentionGroup];
#pragma unroll
  for (int g = 0; g < kMaxAttentionGroup; ++g) {
    m[g] = -INFINITY;
    l[g] = 0.f;
#pragma unroll
    for (int i = 0; i < 8; ++i) q[g][i] = acc[g][i] = 0.f;
    if (g < p.group) {
      Load8(p.q + seq * p.q_stride + static_cast<int64_t>(kv_head * p.group + g) * kHeadDim + slice * 8, q[g]);
    }
  }
  for (int chunk = begin, i = 0; chunk < end; chunk += kChunk, ++i) {
    if (chunk + kChunk < end) {
      // The other stage was last read in iteration i - 1, by this thread only.
      RequestChunk<kHeadDim>(p, table, kv_head, chunk + kChunk, end, stages[(i + 1) % 2]);
      CpAsyncWait<1>();  // this chunk's group has landed
    } else {
      CpAsyncWait<0>();
    }
    AttendStagedChunk<kHeadDim>(p, stages[i % 2], q, chunk, end, scores, m, l, acc);
    __syncthreads();  // scores is rewritten by the next chunk
  }
  if (threadIdx.x == 0) {
#pragma unroll
    for (int g = 0; g < kMaxAttentionGroup; ++g) {
      final_max[g] = m[g];
      final_sum[g] = l[g];
    }
  }
  __syncthreads();
  FinishDecode<kHeadDim>(p, acc, final_max, final_sum, seq, kv_head, split);
}

// grid (num_heads, num_seqs); one thread per output dim.
template <int kHeadDim>
__global__ void __launch_bounds__(kHeadDim < kWarpSize ? kWarpSize : kHeadDim) DecodeMergeKernel(DecodeParams p) {
  const int head = blockIdx.x, seq = blockIdx.y, d = threadIdx.x;
  if (d >= kHeadDim) return;
  const int valid = NumValidSplits(p.seq_lens[seq], p.num_splits);
  __nv_bfloat16* dst = p.out + seq * p.out_stride + static_cast<int64_t>(head) * kHeadDim + d;
  if (valid == 0) {
    *dst = __float2bfloat16_rn(0.f);
    return;
  }
  const int64_t base = (static_cast<int64_t>(seq) * p.num_heads + head) * p.num_splits;
  float global_max = -INFINITY;
  for (int s = 0; s < valid; ++s) global_max = fmaxf(global_max, p.part_max[base + s]);
  float denom = 0.f, value = 0.f;
  for (int s = 0; s < valid; ++s) {
    const float w = expf(p.part_max[base + s] - global_max);
    denom += w * p.part_sum[base + s];
    value += w * p.part_out[(base + s) * kHeadDim + d];
  }
  *dst = __float2bfloat16_rn(value / denom);
}

template <int kHeadDim>
int LaunchDecode(const DecodeParams& p, int num_seqs, DecodeImpl impl, cudaStream_t stream) {
  const dim3 grid(p.num_kv_heads, num_seqs, p.num_splits);
  if (impl == DecodeImpl::kPrefetch) {
    DecodePrefetchKernel<kHeadDim><<<grid, kDecodeThreads, 0, stream>>>(p);
  } else {
    DecodeKernel<kHeadDim><<<grid, kDecodeThreads, 0, stream>>>(p);
  }
  if (p.num_splits > 1) {
    const dim3 merge_grid(p.num_heads, num_seqs);
    DecodeMergeKernel<kHeadDim><<<merge_grid, kHeadDim < kWarpSize ? kWarpSize : kHeadDim, 0, stream>>>(p);
  }
  return static_cast<int>(cudaGetLastError());
}

bool Aligned16(const void* ptr) { return reinterpret_cast<uintptr_t>(ptr) % 16 == 0; }

}  // namespace

bool AttentionSupported(int32_t head_dim, int32_t num_heads, int32_t num_kv_heads) {
  if (head_dim != 16 && head_dim != 64) return false;
  if (num_kv_heads <= 0 || num_heads % num_kv_heads != 0) return false;
  return num_heads / num_kv_heads <= kMaxAttentionGroup;
}

int32_t ChooseDecodeSplits(int32_t num_seqs, int32_t num_kv_heads, int32_t num_sms, int32_t max_seq_len) {
  const int64_t blocks = std::max<int64_t>(1, int64_t{num_seqs} * num_kv_heads);
  int64_t splits = (2 * int64_t{num_sms} + blocks - 1) / blocks;  // about two blocks per SM
  if (max_seq_len > 0) splits = std::min<int64_t>(splits, (max_seq_len + kChunk - 1) / kChunk);
  return static_cast<int32_t>(std::clamp<int64_t>(splits, 1, kMaxDecodeSplits));
}

int64_t DecodeWorkspaceFloats(int32_t num_seqs, int32_t num_heads, int32_t head_dim, int32_t num_splits) {
  return int64_t{num_seqs} * num_heads * num_splits * (head_dim + 2);
}

int DecodeAttention(const DecodeAttentionArgs& a) {
  if (a.num_seqs <= 0) return 0;
  if (!AttentionSupported(a.head_dim, a.num_heads, a.num_kv_heads) || a.num_splits < 1 ||
      a.num_splits > kMaxDecodeSplits || a.q_stride % 4 != 0 || !Aligned16(a.q) || !Aligned16(a.k_cache) ||
      !Aligned16(a.v_cache) || (a.num_splits > 1 && a.workspace == nullptr) ||
      (a.impl != DecodeImpl::kPrefetch && a.impl != DecodeImpl::kBaseline)) {
    return static_cast<int>(cudaErrorInvalidValue);
  }
  DecodeParams p;
  p.q = a.q;
  p.k_cache = reinterpret_cast<const __nv_bfloat16*>(a.k_cache);
  p.v_cache = reinterpret_cast<const __nv_bfloat16*>(a.v_cache);
  p.block_tables = a.block_tables;
  p.seq_lens = a.seq_lens;
  p.out = reinterpret_cast<__nv_bfloat16*>(a.out);
  const int64_t parts = int64_t{a.num_seqs} * a.num_heads * a.num_splits;
  p.part_out = a.workspace;
  p.part_max = a.workspace == nullptr ? nullptr : a.workspace + parts * a.head_dim;
  p.part_sum = a.workspace == nullptr ? nullptr : p.part_max + parts;
  p.num_heads = a.num_heads;
  p.num_kv_heads = a.num_kv_heads;
  p.group = a.num_heads / a.num_kv_heads;
  p.block_size = a.block_size;
  p.max_blocks_per_seq = a.max_blocks_per_seq;
  p.num_splits = a.num_splits;
  p.q_stride = a.q_stride;
  p.out_stride = a.out_stride;
  p.scale = a.scale;
  auto stream = static_cast<cudaStream_t>(a.stream);
  return a.head_dim == 16 ? LaunchDecode<16>(p, a.num_seqs, a.impl, stream)
                          : LaunchDecode<64>(p, a.num_seqs, a.impl, stream);
}

}  // namespace ferry::kernels::cuda
