// Element-wise kernels against naive double-precision references, every element checked.
#include "kernels/cpu/cpu_kernels.h"

#include <gtest/gtest.h>

#include <cstring>

#include "kernels/cpu/isa.h"

#include <cmath>
#include <random>
#include <vector>

namespace ferry::kernels::cpu {
namespace {

std::vector<float> RandomVector(size_t n, uint32_t seed, float scale = 1.f) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> dist(0.f, scale);
  std::vector<float> v(n);
  for (float& x : v) x = dist(rng);
  return v;
}

void ExpectNear(const std::vector<float>& got, const std::vector<double>& want, double tol) {
  ASSERT_EQ(got.size(), want.size());
  for (size_t i = 0; i < got.size(); ++i) {
    ASSERT_NEAR(got[i], want[i], tol * (1.0 + std::abs(want[i]))) << "element " << i;
  }
}

TEST(CpuKernelsTest, RmsNormMatchesReference) {
  for (auto [tokens, hidden] : {std::pair{1, 8}, {3, 64}, {17, 896}, {300, 128}}) {
    SCOPED_TRACE(testing::Message() << tokens << "x" << hidden);
    const auto x = RandomVector(size_t(tokens) * hidden, 1, 3.f);
    const auto w = RandomVector(hidden, 2);
    std::vector<float> out(x.size());
    RmsNorm(x.data(), w.data(), out.data(), tokens, hidden, 1e-6f);
    std::vector<double> want(x.size());
    for (int t = 0; t < tokens; ++t) {
      double ss = 0;
      for (int i = 0; i < hidden; ++i) ss += double(x[t * hidden + i]) * x[t * hidden + i];
      const double inv = 1.0 / std::sqrt(ss / hidden + 1e-6);
      for (int i = 0; i < hidden; ++i) want[t * hidden + i] = w[i] * x[t * hidden + i] * inv;
    }
    ExpectNear(out, want, 1e-5);
    // In place gives the same result.
    auto in_place = x;
    RmsNorm(in_place.data(), w.data(), in_place.data(), tokens, hidden, 1e-6f);
    EXPECT_EQ(in_place, out);
  }
}

// Reference rotate-half RoPE for one head vector, in double.
void ReferenceRotate(const float* in, double* out, int head_dim, int pos, double theta) {
  const int half = head_dim / 2;
  for (int i = 0; i < half; ++i) {
    const double inv_freq = 1.0 / std::pow(theta, 2.0 * i / head_dim);
    const double c = std::cos(pos * inv_freq), s = std::sin(pos * inv_freq);
    out[i] = in[i] * c - in[i + half] * s;
    out[i + half] = in[i + half] * c + in[i] * s;
  }
}

TEST(CpuKernelsTest, RotaryMatchesReference) {
  struct Case { int tokens, heads, kv_heads, head_dim; float theta; };
  for (const Case& c : {Case{1, 1, 1, 8, 10000.f}, Case{5, 4, 2, 16, 10000.f},
                        Case{33, 14, 2, 64, 1e6f}, Case{7, 8, 8, 128, 500000.f}}) {
    SCOPED_TRACE(testing::Message() << c.tokens << " tokens, head_dim " << c.head_dim);
    auto q = RandomVector(size_t(c.tokens) * c.heads * c.head_dim, 3);
    auto k = RandomVector(size_t(c.tokens) * c.kv_heads * c.head_dim, 4);
    std::vector<int32_t> positions(c.tokens);
    for (int t = 0; t < c.tokens; ++t) positions[t] = (t * 37) % 200;  // arbitrary, unsorted
    std::vector<double> want_q(q.size()), want_k(k.size());
    for (int t = 0; t < c.tokens; ++t) {
      for (int h = 0; h < c.heads; ++h) {
        const size_t off = (size_t(t) * c.heads + h) * c.head_dim;
        ReferenceRotate(&q[off], &want_q[off], c.head_dim, positions[t], c.theta);
      }
      for (int h = 0; h < c.kv_heads; ++h) {
        const size_t off = (size_t(t) * c.kv_heads + h) * c.head_dim;
        ReferenceRotate(&k[off], &want_k[off], c.head_dim, positions[t], c.theta);
      }
    }
    RotaryParams params{c.tokens, c.heads, c.kv_heads, c.head_dim, c.theta};
    ApplyRotary(params, positions.data(), q.data(), k.data());
    // The kernel rounds position * inv_freq to fp32 like Hugging Face; at positions < 200
    // that moves the angle by < 2e-5.
    ExpectNear(q, want_q, 1e-4);
    ExpectNear(k, want_k, 1e-4);
  }
}

TEST(CpuKernelsTest, SiluAndMulMatchesReference) {
  for (auto [tokens, inter] : {std::pair{1, 4}, {9, 128}, {40, 4864}}) {
    const auto gu = RandomVector(size_t(tokens) * 2 * inter, 5, 4.f);
    std::vector<float> out(size_t(tokens) * inter);
    SiluAndMul(gu.data(), out.data(), tokens, inter);
    std::vector<double> want(out.size());
    for (int t = 0; t < tokens; ++t) {
      for (int i = 0; i < inter; ++i) {
        const double g = gu[size_t(t) * 2 * inter + i], u = gu[size_t(t) * 2 * inter + inter + i];
        want[size_t(t) * inter + i] = g / (1.0 + std::exp(-g)) * u;
      }
    }
    ExpectNear(out, want, 1e-5);
  }
}

TEST(CpuKernelsTest, SoftmaxMatchesReference) {
  for (auto [rows, n] : {std::pair{1, 1}, {3, 17}, {64, 2048}}) {
    auto x = RandomVector(size_t(rows) * n, 6, 10.f);
    std::vector<double> want(x.size());
    for (int r = 0; r < rows; ++r) {
      double mx = -1e300, sum = 0;
      for (int i = 0; i < n; ++i) mx = std::max(mx, double(x[size_t(r) * n + i]));
      for (int i = 0; i < n; ++i) sum += std::exp(x[size_t(r) * n + i] - mx);
      for (int i = 0; i < n; ++i) want[size_t(r) * n + i] = std::exp(x[size_t(r) * n + i] - mx) / sum;
    }
    Softmax(x.data(), rows, n);
    ExpectNear(x, want, 1e-5);
  }
}

TEST(CpuKernelsTest, AddInPlaceAdds) {
  std::vector<float> a{1, 2, 3}, b{0.5f, -2, 10};
  AddInPlace(a.data(), b.data(), 3);
  EXPECT_EQ(a, (std::vector<float>{1.5f, 0, 13}));
}

// Every vectorised kernel, on each ISA copy, against the naive references above; the two
// copies also agree with each other to rounding.
class BothIsasTest : public ::testing::TestWithParam<Isa> {
 protected:
  void SetUp() override { SetIsaForTesting(GetParam()); }
  void TearDown() override { SetIsaForTesting(Isa::kAvx512); }
};

TEST_P(BothIsasTest, SiluAndMulOddSizesAndLargeInputs) {
  for (auto [tokens, inter] : {std::pair{1, 3}, {2, 17}, {5, 100}}) {
    auto gu = RandomVector(size_t(tokens) * 2 * inter, 8, 30.f);  // exp clamps at |g| > 87
    std::vector<float> out(size_t(tokens) * inter);
    SiluAndMul(gu.data(), out.data(), tokens, inter);
    std::vector<double> want(out.size());
    for (int t = 0; t < tokens; ++t) {
      for (int i = 0; i < inter; ++i) {
        const double g = gu[size_t(t) * 2 * inter + i], u = gu[size_t(t) * 2 * inter + inter + i];
        want[size_t(t) * inter + i] = g / (1.0 + std::exp(-g)) * u;
      }
    }
    ExpectNear(out, want, 1e-5);
  }
}

TEST_P(BothIsasTest, RmsNormOddHidden) {
  const int tokens = 3, hidden = 37;
  const auto x = RandomVector(size_t(tokens) * hidden, 9, 2.f);
  const auto w = RandomVector(hidden, 10);
  std::vector<float> out(x.size());
  RmsNorm(x.data(), w.data(), out.data(), tokens, hidden, 1e-6f);
  std::vector<double> want(x.size());
  for (int t = 0; t < tokens; ++t) {
    double ss = 0;
    for (int i = 0; i < hidden; ++i) ss += double(x[t * hidden + i]) * x[t * hidden + i];
    for (int i = 0; i < hidden; ++i) {
      want[t * hidden + i] = w[i] * x[t * hidden + i] / std::sqrt(ss / hidden + 1e-6);
    }
  }
  ExpectNear(out, want, 1e-5);
}

// The table form with strided q/k (a fused QKV row) equals ApplyRotary on dense copies.
TEST_P(BothIsasTest, RotaryTableOnStridedRows) {
  const int tokens = 6, heads = 4, kv_heads = 2, dim = 64;
  const int q_dim = heads * dim, kv_dim = kv_heads * dim, stride = q_dim + 2 * kv_dim;
  auto qkv = RandomVector(size_t(tokens) * stride, 11);
  std::vector<float> q(size_t(tokens) * q_dim), k(size_t(tokens) * kv_dim);
  for (int t = 0; t < tokens; ++t) {
    std::copy_n(&qkv[size_t(t) * stride], q_dim, &q[size_t(t) * q_dim]);
    std::copy_n(&qkv[size_t(t) * stride + q_dim], kv_dim, &k[size_t(t) * kv_dim]);
  }
  const std::vector<int32_t> positions{0, 5, 1000, 31, 7, 32767};
  RotaryParams params{tokens, heads, kv_heads, dim, 1e6f};
  ApplyRotary(params, positions.data(), q.data(), k.data());
  std::vector<float> table(size_t(tokens) * dim);
  RotaryTable(positions.data(), tokens, dim, 1e6f, table.data());
  params.q_stride = params.k_stride = stride;
  ApplyRotaryTable(params, table.data(), qkv.data(), qkv.data() + q_dim);
  for (int t = 0; t < tokens; ++t) {
    for (int i = 0; i < q_dim; ++i) ASSERT_EQ(qkv[size_t(t) * stride + i], q[size_t(t) * q_dim + i]);
    for (int i = 0; i < kv_dim; ++i) {
      ASSERT_EQ(qkv[size_t(t) * stride + q_dim + i], k[size_t(t) * kv_dim + i]);
    }
  }
}

// Round to nearest even like the scalar reference, for every size's vector and tail paths.
TEST_P(BothIsasTest, ConvertToBf16RoundsToNearestEven) {
  for (int n : {1, 15, 16, 17, 100000}) {
    auto x = RandomVector(n, 12, 100.f);
    if (n > 3) {
      x[0] = std::nanf("");
      x[1] = INFINITY;
      x[2] = 3.4e38f;  // rounds up to inf
    }
    std::vector<uint16_t> got(n);
    ConvertToBf16(x.data(), got.data(), n);
    for (int i = 0; i < n; ++i) {
      uint32_t u;
      std::memcpy(&u, &x[i], 4);
      const uint16_t want = std::isnan(x[i]) ? static_cast<uint16_t>((u >> 16) | 0x40)
                                             : static_cast<uint16_t>((u + 0x7fff + ((u >> 16) & 1)) >> 16);
      ASSERT_EQ(got[i], want) << "n " << n << " element " << i << " value " << x[i];
    }
  }
}

INSTANTIATE_TEST_SUITE_P(Isa, BothIsasTest, ::testing::Values(Isa::kAvx2, Isa::kAvx512),
                         [](const auto& info) { return std::string(IsaName(info.param)); });

}  // namespace
}  // namespace ferry::kernels::cpu
