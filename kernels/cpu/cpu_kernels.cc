#include "kernels/cpu/cpu_kernels.h"

#include <algorithm>
#include <cmath>
#include <vector>

namespace ferry::kernels::cpu {
namespace {

// Below this many elements per call the OpenMP fork/join costs more than the loop.
constexpr int64_t kMinParallelElements = 1 << 14;

}  // namespace

void RmsNorm(const float* x, const float* weight, float* out, int64_t num_tokens, int64_t hidden,
             float eps) {
#pragma omp parallel for schedule(static) if (num_tokens * hidden >= kMinParallelElements)
  for (int64_t t = 0; t < num_tokens; ++t) {
    const float* row = x + t * hidden;
    float* dst = out + t * hidden;
    float sum_sq = 0.f;
    for (int64_t i = 0; i < hidden; ++i) sum_sq += row[i] * row[i];
    const float inv_rms = 1.f / std::sqrt(sum_sq / static_cast<float>(hidden) + eps);
    for (int64_t i = 0; i < hidden; ++i) dst[i] = weight[i] * (row[i] * inv_rms);
  }
}

namespace {

// Rotates one head in place given the cos/sin of each frequency.
inline void RotateHead(float* head,        // [head_dim]
                       const float* cos_,  // [head_dim / 2]
                       const float* sin_,  // [head_dim / 2]
                       int32_t half) {
  for (int32_t i = 0; i < half; ++i) {
    const float a = head[i];
    const float b = head[i + half];
    head[i] = a * cos_[i] - b * sin_[i];
    head[i + half] = b * cos_[i] + a * sin_[i];
  }
}

}  // namespace

void ApplyRotary(const RotaryParams& p, const int32_t* positions, float* q, float* k) {
  const int32_t half = p.head_dim / 2;
  std::vector<float> inv_freq(half);
  for (int32_t i = 0; i < half; ++i) {
    // Same expression and precision as transformers' default rope init.
    inv_freq[i] = static_cast<float>(
        1.0 / std::pow(static_cast<double>(p.rope_theta),
                       static_cast<double>(static_cast<float>(2 * i) / p.head_dim)));
  }
  const int64_t q_stride = int64_t{p.num_heads} * p.head_dim;
  const int64_t k_stride = int64_t{p.num_kv_heads} * p.head_dim;
#pragma omp parallel for schedule(static) if (p.num_tokens * q_stride >= kMinParallelElements)
  for (int64_t t = 0; t < p.num_tokens; ++t) {
    float cos_[kMaxHeadDim / 2];
    float sin_[kMaxHeadDim / 2];
    const float pos = static_cast<float>(positions[t]);
    for (int32_t i = 0; i < half; ++i) {
      const float angle = pos * inv_freq[i];
      cos_[i] = static_cast<float>(std::cos(static_cast<double>(angle)));
      sin_[i] = static_cast<float>(std::sin(static_cast<double>(angle)));
    }
    for (int32_t h = 0; h < p.num_heads; ++h) {
      RotateHead(q + t * q_stride + h * p.head_dim, cos_, sin_, half);
    }
    for (int32_t h = 0; h < p.num_kv_heads; ++h) {
      RotateHead(k + t * k_stride + h * p.head_dim, cos_, sin_, half);
    }
  }
}

void SiluAndMul(const float* gate_up, float* out, int64_t num_tokens, int64_t intermediate) {
#pragma omp parallel for schedule(static) if (num_tokens * intermediate >= kMinParallelElements)
  for (int64_t t = 0; t < num_tokens; ++t) {
    const float* gate = gate_up + t * 2 * intermediate;
    const float* up = gate + intermediate;
    float* dst = out + t * intermediate;
    for (int64_t i = 0; i < intermediate; ++i) {
      const float g = gate[i];
      dst[i] = g / (1.f + std::exp(-g)) * up[i];
    }
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

}  // namespace ferry::kernels::cpu
