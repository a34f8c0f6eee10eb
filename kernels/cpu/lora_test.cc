// LoraShrinkExpand against a double-precision reference, and a row's result independent of the
// rows sharing its call.
#include "kernels/cpu/lora.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <stdexcept>
#include <tuple>
#include <random>
#include <vector>

namespace ferry::kernels::cpu {
namespace {

std::vector<float> Random(size_t n, std::mt19937& rng) {
  std::uniform_real_distribution<float> u(-1.f, 1.f);
  std::vector<float> v(n);
  for (float& x : v) x = u(rng);
  return v;
}

TEST(LoraKernel, MatchesADoubleReferenceOnTheRowsNamed) {
  std::mt19937 rng(3);
  for (const auto& [rank, k, n] : {std::tuple{1, 7, 5}, std::tuple{16, 896, 128}, std::tuple{8, 33, 4864}}) {
    const auto a = Random(static_cast<size_t>(rank) * k, rng), b_t = Random(static_cast<size_t>(rank) * n, rng);
    const int64_t rows = 9, x_stride = k + 3, out_stride = n + 5;
    const auto x = Random(static_cast<size_t>(rows * x_stride), rng);
    const auto base = Random(static_cast<size_t>(rows * out_stride), rng);
    std::vector<float> out = base;
    const std::vector<int32_t> which = {0, 2, 3, 8};
    const LoraWeights w{a.data(), b_t.data(), rank, k, n, 0.75f};
    LoraShrinkExpand(w, x.data(), x_stride, out.data(), out_stride, which.data(), 4);
    for (int64_t r = 0; r < rows; ++r) {
      const bool named = std::find(which.begin(), which.end(), r) != which.end();
      for (int64_t c = 0; c < out_stride; ++c) {
        double want = base[r * out_stride + c];
        if (named && c < n) {
          for (int32_t j = 0; j < rank; ++j) {
            double s = 0;
            for (int64_t i = 0; i < k; ++i) s += double(x[r * x_stride + i]) * a[j * k + i];
            want += 0.75 * s * b_t[j * n + c];
          }
        }
        ASSERT_NEAR(out[r * out_stride + c], want, 1e-4 * (1 + std::abs(want))) << rank << " row " << r << " col " << c;
      }
    }
  }
}

TEST(LoraKernel, ARowsResultDoesNotDependOnItsCompany) {
  std::mt19937 rng(5);
  const int32_t rank = 16;
  const int64_t k = 896, n = 896, rows = 64;
  const auto a = Random(rank * k, rng), b_t = Random(rank * n, rng), x = Random(rows * k, rng);
  const LoraWeights w{a.data(), b_t.data(), rank, k, n, 2.f};
  std::vector<int32_t> all(rows);
  for (int32_t r = 0; r < rows; ++r) all[r] = r;
  std::vector<float> together(rows * n, 0.f);
  LoraShrinkExpand(w, x.data(), k, together.data(), n, all.data(), rows);
  for (int32_t r : {0, 17, 63}) {
    std::vector<float> alone(rows * n, 0.f);
    LoraShrinkExpand(w, x.data(), k, alone.data(), n, &r, 1);
    for (int64_t c = 0; c < n; ++c) ASSERT_EQ(alone[r * n + c], together[r * n + c]) << r << " " << c;
  }
}

TEST(LoraKernel, RefusesARankOutsideItsBound) {
  const LoraWeights w{nullptr, nullptr, kMaxLoraRank + 1, 1, 1, 1.f};
  EXPECT_THROW(LoraShrinkExpand(w, nullptr, 1, nullptr, 1, nullptr, 0), std::invalid_argument);
}

}  // namespace
}  // namespace ferry::kernels::cpu
