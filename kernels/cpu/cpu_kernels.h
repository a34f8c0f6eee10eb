// Element-wise and row-wise fp32 kernels for the CPU engine. Plain C++ loops the compiler
// vectorises (this folder builds with -O3 -mavx2 -mfma -mf16c); rows are split across OpenMP
// threads where there is enough work to pay for it.
#pragma once

#include <cstdint>

namespace ferry::kernels::cpu {

// Largest head_dim the kernels accept (they keep per-head scratch on the stack).
constexpr int32_t kMaxHeadDim = 1024;

// out = x / sqrt(mean(x^2) + eps) * weight, per row, in fp32 like Hugging Face's Qwen2RMSNorm.
// out may alias x.
void RmsNorm(const float* x,       // [num_tokens, hidden]
             const float* weight,  // [hidden]
             float* out,           // [num_tokens, hidden]
             int64_t num_tokens, int64_t hidden, float eps);

// Rotary position embedding, rotate-half form (Hugging Face / GPT-NeoX layout): element i of
// the first half pairs with element i + head_dim/2. Applied in place to q and k.
// inv_freq[i] = rope_theta^(-2i/head_dim); the angle is position * inv_freq computed in fp32
// as Hugging Face does, so long positions round the same way.
struct RotaryParams {
  int64_t num_tokens = 0;
  int32_t num_heads = 0;
  int32_t num_kv_heads = 0;
  int32_t head_dim = 0;  // even, <= kMaxHeadDim
  float rope_theta = 10000.f;
};
void ApplyRotary(const RotaryParams& params,
                 const int32_t* positions,  // [num_tokens]
                 float* q,                  // [num_tokens, num_heads, head_dim]
                 float* k);                 // [num_tokens, num_kv_heads, head_dim]

// out = silu(gate) * up, with gate and up the two halves of each input row (one fused GEMM
// produces both).
void SiluAndMul(const float* gate_up,  // [num_tokens, 2 * intermediate]
                float* out,            // [num_tokens, intermediate]
                int64_t num_tokens, int64_t intermediate);

// Numerically stable softmax of each row, in place.
void Softmax(float* x,  // [num_rows, n]
             int64_t num_rows, int64_t n);

// out[i, :] += x[i, :] — the residual add when a GEMM could not accumulate in place.
void AddInPlace(float* out, const float* x, int64_t n);

}  // namespace ferry::kernels::cpu
