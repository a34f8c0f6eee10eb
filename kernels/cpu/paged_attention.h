// Causal grouped-query attention over a paged KV cache, fp32, CPU.
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

struct KvCacheShape {
  int32_t num_blocks = 0;
  int32_t block_size = 0;
  int32_t num_kv_heads = 0;
  int32_t head_dim = 0;
};

// Copies each new token's K and V into its cache slot. slot_mapping[t] < 0 skips token t.
void WriteKvCache(const KvCacheShape& shape,
                  const float* k,               // [num_tokens, num_kv_heads, head_dim]
                  const float* v,               // [num_tokens, num_kv_heads, head_dim]
                  const int32_t* slot_mapping,  // [num_tokens]
                  int64_t num_tokens,
                  float* k_cache,               // [num_blocks, block_size, num_kv_heads, head_dim]
                  float* v_cache);              // [num_blocks, block_size, num_kv_heads, head_dim]

struct PagedAttentionParams {
  KvCacheShape cache;
  int32_t num_seqs = 0;
  int32_t num_heads = 0;           // a multiple of cache.num_kv_heads
  int32_t max_blocks_per_seq = 0;  // row stride of block_tables
  float scale = 1.f;               // usually 1 / sqrt(head_dim)

  const float* q = nullptr;               // [num_tokens, num_heads, head_dim]
  const float* k_cache = nullptr;         // [num_blocks, block_size, num_kv_heads, head_dim]
  const float* v_cache = nullptr;         // [num_blocks, block_size, num_kv_heads, head_dim]
  const int32_t* block_tables = nullptr;  // [num_seqs, max_blocks_per_seq]
  const int32_t* query_start = nullptr;   // [num_seqs + 1], query_start[0] == 0
  const int32_t* context_lens = nullptr;  // [num_seqs] tokens cached before this step
  float* out = nullptr;                   // [num_tokens, num_heads, head_dim]
};

// Query token i of sequence s (position context_lens[s] + i) attends to positions
// 0..context_lens[s] + i of that sequence, all read from the cache: the new tokens' K/V must
// already be written (WriteKvCache). Parallel over (sequence, head) with OpenMP.
void PagedAttention(const PagedAttentionParams& params);

}  // namespace ferry::kernels::cpu
