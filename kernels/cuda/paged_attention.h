// Grouped-query attention over the paged bf16 KV cache on the GPU; fp32 math, bf16 output
// (the input of the o_proj GEMM). Cache layout per layer (as kernels/cpu/paged_attention.h, the
// reference): [num_blocks, block_size, num_kv_heads, head_dim]; position p of a sequence is in
// block block_tables[s][p / block_size] at offset p % block_size. Query head h reads KV head
// h / (num_heads / num_kv_heads). New tokens' K/V must already be in the cache (WriteKvCache).
//
// Two launchers, each with two kernels selected by the args' `impl` (the newer one the
// default; the first ones stay selectable until a device run has measured both, see
// worker/gpu/attention_impl.h and FERRY_ATTENTION_IMPL):
//  - DecodeAttention: one query per sequence (decode, or a 1-token chunk). Flash-decoding: a
//    block per (KV head, sequence, split) covers one slice of the context for all query heads
//    of its group, reading each key once in 16-byte loads; with num_splits > 1 the partial
//    softmax results (max, sum, unnormalised output) are merged by a second kernel.
//    kBaseline loads a chunk's K, computes its scores, then loads its V; kPrefetch requests a
//    chunk's K and V together (cp.async into shared memory) and the next chunk's before
//    computing on the current one. Same math, same results up to fp32 summation order.
//  - PrefillAttention: any number of queries per sequence, causal, variable lengths in one
//    launch. The caller lists query tiles (sequence, first query) of kPrefillQueryTile queries.
//    kSimt: one fp32 thread per (query, head) on CUDA cores. kTensorCore: FlashAttention-2-style
//    bf16 mma (prefill_attention_tc.cu); q is rounded to bf16 and so are the probabilities
//    before P V (sums and the softmax in fp32), so it matches the fp32 kernel to about bf16
//    precision, not bit for bit; it needs out 4-byte aligned and out_stride even.
//
// Head sizes compiled: 16 (the tiny test model) and 64 (Qwen2.5-0.5B); group sizes up to 8.
#pragma once

#include <cstdint>

namespace ferry::kernels::cuda {

constexpr int32_t kMaxAttentionGroup = 8;      // query heads per KV head
constexpr int32_t kMaxDecodeSplits = 32;       // context slices per sequence
constexpr int32_t kPrefillQueryTile = 16;      // queries per prefill block

enum class DecodeImpl : int32_t { kPrefetch = 0, kBaseline = 1 };
enum class PrefillImpl : int32_t { kTensorCore = 0, kSimt = 1 };

// Whether the attention kernels are compiled for this geometry.
bool AttentionSupported(int32_t head_dim, int32_t num_heads, int32_t num_kv_heads);

struct DecodeAttentionArgs {
  const float* q;               // [num_seqs, q_stride]: sequence s's query is row s
  const uint16_t* k_cache;      // [num_blocks, block_size, num_kv_heads, head_dim] bf16
  const uint16_t* v_cache;      // [num_blocks, block_size, num_kv_heads, head_dim] bf16
  const int32_t* block_tables;  // [num_seqs, max_blocks_per_seq]
  const int32_t* seq_lens;      // [num_seqs] keys visible, the query's own included; 0: padding
  uint16_t* out;                // [num_seqs, out_stride] bf16 (zeros for padding rows)
  // Split scratch, used when num_splits > 1 (DecodeWorkspaceFloats floats).
  float* workspace;
  int32_t num_seqs;
  int32_t num_heads;
  int32_t num_kv_heads;
  int32_t head_dim;
  int32_t block_size;
  int32_t max_blocks_per_seq;
  int32_t num_splits;           // [1, kMaxDecodeSplits]; fixed per CUDA graph
  int64_t q_stride;             // floats
  int64_t out_stride;           // elements
  float scale;                  // usually 1 / sqrt(head_dim)
  void* stream;
  DecodeImpl impl = DecodeImpl::kPrefetch;
};

// Splits that keep every SM busy for a batch: more for few sequences, 1 for large batches.
int32_t ChooseDecodeSplits(int32_t num_seqs, int32_t num_kv_heads, int32_t num_sms, int32_t max_seq_len);
// Floats of DecodeAttentionArgs.workspace for these sizes.
int64_t DecodeWorkspaceFloats(int32_t num_seqs, int32_t num_heads, int32_t head_dim, int32_t num_splits);

int DecodeAttention(const DecodeAttentionArgs& args);

struct PrefillAttentionArgs {
  const float* q;               // [num_tokens, q_stride]
  const uint16_t* k_cache;      // [num_blocks, block_size, num_kv_heads, head_dim] bf16
  const uint16_t* v_cache;      // [num_blocks, block_size, num_kv_heads, head_dim] bf16
  const int32_t* block_tables;  // [num_seqs, max_blocks_per_seq]
  const int32_t* query_start;   // [num_seqs + 1] token rows of each sequence's queries
  const int32_t* context_lens;  // [num_seqs] tokens cached before this step
  const int32_t* tile_seq;      // [num_tiles] sequence of each tile
  const int32_t* tile_query;    // [num_tiles] first query (within its sequence) of each tile
  uint16_t* out;                // [num_tokens, out_stride] bf16
  int32_t num_tiles;
  int32_t num_heads;
  int32_t num_kv_heads;
  int32_t head_dim;
  int32_t block_size;
  int32_t max_blocks_per_seq;
  int64_t q_stride;
  int64_t out_stride;
  float scale;
  void* stream;
  PrefillImpl impl = PrefillImpl::kTensorCore;
};

// Query i of sequence s (position context_lens[s] + i) attends to positions
// 0..context_lens[s] + i.
int PrefillAttention(const PrefillAttentionArgs& args);

}  // namespace ferry::kernels::cuda
