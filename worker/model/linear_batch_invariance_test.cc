// A row's result must not depend on how many other rows share the call: that is what makes
// greedy output independent of batching. Checked bitwise for both dtypes over the row counts a
// serving step sees, on the layer shapes of Qwen2.5-0.5B.
#include <gtest/gtest.h>

#include <cstdlib>
#include <cstring>
#include <random>

#include "worker/model/bf16_test_util.h"
#include "worker/model/linear.h"

namespace ferry::worker {
namespace {

struct Shape {
  int64_t n, k;
};

// Param: a MatmulDtype name, or "int8" (W8A8 over a float32 context).
class LinearBatchInvariance : public ::testing::TestWithParam<const char*> {
 protected:
  bool int8() const { return std::strcmp(GetParam(), "int8") == 0; }
  MatmulDtype dtype() const { return int8() ? MatmulDtype::kFloat32 : ParseMatmulDtype(GetParam()); }
  Quantization quantization() const { return int8() ? Quantization::kInt8 : Quantization::kNone; }
};

TEST_P(LinearBatchInvariance, RowResultsDoNotDependOnRowCount) {
  FERRY_SKIP_WITHOUT_BF16(GetParam());
  std::mt19937 rng(3);
  std::normal_distribution<float> dist(0.f, 0.05f);
  MatmulContext context(dtype());
  for (const Shape shape : {Shape{1152, 896}, Shape{896, 896}, Shape{9728, 896}, Shape{896, 4864}}) {
    std::vector<float> w(shape.n * shape.k), bias(shape.n);
    for (auto& v : w) v = dist(rng);
    for (auto& v : bias) v = dist(rng);
    Linear linear(&context, w, shape.n, shape.k, bias, /*accumulate=*/false, quantization());
    const int64_t max_m = 300;
    std::vector<float> x(max_m * shape.k);
    for (auto& v : x) v = dist(rng) * 20;
    std::vector<float> alone(max_m * shape.n);
    for (int64_t r = 0; r < max_m; ++r) linear.Forward(x.data() + r * shape.k, alone.data() + r * shape.n, 1);
    for (int64_t m : {2, 3, 4, 7, 16, 17, 32, 63, 64, 67, 129, 200, 300}) {
      std::vector<float> out(m * shape.n);
      linear.Forward(x.data(), out.data(), m);
      ASSERT_EQ(std::memcmp(out.data(), alone.data(), out.size() * sizeof(float)), 0)
          << GetParam() << " n=" << shape.n << " k=" << shape.k << " m=" << m;
    }
  }
}

// Serving sends every row count up to --max-num-batched-tokens; a primitive per count grew the
// worker without bound (0.4 MB/s in a soak). Every count from 1 to 600 runs on at most 30.
TEST_P(LinearBatchInvariance, EveryRowCountRunsOnABoundedSetOfPrimitives) {
  FERRY_SKIP_WITHOUT_BF16(GetParam());
  MatmulContext context(dtype());
  if (context.backend() != MatmulBackend::kOneDnn || int8()) GTEST_SKIP() << "Ferry's kernel has no primitives";
  const int64_t n = 64, k = 32, max_m = 600;
  std::vector<float> w(n * k, 0.01f), x(max_m * k, 1.f), out(max_m * n);
  Linear linear(&context, w, n, k, {}, /*accumulate=*/false);
  for (int64_t m = 1; m <= max_m; ++m) linear.Forward(x.data(), out.data(), m);
  EXPECT_LE(linear.num_primitives(), 30);
  EXPECT_GE(linear.num_primitives(), 1);
  EXPECT_NEAR(out[(max_m - 1) * n], 0.01f * k, 0.005f);  // the last row of the last call, computed (bf16 weights)
}

INSTANTIATE_TEST_SUITE_P(Dtypes, LinearBatchInvariance, ::testing::Values("float32", "bfloat16", "int8"));

TEST(MatmulBackendTest, EnvironmentPicksTheBackendAndABadNameIsRefused) {
  const char* before = std::getenv("FERRY_CPU_MATMUL");
  const std::string saved = before != nullptr ? before : "";
  setenv("FERRY_CPU_MATMUL", "ferry", 1);
  EXPECT_EQ(ChooseMatmulBackend(MatmulDtype::kBfloat16), MatmulBackend::kFerry);
  EXPECT_TRUE(Bf16MatmulAvailable());
  setenv("FERRY_CPU_MATMUL", "onednn", 1);
  EXPECT_EQ(ChooseMatmulBackend(MatmulDtype::kFloat32), MatmulBackend::kOneDnn);
  setenv("FERRY_CPU_MATMUL", "blas", 1);
  try {
    ChooseMatmulBackend(MatmulDtype::kFloat32);
    ADD_FAILURE() << "FERRY_CPU_MATMUL=blas was accepted";
  } catch (const std::invalid_argument& e) {
    EXPECT_NE(std::string(e.what()).find("FERRY_CPU_MATMUL=blas"), std::string::npos) << e.what();
  }
  if (before != nullptr) {
    setenv("FERRY_CPU_MATMUL", saved.c_str(), 1);
  } else {
    unsetenv("FERRY_CPU_MATMUL");
  }
}

}  // namespace
}  // namespace ferry::worker
