#include "kernels/cpu/cpu_kernels.h"

#include <omp.h>

#include <algorithm>
#include <cmath>
#include <vector>

#include "kernels/cpu/impl.h"
#include "kernels/cpu/isa.h"

namespace ferry::kernels::cpu {
namespace {

// Below this many elements per call the OpenMP fork/join costs more than the loop.
constexpr int64_t kMinParallelElements = 1 << 14;
// Activation conversions parallelise above this (a prefill's MLP input is ~2.5M floats).
constexpr int64_t kMinParallelConvert = 1 << 16;

bool UseAvx512() { return ActiveIsa() == Isa::kAvx512; }

RotaryParams Dense(RotaryParams p) {
  if (p.q_stride == 0) p.q_stride = int64_t{p.num_heads} * p.head_dim;
  if (p.k_stride == 0) p.k_stride = int64_t{p.num_kv_heads} * p.head_dim;
  return p;
}

}  // namespace

void RmsNorm(const float* x, const float* weight, float* out, int64_t num_tokens, int64_t hidden,
             float eps) {
  if (UseAvx512()) {
    avx512::RmsNorm(x, weight, out, num_tokens, hidden, eps);
  } else {
    avx2::RmsNorm(x, weight, out, num_tokens, hidden, eps);
  }
}

void RotaryTable(const int32_t* positions, int64_t num_tokens, int32_t head_dim,
                 float rope_theta, float* table) {
  const int32_t half = head_dim / 2;
  float inv_freq[kMaxHeadDim / 2];
  for (int32_t i = 0; i < half; ++i) {
    // Same expression and precision as transformers' default rope init.
    inv_freq[i] = static_cast<float>(
        1.0 / std::pow(static_cast<double>(rope_theta),
                       static_cast<double>(static_cast<float>(2 * i) / head_dim)));
  }
  RotaryTableFromFreqs(positions, num_tokens, head_dim, inv_freq, table);
}

void RotaryTableFromFreqs(const int32_t* positions, int64_t num_tokens, int32_t head_dim, const float* inv_freq,
                          float* table) {
  const int32_t half = head_dim / 2;
#pragma omp parallel for schedule(static) if (num_tokens * half >= kMinParallelElements)
  for (int64_t t = 0; t < num_tokens; ++t) {
    const float pos = static_cast<float>(positions[t]);
    float* cos_ = table + t * head_dim;
    float* sin_ = cos_ + half;
    for (int32_t i = 0; i < half; ++i) {
      const float angle = pos * inv_freq[i];  // fp32 product, as Hugging Face rounds it
      cos_[i] = static_cast<float>(std::cos(static_cast<double>(angle)));
      sin_[i] = static_cast<float>(std::sin(static_cast<double>(angle)));
    }
  }
}

void ApplyRotaryTable(const RotaryParams& params, const float* table, float* q, float* k) {
  const RotaryParams p = Dense(params);
  if (UseAvx512()) {
    avx512::ApplyRotaryTable(p, table, q, k);
  } else {
    avx2::ApplyRotaryTable(p, table, q, k);
  }
}

void ApplyRotary(const RotaryParams& params, const int32_t* positions, float* q, float* k) {
  std::vector<float> table(params.num_tokens * params.head_dim);
  RotaryTable(positions, params.num_tokens, params.head_dim, params.rope_theta, table.data());
  ApplyRotaryTable(params, table.data(), q, k);
}

void SiluAndMul(const float* gate_up, float* out, int64_t num_tokens, int64_t intermediate) {
  if (UseAvx512()) {
    avx512::SiluAndMul(gate_up, out, num_tokens, intermediate);
  } else {
    avx2::SiluAndMul(gate_up, out, num_tokens, intermediate);
  }
}

void Softmax(float* x, int64_t num_rows, int64_t n) {
#pragma omp parallel for schedule(static) if (num_rows * n >= kMinParallelElements)
  for (int64_t r = 0; r < num_rows; ++r) {
    float* row = x + r * n;
    float max_v = row[0];
    for (int64_t i = 1; i < n; ++i) max_v = std::max(max_v, row[i]);
    float sum = 0.f;
    for (int64_t i = 0; i < n; ++i) {
      row[i] = std::exp(row[i] - max_v);
      sum += row[i];
    }
    const float inv = 1.f / sum;
    for (int64_t i = 0; i < n; ++i) row[i] *= inv;
  }
}

void AddInPlace(float* out, const float* x, int64_t n) {
  for (int64_t i = 0; i < n; ++i) out[i] += x[i];
}

void ConvertToBf16(const float* x, uint16_t* out, int64_t n) {
  // Chunks of a multiple of 16 so every element takes the same (vector) rounding path.
  constexpr int64_t kChunk = 1 << 14;
  const int64_t num_chunks = (n + kChunk - 1) / kChunk;
  const bool avx512 = UseAvx512();
#pragma omp parallel for schedule(static) if (n >= kMinParallelConvert)
  for (int64_t c = 0; c < num_chunks; ++c) {
    const int64_t begin = c * kChunk, len = std::min(kChunk, n - begin);
    if (avx512) {
      avx512::ConvertToBf16(x + begin, out + begin, len);
    } else {
      avx2::ConvertToBf16(x + begin, out + begin, len);
    }
  }
}

}  // namespace ferry::kernels::cpu
