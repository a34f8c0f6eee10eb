// RMSNorm on the GPU: y = x / sqrt(mean(x^2) + eps) * weight, one row per token, fp32 math like
// Hugging Face's Qwen2RMSNorm (and kernels/cpu RmsNorm, its reference). Host launchers; the
// kernels live in rmsnorm.cu. No CUDA headers here so that callers compile with a plain C++
// compiler. Launchers return 0 on success, else the cudaError_t value of the launch.
#pragma once

#include <cstdint>

namespace ferry::kernels::cuda {

struct RmsNormArgs {
  const float* input;   // [num_tokens, hidden_size], device memory
  const float* weight;  // [hidden_size], device memory
  float* output;        // [num_tokens, hidden_size], device memory (may alias input)
  int32_t num_tokens;
  int32_t hidden_size;
  float eps;
  void* stream;         // cudaStream_t; nullptr = default stream
};

int RmsNorm(const RmsNormArgs& args);

// The residual add fused with the next norm, as the decoder runs it between blocks:
//   residual[row] += delta[row]            (skipped when delta is null)
//   output[r] = bf16(RmsNorm(residual[row]) * weight)   with row = rows ? rows[r] : r
// The fp32 sum is written back to residual. `rows` (distinct) picks a subset of rows, e.g.
// the final norm of only the tokens whose logits are wanted.
struct AddRmsNormArgs {
  float* residual;        // [>= max row + 1, hidden_size] fp32
  const float* delta;     // [>= max row + 1, hidden_size] fp32, or nullptr
  const float* weight;    // [hidden_size] fp32
  uint16_t* output;       // [num_rows, hidden_size] bf16 bits
  const int32_t* rows;    // [num_rows] or nullptr (row r)
  int32_t num_rows;
  int32_t hidden_size;
  float eps;
  void* stream;
};

int AddRmsNorm(const AddRmsNormArgs& args);

}  // namespace ferry::kernels::cuda
