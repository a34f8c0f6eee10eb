// RMSNorm on the GPU: y = x / sqrt(mean(x^2) + eps) * weight, one row per token.
// Host launcher; the kernel lives in rmsnorm.cu. No CUDA headers here so that
// callers compile with a plain C++ compiler.
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

// Returns 0 on success, else the cudaError_t value of the launch.
int RmsNorm(const RmsNormArgs& args);

}  // namespace ferry::kernels::cuda
