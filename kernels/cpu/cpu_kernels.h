// Element-wise and row-wise fp32 kernels for the CPU engine. The hot ones are vectorised for
// AVX2 and AVX-512 and dispatched at run time (isa.h); rows are split across OpenMP threads
// where there is enough work to pay for it.
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
  // Floats between consecutive tokens' rows; 0 means dense (heads * head_dim). Lets q and k be
  // column ranges of one fused QKV projection.
  int64_t q_stride = 0;
  int64_t k_stride = 0;
};
void ApplyRotary(const RotaryParams& params,
                 const int32_t* positions,  // [num_tokens]
                 float* q,                  // [num_tokens, q_stride] (num_heads * head_dim used)
                 float* k);                 // [num_tokens, k_stride] (num_kv_heads * head_dim used)

// The cos/sin ApplyRotary uses, computed once per step and shared by every layer:
// table[t] = cos(angle_0..half-1), sin(angle_0..half-1).
void RotaryTable(const int32_t* positions,  // [num_tokens]
                 int64_t num_tokens, int32_t head_dim, float rope_theta,
                 float* table);             // [num_tokens, head_dim]
// The same from given inverse frequencies (a scaled rotary embedding, e.g. Llama 3's).
void RotaryTableFromFreqs(const int32_t* positions,  // [num_tokens]
                          int64_t num_tokens, int32_t head_dim,
                          const float* inv_freq,     // [head_dim / 2]
                          float* table);             // [num_tokens, head_dim]
void ApplyRotaryTable(const RotaryParams& params,
                      const float* table,  // [num_tokens, head_dim] from RotaryTable
                      float* q,            // [num_tokens, q_stride]
                      float* k);           // [num_tokens, k_stride]

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

// fp32 -> bf16 bits, round to nearest even (activations feeding a bf16 matmul).
void ConvertToBf16(const float* x,  // [n]
                   uint16_t* out,   // [n]
                   int64_t n);

}  // namespace ferry::kernels::cpu
