// LoraShrinkExpand against a double-precision reference, and a row's result independent of the
// rows sharing its call.
#include "kernels/cpu/lora.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
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

LoraWeights Fp32(const std::vector<float>& a, const std::vector<float>& b_t, int32_t rank, int64_t k, int64_t n,
                 float scale) {
  LoraWeights w;
  w.a = a.data();
  w.b_t = b_t.data();
  w.rank = rank;
  w.k = k;
  w.n = n;
  w.scale = scale;
  return w;
}

uint16_t ToBf16(float v) {  // truncation: the test only needs values bf16 holds exactly
  uint32_t bits;
  std::memcpy(&bits, &v, 4);
  return static_cast<uint16_t>(bits >> 16);
}
float FromBf16(uint16_t b) {
  const uint32_t bits = uint32_t{b} << 16;
  float v;
  std::memcpy(&v, &bits, 4);
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
    const LoraWeights w = Fp32(a, b_t, rank, k, n, 0.75f);
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
  const LoraWeights w = Fp32(a, b_t, rank, k, n, 2.f);
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

// bf16 weights compute exactly what the same values in fp32 compute, alone or in company.
TEST(LoraKernel, Bf16WeightsGiveTheFp32ResultOfTheSameValues) {
  std::mt19937 rng(9);
  const int32_t rank = 8;
  const int64_t k = 100, n = 37, rows = 11;  // widths off the 16 lanes: the tails run too
  std::vector<uint16_t> a16(rank * k), b16(rank * n);
  std::vector<float> a(rank * k), b_t(rank * n);
  const auto ra = Random(a.size(), rng), rb = Random(b_t.size(), rng);
  for (size_t i = 0; i < a.size(); ++i) a[i] = FromBf16(a16[i] = ToBf16(ra[i]));
  for (size_t i = 0; i < b_t.size(); ++i) b_t[i] = FromBf16(b16[i] = ToBf16(rb[i]));
  const auto x = Random(rows * k, rng);
  std::vector<int32_t> all(rows);
  for (int32_t r = 0; r < rows; ++r) all[r] = r;
  std::vector<float> want(rows * n, 0.f), got(rows * n, 0.f), one(rows * n, 0.f);
  LoraShrinkExpand(Fp32(a, b_t, rank, k, n, 0.5f), x.data(), k, want.data(), n, all.data(), rows);
  LoraWeights w = Fp32(a, b_t, rank, k, n, 0.5f);
  w.a = w.b_t = nullptr;
  w.a_bf16 = a16.data();
  w.b_t_bf16 = b16.data();
  LoraShrinkExpand(w, x.data(), k, got.data(), n, all.data(), rows);
  EXPECT_EQ(got, want);
  const int32_t last = rows - 1;  // the block of 11 rows ends with a block of 3
  LoraShrinkExpand(w, x.data(), k, one.data(), n, &last, 1);
  for (int64_t c = 0; c < n; ++c) ASSERT_EQ(one[last * n + c], want[last * n + c]);
}

TEST(LoraKernel, RefusesARankOutsideItsBound) {
  LoraWeights w;
  w.rank = kMaxLoraRank + 1;
  EXPECT_THROW(LoraShrinkExpand(w, nullptr, 1, nullptr, 1, nullptr, 0), std::invalid_argument);
}

}  // namespace
}  // namespace ferry::kernels::cpu
