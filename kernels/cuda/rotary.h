// Bias add and rotary position embedding on the fused QKV projection, in place on the GPU.
// Rotate-half form (Hugging Face / GPT-NeoX): element i of the first half of a head pairs with
// element i + head_dim / 2. The cos/sin come from a table indexed by position, the one
// kernels/cpu RotaryTable computes (uploaded once), so both backends rotate by the same values.
// CPU reference: bias add, then kernels/cpu ApplyRotaryTable.
#pragma once

#include <cstdint>

namespace ferry::kernels::cuda {

struct QkvRotaryArgs {
  float* qkv;                // [num_tokens, qkv_stride]: num_heads q heads, num_kv_heads k heads,
                             //   num_kv_heads v heads, each head_dim wide
  const float* bias;         // [(num_heads + 2 * num_kv_heads) * head_dim], or nullptr
  const float* cos_sin;      // [max_position, head_dim]: cos(angle_0..half-1), sin(...)
  const int32_t* positions;  // [num_tokens], each in [0, max_position)
  int32_t num_tokens;
  int32_t num_heads;
  int32_t num_kv_heads;
  int32_t head_dim;          // even
  int64_t qkv_stride;        // floats between tokens, >= (num_heads + 2 * num_kv_heads) * head_dim
  void* stream;
};

// Adds the bias to q, k and v, then rotates q and k. Returns 0 or the cudaError_t.
int QkvBiasRotary(const QkvRotaryArgs& args);

}  // namespace ferry::kernels::cuda
