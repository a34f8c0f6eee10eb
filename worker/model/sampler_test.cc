// Sampling: greedy ties, top-k / top-p support, seeded determinism, rough distribution.
#include "worker/model/sampler.h"

#include <gtest/gtest.h>

#include <cmath>
#include <map>
#include <random>
#include <set>

namespace ferry::worker {
namespace {

std::vector<float> RandomLogits(int32_t vocab, uint32_t seed) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> dist(0.f, 2.f);
  std::vector<float> v(vocab);
  for (float& x : v) x = dist(rng);
  return v;
}

TEST(SamplerTest, GreedyPicksLowestIdOnTies) {
  Sampler sampler;
  const std::vector<float> logits{0.f, 3.f, 1.f, 3.f, -1.f};
  EXPECT_EQ(sampler.Sample(logits.data(), 5, SamplingOptions{}, 0), 1);
  EXPECT_EQ(Argmax(logits.data(), 5), 1);
}

TEST(SamplerTest, CounterUniformIsStatelessAndInRange) {
  EXPECT_EQ(CounterUniform(7, 3), CounterUniform(7, 3));
  EXPECT_NE(CounterUniform(7, 3), CounterUniform(7, 4));
  EXPECT_NE(CounterUniform(7, 3), CounterUniform(8, 3));
  double sum = 0;
  for (uint64_t i = 0; i < 100000; ++i) {
    const double u = CounterUniform(42, i);
    ASSERT_GE(u, 0.0);
    ASSERT_LT(u, 1.0);
    sum += u;
  }
  EXPECT_NEAR(sum / 100000, 0.5, 0.01);
}

TEST(SamplerTest, TopKNeverOutsideTopK) {
  Sampler sampler;
  const int32_t vocab = 1000;
  for (int32_t k : {1, 2, 5, 40}) {
    const auto logits = RandomLogits(vocab, k);
    std::vector<int32_t> order(vocab);
    for (int32_t i = 0; i < vocab; ++i) order[i] = i;
    std::sort(order.begin(), order.end(), [&](int a, int b) { return logits[a] > logits[b]; });
    const std::set<int32_t> allowed(order.begin(), order.begin() + k);
    SamplingOptions opts{/*temperature=*/5.f, /*top_p=*/1.f, /*top_k=*/k, /*seed=*/9};
    std::set<int32_t> seen;
    for (int32_t i = 0; i < 2000; ++i) {
      const int32_t t = sampler.Sample(logits.data(), vocab, opts, i);
      ASSERT_TRUE(allowed.count(t)) << "k=" << k << " draw " << i << " got " << t;
      seen.insert(t);
    }
    EXPECT_EQ(seen.size(), static_cast<size_t>(k)) << "high temperature reaches all of top k";
  }
}

TEST(SamplerTest, TopPKeepsSmallestSetReachingMass) {
  Sampler sampler;
  // Probabilities 0.5, 0.3, 0.15, 0.05 at temperature 1.
  const std::vector<float> logits{std::log(0.15f), std::log(0.5f), std::log(0.05f),
                                  std::log(0.3f)};
  std::map<int32_t, int> counts;
  SamplingOptions opts{1.f, /*top_p=*/0.75f, 0, /*seed=*/3};
  for (int32_t i = 0; i < 20000; ++i) ++counts[sampler.Sample(logits.data(), 4, opts, i)];
  // 0.5 < 0.75 <= 0.8: tokens 1 and 3 only, renormalised to 0.625 / 0.375.
  EXPECT_EQ(counts.size(), 2u);
  EXPECT_NEAR(counts[1] / 20000.0, 0.625, 0.02);
  EXPECT_NEAR(counts[3] / 20000.0, 0.375, 0.02);
}

TEST(SamplerTest, TemperatureOneMatchesSoftmax) {
  Sampler sampler;
  const std::vector<float> logits{0.f, std::log(3.f)};  // 0.25 / 0.75
  int ones = 0;
  for (int32_t i = 0; i < 20000; ++i) {
    ones += sampler.Sample(logits.data(), 2, {1.f, 1.f, 0, 11}, i);
  }
  EXPECT_NEAR(ones / 20000.0, 0.75, 0.02);
}

TEST(SamplerTest, SameSeedAndIndexSameToken) {
  const auto logits = RandomLogits(5000, 1);
  SamplingOptions opts{0.8f, 0.9f, 50, 1234};
  Sampler a, b;
  for (int32_t i = 0; i < 200; ++i) {
    // Interleave other work on b so reused scratch cannot leak between calls.
    const auto other = RandomLogits(300, i);
    b.Sample(other.data(), 300, {1.f, 1.f, 0, 5}, i);
    EXPECT_EQ(a.Sample(logits.data(), 5000, opts, i), b.Sample(logits.data(), 5000, opts, i));
  }
}

}  // namespace
}  // namespace ferry::worker
