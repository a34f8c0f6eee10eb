// Runs only where a GPU is present; on CPU-only machines it reports a skip.
#include "kernels/cuda/rotary.h"

#include <gtest/gtest.h>

#include <cmath>
#include <random>
#include <vector>

#include "kernels/cpu/cpu_kernels.h"
#include "kernels/cuda/test_util.h"

namespace ferry::kernels::cuda {
namespace {

using testing::DeviceVector;

struct Shape {
  int heads, kv_heads, head_dim;
  float theta;
  int max_position;
};

// Bias add, each q and k head's RMS norm (when q_norm is not empty), then rotation in double,
// from the same cos/sin table.
std::vector<double> Reference(const Shape& s, const std::vector<float>& qkv, const std::vector<float>& bias,
                              const std::vector<float>& table, const std::vector<int32_t>& positions, int64_t stride,
                              const std::vector<float>& q_norm = {}, const std::vector<float>& k_norm = {},
                              double eps = 0) {
  std::vector<double> out(qkv.begin(), qkv.end());
  const int half = s.head_dim / 2, qkv_dim = (s.heads + 2 * s.kv_heads) * s.head_dim;
  for (size_t t = 0; t < positions.size(); ++t) {
    double* row = out.data() + t * stride;
    for (int i = 0; i < qkv_dim; ++i) row[i] += bias.empty() ? 0.0 : bias[i];
    const float* cs = table.data() + int64_t{positions[t]} * s.head_dim;
    for (int h = 0; !q_norm.empty() && h < s.heads + s.kv_heads; ++h) {
      double* x = row + h * s.head_dim;
      const std::vector<float>& w = h < s.heads ? q_norm : k_norm;
      double sum = 0;
      for (int i = 0; i < s.head_dim; ++i) sum += x[i] * x[i];
      const double scale = 1.0 / std::sqrt(sum / s.head_dim + eps);
      for (int i = 0; i < s.head_dim; ++i) x[i] *= scale * w[i];
    }
    for (int h = 0; h < s.heads + s.kv_heads; ++h) {
      for (int i = 0; i < half; ++i) {
        const double a = row[h * s.head_dim + i], b = row[h * s.head_dim + half + i];
        row[h * s.head_dim + i] = a * cs[i] - b * cs[half + i];
        row[h * s.head_dim + half + i] = b * cs[i] + a * cs[half + i];
      }
    }
  }
  return out;
}

// The cos/sin of every position, as the engines upload it: [max_position, head_dim].
std::vector<float> Table(const Shape& s) {
  std::vector<int32_t> all_positions(s.max_position);
  for (int i = 0; i < s.max_position; ++i) all_positions[i] = i;
  std::vector<float> table(int64_t{s.max_position} * s.head_dim);
  cpu::RotaryTable(all_positions.data(), s.max_position, s.head_dim, s.theta, table.data());
  return table;
}

// Random positions, the first and the last position among them.
std::vector<int32_t> Positions(const Shape& s, int tokens, std::mt19937& rng) {
  std::vector<int32_t> positions(tokens);
  std::uniform_int_distribution<int> pos(0, s.max_position - 1);
  for (auto& p : positions) p = pos(rng);
  positions[0] = 0;
  positions[1] = s.max_position - 1;
  return positions;
}

TEST(CudaQkvBiasRotary, MatchesReference) {
  FERRY_SKIP_WITHOUT_GPU();
  std::mt19937 rng(testing::TestSeed());
  for (const Shape& s : {Shape{4, 2, 16, 1e4f, 2048}, Shape{14, 2, 64, 1e6f, 32768}, Shape{7, 1, 64, 1e6f, 4096}}) {
    const int tokens = 45;
    const int64_t qkv_dim = (s.heads + 2 * s.kv_heads) * s.head_dim, stride = qkv_dim + 8;
    const std::vector<float> table = Table(s);
    const std::vector<int32_t> positions = Positions(s, tokens, rng);
    const auto qkv = testing::RandomVector(tokens * stride, rng);
    const auto bias = testing::RandomVector(qkv_dim, rng);
    DeviceVector<float> d_qkv(qkv), d_bias(bias), d_table(table);
    DeviceVector<int32_t> d_pos(positions);
    QkvRotaryArgs args{d_qkv.get(), d_bias.get(), d_table.get(), d_pos.get(), tokens, s.heads, s.kv_heads,
                       s.head_dim, stride, nullptr};
    ASSERT_EQ(QkvBiasRotary(args), 0);
    const auto got = d_qkv.ToHost();
    const auto ref = Reference(s, qkv, bias, table, positions, stride);
    for (size_t i = 0; i < got.size(); ++i) {
      ASSERT_NEAR(got[i], ref[i], 1e-5 * (1 + std::fabs(ref[i]))) << "head_dim " << s.head_dim << " i=" << i;
    }
    // And the CPU engine's own kernel, the one the CPU backend runs (bias added first).
    std::vector<float> cpu_qkv = qkv;
    for (int t = 0; t < tokens; ++t) {
      for (int i = 0; i < qkv_dim; ++i) cpu_qkv[t * stride + i] += bias[i];
    }
    std::vector<float> rows(int64_t{tokens} * s.head_dim);
    for (int t = 0; t < tokens; ++t) {
      std::copy_n(table.data() + int64_t{positions[t]} * s.head_dim, s.head_dim, rows.data() + t * s.head_dim);
    }
    cpu::RotaryParams rp{tokens, s.heads, s.kv_heads, s.head_dim, s.theta, stride, stride};
    cpu::ApplyRotaryTable(rp, rows.data(), cpu_qkv.data(), cpu_qkv.data() + s.heads * s.head_dim);
    for (size_t i = 0; i < got.size(); ++i) ASSERT_NEAR(got[i], cpu_qkv[i], 1e-5 * (1 + std::fabs(cpu_qkv[i])));
  }
}

// Qwen3: no bias, each q and k head RMS-normed before the rotation; against the reference and
// against the CPU engine's own kernels (RmsNorm per head, then ApplyRotaryTable).
TEST(CudaQkvBiasRotary, NormsEachHeadBeforeTheRotation) {
  FERRY_SKIP_WITHOUT_GPU();
  std::mt19937 rng(testing::TestSeed());
  const float eps = 1e-6f;
  for (const Shape& s : {Shape{4, 2, 16, 1e4f, 512}, Shape{16, 8, 128, 1e6f, 4096}, Shape{7, 1, 64, 1e6f, 1024}}) {
    const int tokens = 37;
    const int64_t qkv_dim = (s.heads + 2 * s.kv_heads) * s.head_dim, stride = qkv_dim + 4;
    const std::vector<float> table = Table(s);
    const std::vector<int32_t> positions = Positions(s, tokens, rng);
    const auto qkv = testing::RandomVector(tokens * stride, rng);
    const auto q_norm = testing::RandomVector(s.head_dim, rng), k_norm = testing::RandomVector(s.head_dim, rng);
    DeviceVector<float> d_qkv(qkv), d_table(table), d_q_norm(q_norm), d_k_norm(k_norm);
    DeviceVector<int32_t> d_pos(positions);
    QkvRotaryArgs args{d_qkv.get(), nullptr, d_table.get(), d_pos.get(), tokens, s.heads, s.kv_heads,
                       s.head_dim, stride, nullptr, d_q_norm.get(), d_k_norm.get(), eps};
    ASSERT_EQ(QkvBiasRotary(args), 0);
    const auto got = d_qkv.ToHost();
    const auto ref = Reference(s, qkv, {}, table, positions, stride, q_norm, k_norm, eps);
    for (size_t i = 0; i < got.size(); ++i) {
      ASSERT_NEAR(got[i], ref[i], 1e-4 * (1 + std::fabs(ref[i]))) << "head_dim " << s.head_dim << " i=" << i;
    }
    std::vector<float> cpu_qkv = qkv;
    std::vector<float> rows(int64_t{tokens} * s.head_dim);
    for (int t = 0; t < tokens; ++t) {
      float* row = cpu_qkv.data() + t * stride;
      cpu::RmsNorm(row, q_norm.data(), row, s.heads, s.head_dim, eps);
      cpu::RmsNorm(row + s.heads * s.head_dim, k_norm.data(), row + s.heads * s.head_dim, s.kv_heads, s.head_dim, eps);
      std::copy_n(table.data() + int64_t{positions[t]} * s.head_dim, s.head_dim, rows.data() + t * s.head_dim);
    }
    cpu::RotaryParams rp{tokens, s.heads, s.kv_heads, s.head_dim, s.theta, stride, stride};
    cpu::ApplyRotaryTable(rp, rows.data(), cpu_qkv.data(), cpu_qkv.data() + s.heads * s.head_dim);
    for (size_t i = 0; i < got.size(); ++i) ASSERT_NEAR(got[i], cpu_qkv[i], 1e-4 * (1 + std::fabs(cpu_qkv[i])));
  }
  // One norm without the other is refused.
  QkvRotaryArgs half_normed{nullptr, nullptr, nullptr, nullptr, 1, 1, 1, 16, 48, nullptr, nullptr, nullptr, 0.f};
  std::vector<float> w(16, 1.f);
  DeviceVector<float> d_w(w);
  half_normed.q_norm = d_w.get();
  EXPECT_NE(QkvBiasRotary(half_normed), 0);
}

}  // namespace
}  // namespace ferry::kernels::cuda
