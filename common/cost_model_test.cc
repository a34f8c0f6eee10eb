#include "common/cost_model.h"

#include <gtest/gtest.h>

#include <stdexcept>

namespace ferry {
namespace {

CostModelParams Roofline() {
  CostModelParams p;
  p.weight_bytes = 1e9;
  p.kv_bytes_per_token = 1e4;
  p.bandwidth_bytes_per_s = 1e12;
  p.flops_per_token = 1e9;
  p.peak_flops = 1e14;
  return p;
}

TEST(CostModelTest, DecodeIsMemoryBoundAndPrefillComputeBound) {
  const CostModel m(Roofline());
  // 8 decodes over 1,000 context tokens: (1e9 + 1e7) B / 1e12 = 1.01 ms > 8e9 / 1e14.
  EXPECT_NEAR(m.StepSeconds({8, 8, 1000}), 1.01e-3, 1e-9);
  // A 4,096-token prefill: 4.096e12 / 1e14 = 40.96 ms > memory.
  EXPECT_NEAR(m.StepSeconds({4096, 1, 4096}), 40.96e-3, 1e-9);
  EXPECT_EQ(m.StepSeconds({0, 0, 0}), 0.0);
}

TEST(CostModelTest, OverheadsAndEfficienciesApply) {
  CostModelParams p = Roofline();
  p.fixed_s = 1e-3;
  p.batched_step_s = 0.5e-3;
  p.per_seq_s = 1e-5;
  p.bandwidth_efficiency = 0.5;
  const CostModel m(p);
  EXPECT_NEAR(m.StepSeconds({1, 1, 0}), 1e-3 + 1e-5 + 2e-3, 1e-12);
  EXPECT_NEAR(m.StepSeconds({2, 2, 0}), 1e-3 + 0.5e-3 + 2e-5 + 2e-3, 1e-12);
}

TEST(CostModelTest, StepTimeGrowsWithWork) {
  const CostModel m(Roofline());
  double last = 0;
  for (int n : {1, 8, 64, 512, 4096}) {
    const double t = m.StepSeconds({n, std::min(n, 64), int64_t{n} * 100});
    EXPECT_GE(t, last) << "n = " << n;
    last = t;
  }
}

TEST(CostModelTest, JsonRoundTripAndValidation) {
  CostModelParams p = Roofline();
  p.name = "x";
  p.kv_capacity_tokens = 1234;
  const CostModelParams q = CostModelParamsFromJson(CostModelParamsToJson(p));
  EXPECT_EQ(q.name, "x");
  EXPECT_EQ(q.kv_capacity_tokens, 1234);
  EXPECT_DOUBLE_EQ(q.weight_bytes, 1e9);
  EXPECT_THROW(CostModelParamsFromJson(R"({"bandwith_bytes_per_s": 1})"), std::invalid_argument);
  EXPECT_THROW(CostModelParamsFromJson(R"({"peak_flops": 0})"), std::invalid_argument);
  EXPECT_THROW(CostModelParamsFromJson(R"({"fixed_s": "fast"})"), std::invalid_argument);
  EXPECT_THROW(CostModelParamsFromJson("not json"), std::invalid_argument);
  EXPECT_NO_THROW(CostModelParamsFromJson(R"({"_comment": "ok", "peak_flops": 1e12})"));
  EXPECT_THROW(LoadCostModelParams("/nonexistent/preset.json"), std::runtime_error);
}

// The CPU engine's attention is arithmetic outside the roofline: a step
// grows with the context it attends to beyond what the KV bytes explain.
TEST(CostModelTest, ContextTermAddsPerTokenAttendedAndRoundTrips) {
  CostModelParams p = Roofline();
  p.per_context_token_s = 1e-6;
  const CostModel with(p), without(Roofline());
  const StepShape decode{16, 16, 16 * 512};
  EXPECT_NEAR(with.StepSeconds(decode) - without.StepSeconds(decode), 16 * 512 * 1e-6, 1e-12);
  EXPECT_DOUBLE_EQ(CostModelParamsFromJson(CostModelParamsToJson(p)).per_context_token_s, 1e-6);
  EXPECT_THROW(CostModelParamsFromJson(R"({"peak_flops": 1e12, "per_context_token_s": -1})"), std::invalid_argument);
}

}  // namespace
}  // namespace ferry
