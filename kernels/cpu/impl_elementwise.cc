// Row-wise kernels, compiled once per ISA (FERRY_ISA_NS; see impl.h). Each works on 16-lane
// chunks with a scalar tail, so any size is accepted.
#include <cmath>
#include <cstring>

#include "kernels/cpu/impl.h"
#include "kernels/cpu/vec.h"

#ifndef FERRY_ISA_NS
#error "compile with -DFERRY_ISA_NS=avx2 or avx512"
#endif

namespace ferry::kernels::cpu::FERRY_ISA_NS {
namespace {

// Below this many elements per call the OpenMP fork/join costs more than the loop.
constexpr int64_t kMinParallelElements = 1 << 14;

// Rotates one head in place given the cos/sin of each frequency.
inline void RotateHead(float* head,        // [head_dim]
                       const float* cos_,  // [half]
                       const float* sin_,  // [half]
                       int32_t half) {
  int32_t i = 0;
  for (; i + kLanes <= half; i += kLanes) {
    const V16 a = Load(head + i), b = Load(head + half + i);
    const V16 c = Load(cos_ + i), s = Load(sin_ + i);
    Store(head + i, a * c - b * s);
    Store(head + half + i, b * c + a * s);
  }
  for (; i < half; ++i) {
    const float a = head[i];
    const float b = head[i + half];
    head[i] = a * cos_[i] - b * sin_[i];
    head[i + half] = b * cos_[i] + a * sin_[i];
  }
}

inline float SiluScalar(float g) { return g / (1.f + std::exp(-g)); }

}  // namespace

void RmsNorm(const float* x, const float* weight, float* out, int64_t num_tokens, int64_t hidden,
             float eps) {
#pragma omp parallel for schedule(static) if (num_tokens * hidden >= kMinParallelElements)
  for (int64_t t = 0; t < num_tokens; ++t) {
    const float* row = x + t * hidden;
    float* dst = out + t * hidden;
    V16 acc = Splat(0.f);
    int64_t i = 0;
    for (; i + kLanes <= hidden; i += kLanes) {
      const V16 v = Load(row + i);
      acc += v * v;
    }
    float sum_sq = ReduceAdd(acc);
    for (; i < hidden; ++i) sum_sq += row[i] * row[i];
    const float inv_rms = 1.f / std::sqrt(sum_sq / static_cast<float>(hidden) + eps);
    const V16 inv = Splat(inv_rms);
    for (i = 0; i + kLanes <= hidden; i += kLanes) {
      Store(dst + i, Load(weight + i) * (Load(row + i) * inv));
    }
    for (; i < hidden; ++i) dst[i] = weight[i] * (row[i] * inv_rms);
  }
}

void SiluAndMul(const float* gate_up, float* out, int64_t num_tokens, int64_t intermediate) {
#pragma omp parallel for schedule(static) if (num_tokens * intermediate >= kMinParallelElements)
  for (int64_t t = 0; t < num_tokens; ++t) {
    const float* gate = gate_up + t * 2 * intermediate;
    const float* up = gate + intermediate;
    float* dst = out + t * intermediate;
    int64_t i = 0;
    for (; i + kLanes <= intermediate; i += kLanes) {
      const V16 g = Load(gate + i);
      Store(dst + i, g / (1.f + Exp(-g)) * Load(up + i));
    }
    for (; i < intermediate; ++i) dst[i] = SiluScalar(gate[i]) * up[i];
  }
}

void ApplyRotaryTable(const RotaryParams& p, const float* table, float* q, float* k) {
  const int32_t half = p.head_dim / 2;
#pragma omp parallel for schedule(static) if (p.num_tokens * p.q_stride >= kMinParallelElements)
  for (int64_t t = 0; t < p.num_tokens; ++t) {
    const float* cos_ = table + t * p.head_dim;
    const float* sin_ = cos_ + half;
    for (int32_t h = 0; h < p.num_heads; ++h) {
      RotateHead(q + t * p.q_stride + int64_t{h} * p.head_dim, cos_, sin_, half);
    }
    for (int32_t h = 0; h < p.num_kv_heads; ++h) {
      RotateHead(k + t * p.k_stride + int64_t{h} * p.head_dim, cos_, sin_, half);
    }
  }
}

void ConvertToBf16(const float* x, uint16_t* out, int64_t n) {
  int64_t i = 0;
  for (; i + kLanes <= n; i += kLanes) StoreBf16(out + i, Load(x + i));
  if (i < n) {  // tail through a padded buffer so rounding is the same as the vector path
    float tail[kLanes] = {};
    uint16_t bits[kLanes];
    std::memcpy(tail, x + i, (n - i) * sizeof(float));
    StoreBf16(bits, Load(tail));
    std::memcpy(out + i, bits, (n - i) * sizeof(uint16_t));
  }
}

}  // namespace ferry::kernels::cpu::FERRY_ISA_NS
