// Writes each new token's K and V (fp32, e.g. column ranges of the fused QKV output) into the
// paged bf16 cache, rounding to nearest even. Cache layout per layer, as kernels/cpu
// (paged_attention.h), its reference: [num_blocks, block_size, num_kv_heads, head_dim]; token t
// goes to slot slot_mapping[t] = block * block_size + offset; a negative slot skips the token
// (padding rows of a CUDA-graph batch).
#pragma once

#include <cstdint>

namespace ferry::kernels::cuda {

struct WriteKvCacheArgs {
  const float* k;               // [num_tokens, src_stride] (num_kv_heads * head_dim used)
  const float* v;               // [num_tokens, src_stride]
  const int32_t* slot_mapping;  // [num_tokens]
  uint16_t* k_cache;            // [num_blocks, block_size, num_kv_heads, head_dim] bf16 bits
  uint16_t* v_cache;            // [num_blocks, block_size, num_kv_heads, head_dim] bf16 bits
  int32_t num_tokens;
  int32_t num_kv_heads;
  int32_t head_dim;             // a multiple of 8 (16-byte stores)
  int64_t src_stride;           // floats between tokens; a multiple of 4; k and v 16-byte aligned
  void* stream;
};

int WriteKvCache(const WriteKvCacheArgs& args);

}  // namespace ferry::kernels::cuda
