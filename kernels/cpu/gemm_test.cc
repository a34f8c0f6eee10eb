// Gemm against a scalar model of the order gemm.h promises (bitwise), against double precision
// (accuracy), and across row counts and row positions (batch invariance, bitwise).
#include "kernels/cpu/gemm.h"

#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <random>
#include <stdexcept>
#include <vector>

namespace ferry::kernels::cpu {
namespace {

std::vector<float> RandomVector(size_t n, uint32_t seed) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> dist(0.f, 1.f);
  std::vector<float> v(n);
  for (float& x : v) x = dist(rng);
  return v;
}

// The kernel's weight argument for `w` (bf16: w must hold bf16 values already).
std::vector<uint16_t> Packed(const std::vector<float>& w, int64_t n, int64_t k) {
  std::vector<uint16_t> packed(PackedBf16Size(n, k));
  PackBf16(w.data(), n, k, packed.data());
  return packed;
}

// The contract of gemm.h, one element at a time in plain scalar code.
float ContractElement(const float* x, const float* w, int64_t k, float bias, float prior,
                      bool accumulate) {
  float lane[8] = {};
  const int64_t k8 = k & ~int64_t{7};
  for (int64_t kk = 0; kk < k8; ++kk) lane[kk % 8] = std::fma(x[kk], w[kk], lane[kk % 8]);
  float v = ((lane[0] + lane[4]) + (lane[2] + lane[6])) + ((lane[1] + lane[5]) + (lane[3] + lane[7]));
  for (int64_t kk = k8; kk < k; ++kk) v = std::fma(x[kk], w[kk], v);
  v += bias;
  return accumulate ? prior + v : v;
}

struct Case {
  int64_t m, n, k;
};

class GemmTest : public testing::TestWithParam<GemmWeight> {};

TEST_P(GemmTest, MatchesTheContractBitwiseAndDoublePrecisionClosely) {
  const bool bf16 = GetParam() == GemmWeight::kBfloat16Packed;
  for (const Case c : {Case{1, 1, 1}, {1, 5, 7}, {2, 4, 8}, {3, 9, 9}, {4, 33, 64}, {7, 100, 100},
                       {50, 70, 896}, {5, 130, 13}}) {
    SCOPED_TRACE(testing::Message() << c.m << "x" << c.n << "x" << c.k);
    for (const bool accumulate : {false, true}) {
      const auto x = RandomVector(c.m * c.k, 1);
      auto w = RandomVector(c.n * c.k, 2);
      if (bf16) RoundToBf16(w.data(), w.data(), w.size());  // the values the kernel multiplies
      const std::vector<uint16_t> packed = bf16 ? Packed(w, c.n, c.k) : std::vector<uint16_t>();
      const auto bias = RandomVector(c.n, 3);
      const auto prior = RandomVector(c.m * c.n, 4);
      std::vector<float> out = prior;
      GemmArgs args;
      args.x = x.data();
      args.weight = bf16 ? static_cast<const void*>(packed.data()) : w.data();
      args.dtype = GetParam();
      args.bias = bias.data();
      args.out = out.data();
      args.m = c.m;
      args.n = c.n;
      args.k = c.k;
      args.accumulate = accumulate;
      Gemm(args);
      for (int64_t r = 0; r < c.m; ++r) {
        for (int64_t j = 0; j < c.n; ++j) {
          const float got = out[r * c.n + j];
          const float want = ContractElement(&x[r * c.k], &w[j * c.k], c.k, bias[j],
                                             prior[r * c.n + j], accumulate);
          ASSERT_EQ(std::memcmp(&got, &want, sizeof(float)), 0)
              << "row " << r << " col " << j << ": " << got << " vs " << want;
          double exact = bias[j] + (accumulate ? prior[r * c.n + j] : 0.0);
          for (int64_t kk = 0; kk < c.k; ++kk) exact += double(x[r * c.k + kk]) * w[j * c.k + kk];
          ASSERT_NEAR(got, exact, 1e-5 * (std::sqrt(double(c.k)) + std::abs(exact)));
        }
      }
    }
  }
}

TEST_P(GemmTest, ARowsResultDoesNotDependOnTheOtherRowsOfTheCall) {
  // Wide enough for the threaded path; rows split at every tile and block boundary.
  const int64_t m = 70, n = 1001, k = 203;
  const bool bf16 = GetParam() == GemmWeight::kBfloat16Packed;
  const auto x = RandomVector(m * k, 5);
  const auto w = RandomVector(n * k, 6);
  const std::vector<uint16_t> packed = Packed(w, n, k);
  const auto bias = RandomVector(n, 7);
  auto run = [&](int64_t first_row, int64_t rows) {
    std::vector<float> out(rows * n);
    GemmArgs args;
    args.x = x.data() + first_row * k;
    args.weight = bf16 ? static_cast<const void*>(packed.data()) : w.data();
    args.dtype = GetParam();
    args.bias = bias.data();
    args.out = out.data();
    args.m = rows;
    args.n = n;
    args.k = k;
    Gemm(args);
    return out;
  };
  const auto all = run(0, m);
  for (const auto [first, rows] : {std::pair<int64_t, int64_t>{0, 1}, {1, 1}, {2, 2}, {5, 3},
                                   {10, 17}, {37, 33}, {69, 1}}) {
    const auto part = run(first, rows);
    ASSERT_EQ(std::memcmp(part.data(), all.data() + first * n, part.size() * sizeof(float)), 0)
        << "rows " << first << ".." << first + rows - 1;
  }
}

INSTANTIATE_TEST_SUITE_P(Weights, GemmTest,
                         testing::Values(GemmWeight::kFloat32, GemmWeight::kBfloat16Packed),
                         [](const auto& info) {
                           return info.param == GemmWeight::kFloat32 ? "Float32" : "Bfloat16";
                         });

TEST(GemmArgsTest, RejectsNegativeSizesAndNullPointers) {
  GemmArgs args;
  args.m = -1;
  EXPECT_THROW(Gemm(args), std::invalid_argument);
  args.m = 1;
  args.n = 1;
  args.k = 1;
  EXPECT_THROW(Gemm(args), std::invalid_argument);  // null pointers
  args.m = 0;
  EXPECT_NO_THROW(Gemm(args));  // nothing to compute
}

TEST(GemmArgsTest, RoundToBf16RoundsToNearestEven) {
  const float in[] = {1.0f, 1.00390625f /* halfway: stays 1 */, 1.01171875f /* halfway: up */,
                      -2.5f, NAN};
  float out[5];
  RoundToBf16(in, out, 5);
  EXPECT_EQ(out[0], 1.0f);
  EXPECT_EQ(out[1], 1.0f);
  EXPECT_EQ(out[2], 1.015625f);
  EXPECT_EQ(out[3], -2.5f);
  EXPECT_TRUE(std::isnan(out[4]));
}

}  // namespace
}  // namespace ferry::kernels::cpu
