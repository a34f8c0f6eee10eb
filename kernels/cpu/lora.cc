#include "kernels/cpu/lora.h"

#include <stdexcept>
#include <string>

namespace ferry::kernels::cpu {
namespace {

constexpr int kLanes = 16;

// sum_i x[i] * a[i] in a fixed order: 16 independent lanes (vectorised), then the lanes and
// the tail in index order.
float Dot(const float* x, const float* a, int64_t k) {
  float lanes[kLanes] = {};
  int64_t i = 0;
  for (; i + kLanes <= k; i += kLanes) {
    for (int l = 0; l < kLanes; ++l) lanes[l] += x[i + l] * a[i + l];
  }
  float sum = 0.f;
  for (int l = 0; l < kLanes; ++l) sum += lanes[l];
  for (; i < k; ++i) sum += x[i] * a[i];
  return sum;
}

}  // namespace

void LoraShrinkExpand(const LoraWeights& w, const float* x, int64_t x_stride, float* out, int64_t out_stride,
                      const int32_t* rows, int64_t num_rows) {
  if (w.rank <= 0 || w.rank > kMaxLoraRank) {
    throw std::invalid_argument("LoraShrinkExpand: rank " + std::to_string(w.rank) + " outside 1.." +
                                std::to_string(kMaxLoraRank));
  }
#pragma omp parallel for schedule(static) if (num_rows * (w.k + w.n) * w.rank > (1 << 16))
  for (int64_t i = 0; i < num_rows; ++i) {
    const int64_t r = rows[i];
    const float* xr = x + r * x_stride;
    float* yr = out + r * out_stride;
    float shrunk[kMaxLoraRank];
    for (int32_t j = 0; j < w.rank; ++j) shrunk[j] = w.scale * Dot(xr, w.a + j * w.k, w.k);
    // The expand, one rank column at a time in index order: each output element's sum has the
    // same order whatever the rows.
    for (int32_t j = 0; j < w.rank; ++j) {
      const float s = shrunk[j];
      const float* bj = w.b_t + j * w.n;
      for (int64_t c = 0; c < w.n; ++c) yr[c] += s * bj[c];
    }
  }
}

}  // namespace ferry::kernels::cpu
