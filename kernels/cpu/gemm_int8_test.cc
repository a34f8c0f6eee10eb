// GemmInt8 against exact integer sums with gemm_int8.h's epilogue (bitwise, on both kernels),
// across row counts (batch invariance), and against the fp32 product (accuracy).
#include "kernels/cpu/gemm_int8.h"

#include <gtest/gtest.h>

#include <cmath>
#include <random>
#include <stdexcept>
#include <vector>

#include "kernels/cpu/isa.h"

namespace ferry::kernels::cpu {
namespace {

std::vector<float> RandomVector(size_t n, uint32_t seed, float stddev = 1.f) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> dist(0.f, stddev);
  std::vector<float> v(n);
  for (float& x : v) x = dist(rng);
  return v;
}

struct Quantized {
  std::vector<int8_t> q;  // [rows, kp]
  std::vector<float> scale;
};

Quantized Quantize(const std::vector<float>& src, int64_t rows, int64_t k) {
  Quantized out{std::vector<int8_t>(rows * Int8PaddedK(k)), std::vector<float>(rows)};
  QuantizeRowsInt8(src.data(), rows, k, out.q.data(), out.scale.data());
  return out;
}

struct Layer {
  int64_t n, k;
  Quantized w;
  std::vector<int8_t> packed;
  std::vector<int32_t> sums;
  std::vector<float> scale_padded;

  Layer(const std::vector<float>& weight, int64_t n_, int64_t k_) : n(n_), k(k_), w(Quantize(weight, n_, k_)) {
    packed.resize(PackedInt8Size(n, k));
    sums.resize(Int8PaddedN(n));
    PackInt8(w.q.data(), n, k, packed.data(), sums.data());
    scale_padded = w.scale;
    scale_padded.resize(Int8PaddedN(n), 0.f);
  }
};

void RunGemm(const Layer& l, const Quantized& x, int64_t m, const float* bias, float* out, bool accumulate) {
  GemmInt8Args a;
  a.x = x.q.data();
  a.x_scale = x.scale.data();
  a.weight = l.packed.data();
  a.w_scale = l.scale_padded.data();
  a.w_sums = l.sums.data();
  a.bias = bias;
  a.out = out;
  a.m = m;
  a.n = l.n;
  a.k = l.k;
  a.accumulate = accumulate;
  GemmInt8(a);
}

// gemm_int8.h's contract for one element, from the unpacked quantized values.
float ContractElement(const Layer& l, const Quantized& x, int64_t row, int64_t col, const float* bias,
                      float prior, bool accumulate) {
  const int64_t kp = Int8PaddedK(l.k);
  int64_t acc = 0;
  for (int64_t j = 0; j < l.k; ++j) acc += int64_t{x.q[row * kp + j]} * l.w.q[col * kp + j];
  volatile float v = static_cast<float>(static_cast<int32_t>(acc));  // volatile: no fused ops
  v = v * x.scale[row];
  v = v * l.w.scale[col];
  if (bias != nullptr) v = v + bias[col];
  return accumulate ? prior + v : v;
}

class GemmInt8Test : public testing::TestWithParam<Isa> {
 protected:
  void SetUp() override { SetIsaForTesting(GetParam()); }
  void TearDown() override { SetIsaForTesting(Isa::kAvx512); }
};

TEST_P(GemmInt8Test, RunsTheKernelOfItsIsa) {
  const bool vnni = __builtin_cpu_supports("avx512vnni") && __builtin_cpu_supports("avx512bw") &&
                    ActiveIsa() == Isa::kAvx512;
  EXPECT_EQ(Int8UsesVnni(), vnni);
  if (GetParam() == Isa::kAvx2) EXPECT_FALSE(Int8UsesVnni());
}

TEST_P(GemmInt8Test, MatchesExactIntegerSumsBitwise) {
  struct Case { int64_t m, n, k; };
  for (const Case c : {Case{1, 1, 1}, {1, 5, 7}, {2, 16, 8}, {3, 17, 9}, {4, 33, 64}, {5, 70, 130},
                       {9, 130, 13}, {50, 300, 896}, {1, 1152, 896}, {7, 896, 4864}}) {
    SCOPED_TRACE(testing::Message() << c.m << "x" << c.n << "x" << c.k << " " << IsaName(ActiveIsa()));
    const Layer l(RandomVector(c.n * c.k, 2, 0.05f), c.n, c.k);
    const Quantized x = Quantize(RandomVector(c.m * c.k, 1), c.m, c.k);
    const auto bias = RandomVector(c.n, 3);
    for (const bool accumulate : {false, true}) {
      for (const bool with_bias : {false, true}) {
        const auto prior = RandomVector(c.m * c.n, 4);
        std::vector<float> out = prior;
        RunGemm(l, x, c.m, with_bias ? bias.data() : nullptr, out.data(), accumulate);
        for (int64_t r = 0; r < c.m; ++r) {
          for (int64_t col = 0; col < c.n; ++col) {
            const float want = ContractElement(l, x, r, col, with_bias ? bias.data() : nullptr,
                                               prior[r * c.n + col], accumulate);
            ASSERT_EQ(out[r * c.n + col], want) << "row " << r << " col " << col;
          }
        }
      }
    }
  }
}

TEST_P(GemmInt8Test, ARowsResultDoesNotDependOnTheRowsBesideIt) {
  const int64_t n = 1152, k = 896, m = 37;
  const Layer l(RandomVector(n * k, 5, 0.05f), n, k);
  const auto xf = RandomVector(m * k, 6);
  const Quantized x = Quantize(xf, m, k);
  std::vector<float> all(m * n);
  RunGemm(l, x, m, nullptr, all.data(), false);
  for (const int64_t row : {int64_t{0}, int64_t{3}, int64_t{4}, int64_t{36}}) {
    const std::vector<float> one_row(xf.begin() + row * k, xf.begin() + (row + 1) * k);
    const Quantized x1 = Quantize(one_row, 1, k);
    std::vector<float> out(n);
    RunGemm(l, x1, 1, nullptr, out.data(), false);
    for (int64_t col = 0; col < n; ++col) ASSERT_EQ(out[col], all[row * n + col]) << row << "," << col;
  }
}

TEST_P(GemmInt8Test, CloseToTheFloatProduct) {
  const int64_t m = 8, n = 256, k = 896;
  const auto wf = RandomVector(n * k, 7, 0.05f);
  const auto xf = RandomVector(m * k, 8);
  const Layer l(wf, n, k);
  std::vector<float> out(m * n);
  RunGemm(l, Quantize(xf, m, k), m, nullptr, out.data(), false);
  for (int64_t r = 0; r < m; ++r) {
    double dot = 0, nw = 0, nr = 0;
    for (int64_t col = 0; col < n; ++col) {
      double ref = 0;
      for (int64_t j = 0; j < k; ++j) ref += double{xf[r * k + j]} * wf[col * k + j];
      dot += ref * out[r * n + col];
      nw += ref * ref;
      nr += double{out[r * n + col]} * out[r * n + col];
    }
    EXPECT_GT(dot / std::sqrt(nw * nr), 0.999) << "row " << r;
  }
}

INSTANTIATE_TEST_SUITE_P(Isas, GemmInt8Test, testing::Values(Isa::kAvx2, Isa::kAvx512),
                         [](const testing::TestParamInfo<Isa>& info) { return IsaName(info.param); });

TEST(QuantizeRowsInt8Test, SymmetricPerRowWithinHalfAStep) {
  const int64_t rows = 3, k = 10;
  auto src = RandomVector(rows * k, 9);
  for (int64_t j = 0; j < k; ++j) src[2 * k + j] = 0.f;  // an all-zero row
  const Quantized q = Quantize(src, rows, k);
  const int64_t kp = Int8PaddedK(k);
  for (int64_t r = 0; r < 2; ++r) {
    float amax = 0;
    for (int64_t j = 0; j < k; ++j) amax = std::max(amax, std::fabs(src[r * k + j]));
    EXPECT_FLOAT_EQ(q.scale[r], amax / 127.f);
    int max_q = 0;
    for (int64_t j = 0; j < k; ++j) {
      max_q = std::max(max_q, std::abs(int{q.q[r * kp + j]}));
      EXPECT_LE(std::fabs(q.q[r * kp + j] * q.scale[r] - src[r * k + j]), 0.5001f * q.scale[r]);
    }
    EXPECT_EQ(max_q, 127);
    for (int64_t j = k; j < kp; ++j) EXPECT_EQ(q.q[r * kp + j], 0);
  }
  EXPECT_EQ(q.scale[2], 0.f);
  for (int64_t j = 0; j < kp; ++j) EXPECT_EQ(q.q[2 * kp + j], 0);
}

TEST(GemmInt8ArgsTest, RejectsBadSizes) {
  GemmInt8Args a;
  a.m = -1;
  EXPECT_THROW(GemmInt8(a), std::invalid_argument);
  a.m = 1;
  a.n = 1;
  a.k = 70000;
  EXPECT_THROW(GemmInt8(a), std::invalid_argument);
  a.k = 4;
  EXPECT_THROW(GemmInt8(a), std::invalid_argument);  // null pointers
}

}  // namespace
}  // namespace ferry::kernels::cpu
