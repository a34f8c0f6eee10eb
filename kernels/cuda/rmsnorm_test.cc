// Runs only where a GPU is present; on CPU-only machines it reports a skip.
#include "kernels/cuda/rmsnorm.h"

#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <cmath>
#include <random>
#include <vector>

namespace ferry::kernels::cuda {
namespace {

std::vector<float> Reference(const std::vector<float>& x, const std::vector<float>& w, int rows, int h, float eps) {
  std::vector<float> y(x.size());
  for (int r = 0; r < rows; ++r) {
    double ss = 0;
    for (int i = 0; i < h; ++i) ss += double(x[r * h + i]) * x[r * h + i];
    const double inv = 1.0 / std::sqrt(ss / h + eps);
    for (int i = 0; i < h; ++i) y[r * h + i] = float(x[r * h + i] * inv * w[i]);
  }
  return y;
}

TEST(CudaRmsNorm, MatchesReference) {
  int count = 0;
  if (cudaGetDeviceCount(&count) != cudaSuccess || count == 0) GTEST_SKIP() << "no CUDA device";
  std::mt19937 rng(7);
  std::normal_distribution<float> dist;
  for (int h : {64, 896, 4864}) {
    const int rows = 33;
    std::vector<float> x(rows * h), w(h);
    for (auto& v : x) v = dist(rng);
    for (auto& v : w) v = dist(rng);
    float *dx, *dw, *dy;
    ASSERT_EQ(cudaMalloc(&dx, x.size() * 4), cudaSuccess);
    ASSERT_EQ(cudaMalloc(&dw, w.size() * 4), cudaSuccess);
    ASSERT_EQ(cudaMalloc(&dy, x.size() * 4), cudaSuccess);
    cudaMemcpy(dx, x.data(), x.size() * 4, cudaMemcpyHostToDevice);
    cudaMemcpy(dw, w.data(), w.size() * 4, cudaMemcpyHostToDevice);
    ASSERT_EQ(RmsNorm({dx, dw, dy, rows, h, 1e-6f, nullptr}), 0);
    std::vector<float> y(x.size());
    ASSERT_EQ(cudaMemcpy(y.data(), dy, y.size() * 4, cudaMemcpyDeviceToHost), cudaSuccess);
    const auto ref = Reference(x, w, rows, h, 1e-6f);
    for (size_t i = 0; i < y.size(); ++i) ASSERT_NEAR(y[i], ref[i], 1e-4 * (1 + std::fabs(ref[i]))) << "h=" << h << " i=" << i;
    cudaFree(dx); cudaFree(dw); cudaFree(dy);
  }
}

}  // namespace
}  // namespace ferry::kernels::cuda
