// Runs only where a GPU is present; on CPU-only machines it reports a skip.
#include "kernels/cuda/rmsnorm.h"

#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <cmath>
#include <random>
#include <vector>

#include "kernels/cuda/test_util.h"

namespace ferry::kernels::cuda {
namespace {

using testing::Bf16ToFloat;
using testing::DeviceVector;

// Rows of x normalised in double.
std::vector<double> Reference(const std::vector<float>& x, const std::vector<float>& w, int rows, int h, float eps) {
  std::vector<double> y(x.size());
  for (int r = 0; r < rows; ++r) {
    double ss = 0;
    for (int i = 0; i < h; ++i) ss += double(x[r * h + i]) * x[r * h + i];
    const double inv = 1.0 / std::sqrt(ss / h + eps);
    for (int i = 0; i < h; ++i) y[r * h + i] = x[r * h + i] * inv * w[i];
  }
  return y;
}

TEST(CudaRmsNorm, MatchesReference) {
  FERRY_SKIP_WITHOUT_GPU();
  std::mt19937 rng(testing::TestSeed());
  for (int h : {64, 896, 4864}) {
    const int rows = 33;
    const auto x = testing::RandomVector(rows * h, rng), w = testing::RandomVector(h, rng);
    DeviceVector<float> dx(x), dw(w), dy(x.size());
    ASSERT_EQ(RmsNorm({dx.get(), dw.get(), dy.get(), rows, h, 1e-6f, nullptr}), 0);
    const auto y = dy.ToHost();
    const auto ref = Reference(x, w, rows, h, 1e-6f);
    for (size_t i = 0; i < y.size(); ++i) ASSERT_NEAR(y[i], ref[i], 1e-4 * (1 + std::fabs(ref[i]))) << "h=" << h << " i=" << i;
  }
}

// residual += delta, then bf16(norm(residual)) for a subset of rows, and for all rows without
// a delta; the residual rows not picked stay as they were.
TEST(CudaAddRmsNorm, MatchesReference) {
  FERRY_SKIP_WITHOUT_GPU();
  std::mt19937 rng(testing::TestSeed() + 1);
  for (int h : {64, 896, 4864}) {
    for (bool with_delta : {false, true}) {
      for (bool with_rows : {false, true}) {
        const int total_rows = 37;
        const auto x = testing::RandomVector(total_rows * h, rng, 3.f);
        const auto delta = testing::RandomVector(total_rows * h, rng);
        const auto w = testing::RandomVector(h, rng);
        std::vector<int32_t> rows;
        if (with_rows) rows = {36, 0, 5, 17};
        const int num_rows = with_rows ? static_cast<int>(rows.size()) : total_rows;
        DeviceVector<float> dx(x), dd(delta), dw(w);
        DeviceVector<int32_t> drows(rows.empty() ? std::vector<int32_t>{0} : rows);
        DeviceVector<uint16_t> dy(static_cast<size_t>(num_rows) * h);
        AddRmsNormArgs args{dx.get(), with_delta ? dd.get() : nullptr, dw.get(), dy.get(),
                            with_rows ? drows.get() : nullptr, num_rows, h, 1e-6f, nullptr};
        ASSERT_EQ(AddRmsNorm(args), 0);
        const auto y = dy.ToHost();
        const auto residual = dx.ToHost();
        std::vector<float> expected_residual = x;
        std::vector<float> picked;
        for (int r = 0; r < num_rows; ++r) {
          const int row = with_rows ? rows[r] : r;
          for (int i = 0; i < h; ++i) {
            float v = x[row * h + i];
            if (with_delta) v += delta[row * h + i];
            expected_residual[row * h + i] = v;
            picked.push_back(v);
          }
        }
        for (size_t i = 0; i < residual.size(); ++i) ASSERT_EQ(residual[i], expected_residual[i]) << "i=" << i;
        const auto ref = Reference(picked, w, num_rows, h, 1e-6f);
        for (size_t i = 0; i < y.size(); ++i) {
          ASSERT_NEAR(Bf16ToFloat(y[i]), ref[i], testing::Bf16Tolerance(ref[i]) + 1e-4 * std::fabs(ref[i]))
              << "h=" << h << " delta=" << with_delta << " rows=" << with_rows << " i=" << i;
        }
      }
    }
  }
}

}  // namespace
}  // namespace ferry::kernels::cuda
