// PrefillAttention with PrefillImpl::kTensorCore (paged_attention.h): FlashAttention-2-style
// causal attention on bf16 tensor cores (mma.sync.m16n8k16, fp32 accumulate) over the paged
// cache.
//
// Block (tile, KV head): the tile's kPrefillQueryTile = 16 queries for each of the `group`
// query heads of the KV head, one warp per head, so a warp owns exactly one 16-row mma tile
// and the block's warps share every K/V load (GQA: Qwen2.5-0.5B's group of 7 gives 112 rows per
// block, about FlashAttention-2's 128). The query tile list is the SIMT kernel's, so the batch
// layout needs no change.
//
// Per warp: Q (fp32 rows) rounded to bf16 once into A fragments held in registers. Keys and
// values stream through shared memory in chunks of kKeyTile positions, two stages: chunk i+1's
// K and V are requested together (cp.async, zero-filled past the last visible key, so no
// read goes past the sequence) before chunk i is computed. Per chunk: S = Q K^T (fp32
// registers), scaled into log2 units, causal mask, online softmax in registers (row max over
// the 4 lanes of a row), P rounded to bf16 and reused in registers as the A operand of O += P V.
// l sums the fp32 probabilities. Shared rows are padded by 16 bytes, so the 8 rows an ldmatrix
// phase reads fall in 8 distinct 4-bank groups (no bank conflicts).
//
// mma.sync rather than nvcuda::wmma: wmma's fragment layout is unspecified, so masking and the
// softmax would need S written to shared memory and P read back; mma.sync's layout is
// documented (mma_common.cuh), which keeps S and P in registers.
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include "kernels/cuda/attention_internal.h"
#include "kernels/cuda/device_common.cuh"
#include "kernels/cuda/mma_common.cuh"

namespace ferry::kernels::cuda::internal {
namespace {

constexpr int kKeyTile = 64;   // keys per shared-memory stage
constexpr int kStages = 2;     // chunk i computed while chunk i+1 loads
constexpr int kRowPad = 8;     // bf16 per shared row beyond head_dim: 16 bytes
constexpr int kMaxThreads = kMaxAttentionGroup * kWarpSize;
constexpr float kLog2e = 1.4426950408889634f;
static_assert(kPrefillQueryTile == 16, "one m16 mma tile per warp");

template <int kHeadDim>
struct TcShape {
  static constexpr int kRow = kHeadDim + kRowPad;  // shared row stride, bf16 elements
  static constexpr int kVecs = kHeadDim / 8;       // 16-byte vectors per cache row
  static constexpr int kDimSteps = kHeadDim / 16;  // k16 steps of Q K^T
  static constexpr int kDimTiles = kHeadDim / 8;   // n8 tiles of O
  static constexpr int kKeyTiles = kKeyTile / 8;   // n8 tiles of S
  static constexpr int kKeySteps = kKeyTile / 16;  // k16 steps of P V
  static_assert(kHeadDim % 16 == 0 && kDimTiles % 2 == 0, "head_dim: whole k16 steps, n8 tiles in pairs");
  static_assert(kRow * 2 % 16 == 0, "ldmatrix rows 16-byte aligned");
};

struct TcParams {
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
  float scale_log2;  // scale * log2(e): scores in log2 units, so exp2f does the softmax
};

// What one block needs to know about its tile.
struct TileInfo {
  const int32_t* table;  // the sequence's block-table row
  int64_t row0;          // token row of the sequence's first query
  int context;           // tokens cached before this step
  int first_query;       // of the tile, within the sequence
  int query_end;         // one past the tile's last query
  int num_keys;          // keys visible to the tile's last query
};

// Requests keys [key0, key0 + kKeyTile) of one KV head, K and V together, into a stage; rows at
// or past num_keys are zero-filled without touching the block table or the cache.
template <int kHeadDim>
__device__ __forceinline__ void LoadKvAsync(const TcParams& p, const TileInfo& t, int kv_head, int key0,
                                            __nv_bfloat16 (*k_s)[TcShape<kHeadDim>::kRow],
                                            __nv_bfloat16 (*v_s)[TcShape<kHeadDim>::kRow]) {
  using S = TcShape<kHeadDim>;
  for (int idx = threadIdx.x; idx < kKeyTile * S::kVecs; idx += blockDim.x) {
    const int j = idx / S::kVecs, part = idx % S::kVecs, pos = key0 + j;
    int64_t off = 0;
    int bytes = 0;
    if (pos < t.num_keys) {
      const int64_t slot = static_cast<int64_t>(t.table[pos / p.block_size]) * p.block_size + pos % p.block_size;
      off = (slot * p.num_kv_heads + kv_head) * kHeadDim + part * 8;
      bytes = 16;
    }
    CpAsync16(&k_s[j][part * 8], p.k_cache + off, bytes);
    CpAsync16(&v_s[j][part * 8], p.v_cache + off, bytes);
  }
}

// The warp's Q rows (queries first_query + g and + g + 8 of head `head`) as bf16 A fragments;
// rows past the tile's end are zeros and never read from memory.
template <int kHeadDim>
__device__ __forceinline__ void LoadQ(const TcParams& p, const TileInfo& t, int head,
                                      uint32_t (&qf)[TcShape<kHeadDim>::kDimSteps][4]) {
  const int lane = threadIdx.x % kWarpSize, g = lane / 4, c = (lane % 4) * 2;
#pragma unroll
  for (int half = 0; half < 2; ++half) {
    const int query = t.first_query + g + 8 * half;
    const bool valid = query < t.query_end;
    const float* row = p.q + (t.row0 + query) * p.q_stride + static_cast<int64_t>(head) * kHeadDim;
#pragma unroll
    for (int ks = 0; ks < TcShape<kHeadDim>::kDimSteps; ++ks) {
      float2 lo = make_float2(0.f, 0.f), hi = make_float2(0.f, 0.f);
      if (valid) {
        lo = *reinterpret_cast<const float2*>(row + ks * 16 + c);
        hi = *reinterpret_cast<const float2*>(row + ks * 16 + 8 + c);
      }
      qf[ks][half] = PackBf16x2(lo.x, lo.y);
      qf[ks][2 + half] = PackBf16x2(hi.x, hi.y);
    }
  }
}

// Running softmax state of the lane's two rows (g and g + 8).
template <int kHeadDim>
struct RowState {
  float o[TcShape<kHeadDim>::kDimTiles][4];  // unnormalised output, C fragments
  float m[2];                                // running max, log2 units
  float l[2];                                // this lane's share of the running sum
};

// s (scores in log2 units, masked) -> probabilities; rescales the state to the new row max.
template <int kHeadDim>
__device__ __forceinline__ void OnlineSoftmax(float (&s)[kKeyTile / 8][4], RowState<kHeadDim>& st) {
#pragma unroll
  for (int half = 0; half < 2; ++half) {
    float mx = st.m[half];
#pragma unroll
    for (int nt = 0; nt < kKeyTile / 8; ++nt) mx = fmaxf(mx, fmaxf(s[nt][2 * half], s[nt][2 * half + 1]));
    mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 1));
    mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 2));
    // Finite: key 0 is visible to every row in the first chunk, and m only grows.
    const float alpha = exp2f(st.m[half] - mx);  // 0 on the first chunk (m = -inf)
    st.m[half] = mx;
    float sum = 0.f;
#pragma unroll
    for (int nt = 0; nt < kKeyTile / 8; ++nt) {
      s[nt][2 * half] = exp2f(s[nt][2 * half] - mx);
      s[nt][2 * half + 1] = exp2f(s[nt][2 * half + 1] - mx);
      sum += s[nt][2 * half] + s[nt][2 * half + 1];
    }
    st.l[half] = st.l[half] * alpha + sum;
#pragma unroll
    for (int dt = 0; dt < TcShape<kHeadDim>::kDimTiles; ++dt) {
      st.o[dt][2 * half] *= alpha;
      st.o[dt][2 * half + 1] *= alpha;
    }
  }
}

// One chunk of keys [key0, key0 + kKeyTile) for the warp's 16 rows.
template <int kHeadDim>
__device__ __forceinline__ void AttendChunk(const uint32_t (&qf)[TcShape<kHeadDim>::kDimSteps][4],
                                            RowState<kHeadDim>& st, const __nv_bfloat16 (*k_s)[TcShape<kHeadDim>::kRow],
                                            const __nv_bfloat16 (*v_s)[TcShape<kHeadDim>::kRow], int key0,
                                            int min_pos, const int (&q_pos)[2], float scale_log2) {
  using S = TcShape<kHeadDim>;
  const int lane = threadIdx.x % kWarpSize, c = (lane % 4) * 2;
  // ldmatrix row addresses: lane l serves row l % 8 of matrix l / 8.
  const int mat_row = lane % 8, mat = lane / 8;
  float s[S::kKeyTiles][4];
#pragma unroll
  for (int nt = 0; nt < S::kKeyTiles; ++nt) s[nt][0] = s[nt][1] = s[nt][2] = s[nt][3] = 0.f;
  // S = Q K^T: K rows are keys (the n index), contiguous in dims (the k index): B "col" as stored.
#pragma unroll
  for (int ks = 0; ks < S::kDimSteps; ++ks) {
#pragma unroll
    for (int nt = 0; nt < S::kKeyTiles; nt += 2) {
      uint32_t b[4];  // matrices: (keys nt, dims lo), (nt, hi), (nt + 1, lo), (nt + 1, hi)
      LdMatrixX4(b, &k_s[nt * 8 + (mat / 2) * 8 + mat_row][ks * 16 + (mat % 2) * 8]);
      MmaBf16(s[nt], qf[ks], b[0], b[1]);
      MmaBf16(s[nt + 1], qf[ks], b[2], b[3]);
    }
  }
  // Keys after a row's own position are masked; a chunk wholly before the tile's first query
  // needs no mask (it also lies wholly before num_keys).
  const bool needs_mask = key0 + kKeyTile - 1 > min_pos;
#pragma unroll
  for (int nt = 0; nt < S::kKeyTiles; ++nt) {
#pragma unroll
    for (int e = 0; e < 4; ++e) {
      const int key = key0 + nt * 8 + c + (e % 2);
      s[nt][e] = needs_mask && key > q_pos[e / 2] ? -INFINITY : s[nt][e] * scale_log2;
    }
  }
  OnlineSoftmax<kHeadDim>(s, st);
  // O += P V: two adjacent S tiles are the A fragment of a 16-key step; V rows are keys (the
  // k index), so B comes from the transposing ldmatrix.
#pragma unroll
  for (int kk = 0; kk < S::kKeySteps; ++kk) {
    const uint32_t a[4] = {PackBf16x2(s[2 * kk][0], s[2 * kk][1]), PackBf16x2(s[2 * kk][2], s[2 * kk][3]),
                           PackBf16x2(s[2 * kk + 1][0], s[2 * kk + 1][1]),
                           PackBf16x2(s[2 * kk + 1][2], s[2 * kk + 1][3])};
#pragma unroll
    for (int dt = 0; dt < S::kDimTiles; dt += 2) {
      uint32_t b[4];  // matrices: (keys lo, dims dt), (keys hi, dt), (lo, dt + 1), (hi, dt + 1)
      LdMatrixX4Trans(b, &v_s[kk * 16 + (mat % 2) * 8 + mat_row][dt * 8 + (mat / 2) * 8]);
      MmaBf16(st.o[dt], a, b[0], b[1]);
      MmaBf16(st.o[dt + 1], a, b[2], b[3]);
    }
  }
}

// Normalises the lane's rows and writes them as bf16 pairs (rows past the tile's end skipped).
template <int kHeadDim>
__device__ __forceinline__ void StoreOutput(const TcParams& p, const TileInfo& t, int head, RowState<kHeadDim>& st) {
  const int lane = threadIdx.x % kWarpSize, g = lane / 4, c = (lane % 4) * 2;
#pragma unroll
  for (int half = 0; half < 2; ++half) {
    float l = st.l[half];
    l += __shfl_xor_sync(0xffffffffu, l, 1);
    l += __shfl_xor_sync(0xffffffffu, l, 2);
    const int query = t.first_query + g + 8 * half;
    if (query >= t.query_end) continue;
    const float inv = 1.f / l;
    __nv_bfloat16* dst = p.out + (t.row0 + query) * p.out_stride + static_cast<int64_t>(head) * kHeadDim + c;
#pragma unroll
    for (int dt = 0; dt < TcShape<kHeadDim>::kDimTiles; ++dt) {
      *reinterpret_cast<__nv_bfloat162*>(dst + dt * 8) =
          __floats2bfloat162_rn(st.o[dt][2 * half] * inv, st.o[dt][2 * half + 1] * inv);
    }
  }
}

// grid (num_tiles, num_kv_heads), block group * 32 threads: warp w is query head
// kv_head * group + w.
template <int kHeadDim>
__global__ void __launch_bounds__(kMaxThreads) PrefillTcKernel(TcParams p) {
  using S = TcShape<kHeadDim>;
  __shared__ __align__(16) __nv_bfloat16 k_s[kStages][kKeyTile][S::kRow];
  __shared__ __align__(16) __nv_bfloat16 v_s[kStages][kKeyTile][S::kRow];
  const int tile = blockIdx.x, kv_head = blockIdx.y;
  const int head = kv_head * p.group + static_cast<int>(threadIdx.x) / kWarpSize;
  TileInfo t;
  const int seq = p.tile_seq[tile];
  t.table = p.block_tables + static_cast<int64_t>(seq) * p.max_blocks_per_seq;
  t.row0 = p.query_start[seq];
  const int num_queries = p.query_start[seq + 1] - p.query_start[seq];
  t.context = p.context_lens[seq];
  t.first_query = p.tile_query[tile];
  t.query_end = min(num_queries, t.first_query + kPrefillQueryTile);
  t.num_keys = t.context + t.query_end;

  const int g = (threadIdx.x % kWarpSize) / 4;
  const int min_pos = t.context + t.first_query;  // the tile's first query sees keys <= min_pos
  const int q_pos[2] = {min_pos + g, min_pos + g + 8};
  uint32_t qf[S::kDimSteps][4];
  LoadQ<kHeadDim>(p, t, head, qf);
  RowState<kHeadDim> st;
#pragma unroll
  for (int dt = 0; dt < S::kDimTiles; ++dt) st.o[dt][0] = st.o[dt][1] = st.o[dt][2] = st.o[dt][3] = 0.f;
  st.m[0] = st.m[1] = -INFINITY;
  st.l[0] = st.l[1] = 0.f;

  const int num_chunks = (t.num_keys + kKeyTile - 1) / kKeyTile;
  LoadKvAsync<kHeadDim>(p, t, kv_head, 0, k_s[0], v_s[0]);
  CpAsyncCommit();
  for (int i = 0; i < num_chunks; ++i) {
    const int stage = i % kStages;
    if (i + 1 < num_chunks) {
      // The other stage was last read in iteration i - 1, before its closing barrier.
      LoadKvAsync<kHeadDim>(p, t, kv_head, (i + 1) * kKeyTile, k_s[1 - stage], v_s[1 - stage]);
      CpAsyncCommit();
      CpAsyncWait<1>();  // chunk i's group has landed (this thread's copies)
    } else {
      CpAsyncWait<0>();
    }
    __syncthreads();  // every thread's copies of chunk i visible
    AttendChunk<kHeadDim>(qf, st, k_s[stage], v_s[stage], i * kKeyTile, min_pos, q_pos, p.scale_log2);
    __syncthreads();  // chunk i's stage is overwritten in iteration i + 1
  }
  StoreOutput<kHeadDim>(p, t, head, st);
}

}  // namespace

int PrefillAttentionTensorCore(const PrefillAttentionArgs& a) {
  TcParams p;
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
  p.scale_log2 = a.scale * kLog2e;
  const dim3 grid(a.num_tiles, a.num_kv_heads);
  const int threads = p.group * kWarpSize;
  auto stream = static_cast<cudaStream_t>(a.stream);
  if (a.head_dim == 16) {
    PrefillTcKernel<16><<<grid, threads, 0, stream>>>(p);
  } else {
    PrefillTcKernel<64><<<grid, threads, 0, stream>>>(p);
  }
  return static_cast<int>(cudaGetLastError());
}

}  // namespace ferry::kernels::cuda::internal
