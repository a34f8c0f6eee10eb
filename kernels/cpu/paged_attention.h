// Causal grouped-query attention over a paged KV cache, CPU. Computation is fp32; the cache
// holds fp32 or bf16 (bf16 halves the memory a decode step reads).
//
// Cache layout, one pair per layer: k_cache and v_cache are each
// [num_blocks, block_size, num_kv_heads, head_dim]. Token position p of a sequence lives in
// physical block block_table[p / block_size] at offset p % block_size (slot
// block * block_size + offset). The caller owns block assignment; these kernels only index.
//
// A step's tokens are ragged: sequence s contributes the query tokens
// [query_start[s], query_start[s + 1]) of the flattened batch, at positions
// [context_lens[s], context_lens[s] + n). Prefill chunks and single decode tokens mix freely.
#pragma once

#include <cstdint>

namespace ferry::kernels::cpu {

enum class KvDtype { kFloat32, kBfloat16 };

struct KvCacheShape {
  int32_t num_blocks = 0;
  int32_t block_size = 0;
  int32_t num_kv_heads = 0;
  int32_t head_dim = 0;
  KvDtype dtype = KvDtype::kFloat32;
};

// Bytes of one cache element.
inline int64_t KvElementBytes(KvDtype dtype) { return dtype == KvDtype::kFloat32 ? 4 : 2; }

// Copies each new token's K and V into its cache slot (rounding to bf16 for a bf16 cache).
// slot_mapping[t] < 0 skips token t. src_stride: floats between consecutive tokens of k and v
// (0: dense, num_kv_heads * head_dim), so k and v may be column ranges of a fused QKV output.
void WriteKvCache(const KvCacheShape& shape,
                  const float* k,               // [num_tokens, src_stride]
                  const float* v,               // [num_tokens, src_stride]
                  const int32_t* slot_mapping,  // [num_tokens]
                  int64_t num_tokens,
                  void* k_cache,                // [num_blocks, block_size, num_kv_heads, head_dim]
                  void* v_cache,                // [num_blocks, block_size, num_kv_heads, head_dim]
                  int64_t src_stride = 0);

struct PagedAttentionParams {
  KvCacheShape cache;
  int32_t num_seqs = 0;
  int32_t num_heads = 0;           // a multiple of cache.num_kv_heads
  int32_t max_blocks_per_seq = 0;  // row stride of block_tables
  float scale = 1.f;               // usually 1 / sqrt(head_dim)
  int64_t q_stride = 0;            // floats between query tokens; 0: num_heads * head_dim
  int64_t out_stride = 0;          // floats between output tokens; 0: num_heads * head_dim

  const float* q = nullptr;               // [num_tokens, q_stride]
  const void* k_cache = nullptr;          // [num_blocks, block_size, num_kv_heads, head_dim]
  const void* v_cache = nullptr;          // [num_blocks, block_size, num_kv_heads, head_dim]
  const int32_t* block_tables = nullptr;  // [num_seqs, max_blocks_per_seq]
  const int32_t* query_start = nullptr;   // [num_seqs + 1], query_start[0] == 0
  const int32_t* context_lens = nullptr;  // [num_seqs] tokens cached before this step
  float* out = nullptr;                   // [num_tokens, out_stride]
};

// Query token i of sequence s (position context_lens[s] + i) attends to positions
// 0..context_lens[s] + i of that sequence, all read from the cache: the new tokens' K/V must
// already be written (WriteKvCache). Work is split into (sequence, KV head, query chunk)
// tasks; each reads a key once for all query heads of its group. A query's result does not
// depend on what else is in the batch (bitwise).
void PagedAttention(const PagedAttentionParams& params);

}  // namespace ferry::kernels::cpu
