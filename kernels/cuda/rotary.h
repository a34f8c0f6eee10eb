// Bias add, each head's RMS norm (Qwen3's q_norm / k_norm) and rotary position embedding on the
// fused QKV projection, in place on the GPU.
// Rotate-half form (Hugging Face / GPT-NeoX): element i of the first half of a head pairs with
// element i + head_dim / 2. The cos/sin come from a table indexed by position, the one
// kernels/cpu RotaryTable computes (uploaded once), so both backends rotate by the same values.
// CPU reference: bias add, kernels/cpu RmsNorm over each q and k head (when normed), then
// kernels/cpu ApplyRotaryTable.
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
  // Per-head RMS norm of q and k before the rotation: x / sqrt(mean(x^2) + eps) * weight over
  // each head's head_dim values. Both null: none; both set: both heads normed.
  const float* q_norm = nullptr;  // [head_dim]
  const float* k_norm = nullptr;  // [head_dim]
  float norm_eps = 0.f;
};

// Adds the bias to q, k and v, RMS-normalises each q and k head when the norms are given, then
// rotates q and k. Returns 0 or the cudaError_t (cudaErrorInvalidValue for one norm without the
// other).
int QkvBiasRotary(const QkvRotaryArgs& args);

}  // namespace ferry::kernels::cuda
