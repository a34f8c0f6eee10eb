// Sampling: greedy ties, every filter's support and (statistically) its distribution against a
// double-precision reference, penalties, logprobs, seeded determinism.
#include "worker/engine/sampler.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <map>
#include <numeric>
#include <random>
#include <set>

#include "worker/engine/guided_decoding.h"

namespace ferry::worker {
namespace {

std::vector<float> RandomLogits(int32_t vocab, uint32_t seed, float stddev = 2.f) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> dist(0.f, stddev);
  std::vector<float> v(vocab);
  for (float& x : v) x = dist(rng);
  return v;
}

// Ids most likely first, lowest id first among equal logits.
std::vector<int32_t> RefOrder(const std::vector<float>& logits) {
  std::vector<int32_t> order(logits.size());
  std::iota(order.begin(), order.end(), 0);
  std::stable_sort(order.begin(), order.end(),
                   [&](int32_t a, int32_t b) { return logits[a] > logits[b]; });
  return order;
}

// softmax(logits / temperature) in double.
std::vector<double> RefSoftmax(const std::vector<float>& logits, double temperature = 1.0) {
  const double mx = *std::max_element(logits.begin(), logits.end());
  std::vector<double> p(logits.size());
  double sum = 0;
  for (size_t i = 0; i < p.size(); ++i) sum += p[i] = std::exp((logits[i] - mx) / temperature);
  for (double& x : p) x /= sum;
  return p;
}

// Draws `n` samples (indices 0..n-1) and returns id -> count.
std::map<int32_t, int> Histogram(const std::vector<float>& logits, const SamplingOptions& opts,
                                 int n, const TokenCounts* history = nullptr) {
  Sampler sampler;
  std::map<int32_t, int> counts;
  for (int i = 0; i < n; ++i) {
    ++counts[sampler.Sample(logits.data(), int32_t(logits.size()), opts, history, i).token_id];
  }
  return counts;
}

// Every drawn id is in `expected` (id -> probability summing to 1) and Pearson's chi-square
// stays under a bound a correct sampler exceeds with probability far below 1e-6 (df + 7 sd).
void ExpectDistribution(const std::map<int32_t, int>& counts,
                        const std::map<int32_t, double>& expected, int n) {
  double chi2 = 0;
  for (const auto& [id, c] : counts) {
    ASSERT_TRUE(expected.count(id)) << "drew id " << id << " outside the allowed set";
  }
  for (const auto& [id, p] : expected) {
    const auto it = counts.find(id);
    const double observed = it == counts.end() ? 0 : it->second;
    chi2 += (observed - n * p) * (observed - n * p) / (n * p);
  }
  const double df = std::max<double>(1, expected.size() - 1);
  EXPECT_LT(chi2, df + 7 * std::sqrt(2 * df)) << "df " << df;
}

// The renormalised distribution over the first `keep` ids of RefOrder under temperature.
std::map<int32_t, double> Renormalised(const std::vector<float>& logits, size_t keep,
                                       double temperature = 1.0) {
  const auto order = RefOrder(logits);
  const auto p = RefSoftmax(logits, temperature);
  double mass = 0;
  for (size_t i = 0; i < keep; ++i) mass += p[order[i]];
  std::map<int32_t, double> out;
  for (size_t i = 0; i < keep; ++i) out[order[i]] = p[order[i]] / mass;
  return out;
}

// Smallest most-likely prefix whose probability reaches top_p.
size_t RefNucleusSize(const std::vector<float>& logits, double top_p, double temperature) {
  const auto order = RefOrder(logits);
  const auto p = RefSoftmax(logits, temperature);
  double mass = 0;
  for (size_t i = 0; i < order.size(); ++i) {
    mass += p[order[i]];
    if (mass >= top_p) return i + 1;
  }
  return order.size();
}

TokenCounts Counts(const std::vector<int32_t>& tokens, int32_t num_generated) {
  TokenCounts c;
  c.Reset(tokens, num_generated);
  return c;
}

TEST(SamplerTest, ScoreGivesAGivenTokensLogprobTopAndRank) {
  const std::vector<float> logits{1.f, 3.f, 2.f, 3.f, -1.f};
  double z = 0;
  for (float l : logits) z += std::exp(double{l});
  Sampler sampler;
  const SampleResult mid = sampler.Score(logits.data(), 5, /*token_id=*/2, /*num_top=*/2);
  EXPECT_EQ(mid.token_id, 2);
  EXPECT_NEAR(mid.logprob, 2.0 - std::log(z), 1e-6);
  EXPECT_EQ(mid.rank, 3) << "two tokens are more likely";
  ASSERT_EQ(mid.top_logprobs.size(), 2u);
  EXPECT_EQ(mid.top_logprobs[0].first, 1);  // ties: lower id first
  EXPECT_EQ(mid.top_logprobs[1].first, 3);
  EXPECT_EQ(sampler.Score(logits.data(), 5, 3, 0).rank, 1) << "a tie with the best is rank 1";
  EXPECT_EQ(sampler.Score(logits.data(), 5, 4, 0).rank, 5);
  EXPECT_TRUE(sampler.Score(logits.data(), 5, 4, 0).top_logprobs.empty());
}

TEST(SamplerTest, GuidedMaskLimitsWhatIsSampled) {
  const std::vector<float> logits{5.f, 1.f, 3.f, 2.f, 4.f};
  TokenMask allowed(5);
  allowed.Set(1);
  allowed.Set(3);
  Sampler sampler;
  EXPECT_EQ(sampler.Sample(logits.data(), 5, SamplingOptions{}, nullptr, 0, &allowed).token_id, 3);
  SamplingOptions hot;
  hot.temperature = 2.f;
  hot.seed = 9;
  hot.logprobs = 1;
  std::set<int32_t> seen;
  for (int32_t i = 0; i < 300; ++i) {
    const SampleResult r = sampler.Sample(logits.data(), 5, hot, nullptr, i, &allowed);
    seen.insert(r.token_id);
    ASSERT_EQ(r.top_logprobs.at(0).first, 0) << "logprobs stay those of the raw logits";
  }
  EXPECT_EQ(seen, (std::set<int32_t>{1, 3}));
  SamplingOptions biased;
  biased.logit_bias = {{1, 10.f}, {0, 100.f}};
  EXPECT_EQ(sampler.Sample(logits.data(), 5, biased, nullptr, 0, &allowed).token_id, 1)
      << "the bias applies inside the allowed set, and cannot reach outside it";
  SamplingOptions early;
  early.min_tokens = 5;
  early.min_tokens_suppressed_ids = {1, 3};
  EXPECT_EQ(sampler.Sample(logits.data(), 5, early, nullptr, 0, &allowed).token_id, 3)
      << "min_tokens suppressing every allowed id: the constraint wins";
  early.min_tokens_suppressed_ids = {3};
  EXPECT_EQ(sampler.Sample(logits.data(), 5, early, nullptr, 0, &allowed).token_id, 1);
}

// The fast-path rule: whenever ArgmaxSuffices, the full sampler returns the argmax and nothing
// else; each option that changes the result (or adds logprobs) turns it off.
TEST(SamplerTest, ArgmaxSufficesExactlyWhenTheSamplerGivesTheArgmax) {
  constexpr int32_t kVocab = 500;
  Sampler sampler;
  std::vector<SamplingOptions> suffices(4);
  suffices[1].top_p = 0.3f;  // shapes a draw only
  suffices[2].top_k = 5;
  suffices[2].seed = 77;
  suffices[3].min_tokens = 3;  // with nothing to suppress
  for (size_t i = 0; i < suffices.size(); ++i) {
    ASSERT_TRUE(ArgmaxSuffices(suffices[i])) << i;
    for (uint32_t seed = 0; seed < 20; ++seed) {
      const std::vector<float> logits = RandomLogits(kVocab, seed);
      const SampleResult r = sampler.Sample(logits.data(), kVocab, suffices[i], nullptr, static_cast<int32_t>(seed));
      EXPECT_EQ(r.token_id, std::max_element(logits.begin(), logits.end()) - logits.begin());
      EXPECT_TRUE(r.top_logprobs.empty());
    }
  }
  std::vector<SamplingOptions> needs(8);
  needs[0].temperature = 0.7f;
  needs[1].repetition_penalty = 1.2f;
  needs[2].presence_penalty = 0.5f;
  needs[3].logprobs = 0;
  needs[4].logit_bias = {{3, 5.f}};
  needs[5].min_tokens = 2;
  needs[5].min_tokens_suppressed_ids = {1};
  needs[6].allowed_token_ids = {1, 2};
  needs[7].guided.kind = GuidedSpec::Kind::kRegex;
  for (size_t i = 0; i < needs.size(); ++i) EXPECT_FALSE(ArgmaxSuffices(needs[i])) << i;
}

TEST(SamplerTest, GreedyPicksLowestIdOnTies) {
  Sampler sampler;
  const std::vector<float> logits{0.f, 3.f, 1.f, 3.f, -1.f};
  EXPECT_EQ(sampler.Sample(logits.data(), 5, SamplingOptions{}, 0), 1);
  EXPECT_EQ(Argmax(logits.data(), 5), 1);
}

TEST(SamplerTest, LogitBiasForcesBansAndComesBeforePenalties) {
  Sampler sampler;
  const std::vector<float> logits{0.f, 3.f, 1.f, 2.5f, -1.f};
  // +100 all but forces a token, -100 bans one, even when sampling at temperature 1.
  for (int32_t i = 0; i < 50; ++i) {
    EXPECT_EQ(sampler.Sample(logits.data(), 5, {.temperature = 1.f, .seed = 3, .logit_bias = {{4, 100.f}}}, i), 4);
  }
  EXPECT_EQ(sampler.Sample(logits.data(), 5, {.logit_bias = {{1, -100.f}}}, 0), 3);
  EXPECT_EQ(sampler.Sample(logits.data(), 5, {.logit_bias = {{2, 2.5f}}}, 0), 2);  // 1 + 2.5 > 3
  // Before penalties (vLLM's order): a repetition penalty of 2 then halves 1 + 5 = 6 to 3, which
  // ties with token 1 (not in the history) and loses to its lower id; applied after the
  // penalty the bias would give 0.5 + 5 = 5.5 and win.
  const TokenCounts c = Counts({2}, 0);
  EXPECT_EQ(sampler.Sample(logits.data(), 5, {.repetition_penalty = 2.f, .logit_bias = {{2, 5.f}}}, &c, 0)
                .token_id,
            1);
  // Logprobs stay those of the raw logits; the input row is never changed.
  const SampleResult r = sampler.Sample(logits.data(), 5, {.logprobs = 0, .logit_bias = {{4, 100.f}}}, nullptr, 0);
  EXPECT_EQ(r.token_id, 4);
  EXPECT_LT(r.logprob, -3.f);
  EXPECT_EQ(logits[4], -1.f);
  EXPECT_NE(CheckSamplingOptions({.logit_bias = {{1, 101.f}}}), "");
  EXPECT_NE(CheckSamplingOptions({.logit_bias = {{-1, 1.f}}}), "");
}

TEST(SamplerTest, MinTokensSuppressesEndTokensUntilTheIndexReachesIt) {
  Sampler sampler;
  const std::vector<float> logits{0.f, 3.f, 1.f, 2.5f, -1.f};  // greedy: 1
  const SamplingOptions o{.min_tokens = 2, .min_tokens_suppressed_ids = {1, 3}};
  EXPECT_EQ(sampler.Sample(logits.data(), 5, o, 0), 2);  // 1 and 3 suppressed: next best
  EXPECT_EQ(sampler.Sample(logits.data(), 5, o, 1), 2);
  EXPECT_EQ(sampler.Sample(logits.data(), 5, o, 2), 1);  // two generated: free again
  // Sampling never draws a suppressed token, whatever the draw.
  const SamplingOptions t{.temperature = 2.f, .seed = 9, .min_tokens = 1000, .min_tokens_suppressed_ids = {1}};
  for (int32_t i = 0; i < 500; ++i) ASSERT_NE(sampler.Sample(logits.data(), 5, t, i), 1);
  EXPECT_NE(CheckSamplingOptions({.min_tokens = -1}), "");
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

TEST(SamplerTest, CheckSamplingOptionsRanges) {
  EXPECT_EQ(CheckSamplingOptions({}), "");
  EXPECT_EQ(CheckSamplingOptions({.min_p = 1.f, .presence_penalty = -2.f, .frequency_penalty = 2.f,
                                  .repetition_penalty = 0.5f, .logprobs = 20}),
            "");
  for (const SamplingOptions& bad :
       {SamplingOptions{.temperature = -1.f}, SamplingOptions{.top_p = 0.f},
        SamplingOptions{.top_p = 1.5f}, SamplingOptions{.top_k = -1},
        SamplingOptions{.min_p = -0.1f}, SamplingOptions{.min_p = 1.1f},
        SamplingOptions{.presence_penalty = 2.5f}, SamplingOptions{.frequency_penalty = -2.5f},
        SamplingOptions{.repetition_penalty = 0.f}, SamplingOptions{.logprobs = -2},
        SamplingOptions{.logprobs = 21}, SamplingOptions{.temperature = NAN}}) {
    EXPECT_NE(CheckSamplingOptions(bad), "");
  }
  EXPECT_NE(CheckSamplingOptions({.min_p = 2.f}).find("min_p"), std::string::npos);
}

TEST(SamplerTest, TopKNeverOutsideTopK) {
  Sampler sampler;
  const int32_t vocab = 1000;
  for (int32_t k : {1, 2, 5, 40, 600}) {
    const auto logits = RandomLogits(vocab, k);
    const auto order = RefOrder(logits);
    const std::set<int32_t> allowed(order.begin(), order.begin() + k);
    const SamplingOptions opts{.temperature = 5.f, .top_k = k, .seed = 9};
    std::set<int32_t> seen;
    for (int32_t i = 0; i < 1000 + 20 * k; ++i) {
      const int32_t t = sampler.Sample(logits.data(), vocab, opts, i);
      ASSERT_TRUE(allowed.count(t)) << "k=" << k << " draw " << i << " got " << t;
      seen.insert(t);
    }
    EXPECT_EQ(seen.size(), static_cast<size_t>(k)) << "high temperature reaches all of top k";
  }
}

TEST(SamplerTest, TopKMatchesRenormalisedDistribution) {
  const auto logits = RandomLogits(500, 4, 1.f);
  const int n = 20000;
  for (float t : {0.7f, 1.f, 1.8f}) {
    // 300 takes the nth_element path rather than the bounded heap.
    for (int32_t k : {8, 300}) {
      SCOPED_TRACE("temperature " + std::to_string(t) + " k " + std::to_string(k));
      const auto counts = Histogram(logits, {.temperature = t, .top_k = k, .seed = 21}, n);
      ExpectDistribution(counts, Renormalised(logits, k, t), n);
    }
  }
}

TEST(SamplerTest, TopPKeepsSmallestSetReachingMass) {
  // Probabilities 0.5, 0.3, 0.15, 0.05 at temperature 1.
  const std::vector<float> logits{std::log(0.15f), std::log(0.5f), std::log(0.05f),
                                  std::log(0.3f)};
  const auto counts = Histogram(logits, {.temperature = 1.f, .top_p = 0.75f, .seed = 3}, 20000);
  // 0.5 < 0.75 <= 0.8: tokens 1 and 3 only, renormalised to 0.625 / 0.375.
  ExpectDistribution(counts, {{1, 0.625}, {3, 0.375}}, 20000);
}

TEST(SamplerTest, TopPNucleusAndFrequenciesOnRandomLogits) {
  const int n = 20000;
  for (float top_p : {0.3f, 0.6f, 0.9f}) {
    for (float t : {0.8f, 1.5f}) {
      SCOPED_TRACE("top_p " + std::to_string(top_p) + " temperature " + std::to_string(t));
      const auto logits = RandomLogits(300, 17, 1.f);
      const size_t keep = RefNucleusSize(logits, top_p, t);
      const auto counts = Histogram(logits, {.temperature = t, .top_p = top_p, .seed = 5}, n);
      ExpectDistribution(counts, Renormalised(logits, keep, t), n);
    }
  }
}

// A nucleus of thousands of tokens in a Qwen-sized vocab: the chunked partial sort must still
// find exactly the reference nucleus.
TEST(SamplerTest, TopPLargeNucleusInFullVocab) {
  const int32_t vocab = 151936;
  const auto logits = RandomLogits(vocab, 8, 1.f);
  const auto order = RefOrder(logits);
  std::vector<int32_t> rank(vocab);
  for (int32_t i = 0; i < vocab; ++i) rank[order[i]] = i;
  const size_t keep = RefNucleusSize(logits, 0.5, 1.0);
  ASSERT_GT(keep, 5000u);
  Sampler sampler;
  const SamplingOptions opts{.temperature = 1.f, .top_p = 0.5f, .seed = 77};
  int32_t max_rank = 0;
  for (int32_t i = 0; i < 300; ++i) {
    const int32_t t = sampler.Sample(logits.data(), vocab, opts, i);
    ASSERT_LT(size_t(rank[t]), keep) << "draw " << i;
    max_rank = std::max(max_rank, rank[t]);
  }
  EXPECT_GT(size_t(max_rank), keep / 2) << "draws reach deep into the nucleus";
}

TEST(SamplerTest, MinPDropsTokensBelowThreshold) {
  // p = 0.4, 0.25, 0.15, 0.1, 0.06, 0.04; min_p 0.3 keeps p >= 0.12: ids 0, 1, 2.
  const std::vector<float> logits{std::log(0.4f),  std::log(0.25f), std::log(0.15f),
                                  std::log(0.1f),  std::log(0.06f), std::log(0.04f)};
  const int n = 20000;
  auto counts = Histogram(logits, {.temperature = 1.f, .min_p = 0.3f, .seed = 8}, n);
  ExpectDistribution(counts, Renormalised(logits, 3), n);
  // min_p 1 keeps only the most likely token.
  counts = Histogram(logits, {.temperature = 1.f, .min_p = 1.f, .seed = 8}, 500);
  EXPECT_EQ(counts, (std::map<int32_t, int>{{0, 500}}));
  // After top-p: the shorter of the nucleus (0.9 -> 4 or 5 ids) and the min-p set (3 ids) ...
  counts = Histogram(logits, {.temperature = 1.f, .top_p = 0.9f, .min_p = 0.3f, .seed = 8}, n);
  ExpectDistribution(counts, Renormalised(logits, 3), n);
  // ... and here the nucleus (0.6 -> 2 ids) is the shorter.
  counts = Histogram(logits, {.temperature = 1.f, .top_p = 0.6f, .min_p = 0.3f, .seed = 8}, n);
  ExpectDistribution(counts, Renormalised(logits, 2), n);
}

TEST(SamplerTest, MinPThresholdOnRandomLogitsAfterTemperature) {
  const auto logits = RandomLogits(2000, 12, 2.f);
  const double t = 1.3, min_p = 0.05;
  const auto p = RefSoftmax(logits, t);
  const double p_max = *std::max_element(p.begin(), p.end());
  size_t keep = 0;
  for (double x : p) keep += x >= min_p * p_max;
  ASSERT_GT(keep, 3u);
  const int n = 20000;
  const auto counts =
      Histogram(logits, {.temperature = float(t), .min_p = float(min_p), .seed = 2}, n);
  ExpectDistribution(counts, Renormalised(logits, keep, t), n);
}

TEST(SamplerTest, TemperatureScalesFrequencies) {
  const std::vector<float> logits{0.f, std::log(3.f)};  // 0.25 / 0.75 at temperature 1
  const int n = 20000;
  for (double t : {0.5, 1.0, 2.0}) {
    SCOPED_TRACE("temperature " + std::to_string(t));
    const double p1 = std::pow(3.0, 1 / t) / (1 + std::pow(3.0, 1 / t));
    const auto counts = Histogram(logits, {.temperature = float(t), .seed = 11}, n);
    ExpectDistribution(counts, {{0, 1 - p1}, {1, p1}}, n);
  }
}

TEST(SamplerTest, TokenCountsSplitPromptAndGenerated) {
  // Prompt 5 5 9, generated 9 4 4.
  TokenCounts c = Counts({5, 5, 9, 9, 4, 4}, 3);
  std::map<int32_t, std::pair<int32_t, bool>> got;
  for (const auto& e : c.entries()) got[e.token_id] = {e.num_generated, e.in_prompt};
  EXPECT_EQ(got, (std::map<int32_t, std::pair<int32_t, bool>>{
                     {5, {0, true}}, {9, {1, true}}, {4, {2, false}}}));
  // Extending one token at a time equals rebuilding from the whole history.
  TokenCounts inc = Counts({5, 5, 9}, 0);
  for (int32_t t : {9, 4, 4}) inc.AddGenerated(t);
  std::map<int32_t, std::pair<int32_t, bool>> inc_got;
  for (const auto& e : inc.entries()) inc_got[e.token_id] = {e.num_generated, e.in_prompt};
  EXPECT_EQ(inc_got, got);
}

TEST(SamplerTest, PresenceAndFrequencyShiftGeneratedTokensExactly) {
  std::vector<float> logits{1.f, 0.5f, -0.25f, 2.f};
  // Prompt: 3; generated: 0 0 2.
  const TokenCounts c = Counts({3, 0, 0, 2}, 3);
  const SamplingOptions opts{.presence_penalty = 0.3f, .frequency_penalty = -0.7f};
  ApplyPenalties(logits.data(), opts, c);
  EXPECT_EQ(logits[0], 1.f - (0.3f + -0.7f * 2.f));
  EXPECT_EQ(logits[1], 0.5f);  // never seen
  EXPECT_EQ(logits[2], -0.25f - (0.3f + -0.7f * 1.f));
  EXPECT_EQ(logits[3], 2.f);  // prompt only: OpenAI penalties ignore it
}

// Greedy is argmax after penalties: token 0 (logit 1, generated twice) against token 1
// (logit 0.5) flips exactly where 1 - presence - 2 * frequency drops below 0.5; an exact tie
// keeps the lower id.
TEST(SamplerTest, GreedyFlipsAtThePenaltyThatCrossesTheRunnerUp) {
  Sampler sampler;
  const std::vector<float> logits{1.f, 0.5f, -3.f};
  const TokenCounts c = Counts({2, 0, 0}, 2);
  auto greedy = [&](SamplingOptions o) {
    return sampler.Sample(logits.data(), 3, o, &c, 0).token_id;
  };
  EXPECT_EQ(greedy({.frequency_penalty = 0.24f}), 0);
  EXPECT_EQ(greedy({.frequency_penalty = 0.25f}), 0);  // 0.5 == 0.5: lower id
  EXPECT_EQ(greedy({.frequency_penalty = 0.26f}), 1);
  EXPECT_EQ(greedy({.presence_penalty = 0.49f}), 0);
  EXPECT_EQ(greedy({.presence_penalty = 0.51f}), 1);
  EXPECT_EQ(greedy({.presence_penalty = 0.2f, .frequency_penalty = 0.14f}), 0);  // 0.52
  EXPECT_EQ(greedy({.presence_penalty = 0.2f, .frequency_penalty = 0.16f}), 1);  // 0.48
  // Without history the penalties do nothing.
  EXPECT_EQ(sampler.Sample(logits.data(), 3, {.presence_penalty = 2.f}, nullptr, 0).token_id, 0);
  // Prompt-only occurrences do not count for presence / frequency.
  const TokenCounts prompt_only = Counts({0, 0, 0}, 0);
  EXPECT_EQ(sampler.Sample(logits.data(), 3, {.presence_penalty = 2.f}, &prompt_only, 0).token_id,
            0);
}

TEST(SamplerTest, RepetitionPenaltyDividesPositiveMultipliesNegative) {
  std::vector<float> logits{2.f, -2.f, 1.f, -1.f, 0.f};
  // Prompt: 0 4; generated: 1. Ids 2 and 3 never seen.
  const TokenCounts c = Counts({0, 4, 1}, 1);
  ApplyPenalties(logits.data(), {.repetition_penalty = 2.f}, c);
  EXPECT_EQ(logits, (std::vector<float>{1.f, -4.f, 1.f, -1.f, 0.f}));
  // Below 1 it rewards instead.
  // (The logits cover every id the counts hold: a shorter row was read past its end, ASan.)
  std::vector<float> more{2.f, -2.f, 1.f, -1.f, 0.f};
  ApplyPenalties(more.data(), {.repetition_penalty = 0.5f}, c);
  EXPECT_EQ(more, (std::vector<float>{4.f, -1.f, 1.f, -1.f, 0.f}));
}

TEST(SamplerTest, GreedyFlipsAtTheRepetitionPenaltyThatCrossesTheRunnerUp) {
  Sampler sampler;
  const std::vector<float> pos{2.f, 1.5f};  // token 0 in the prompt: 2 / r < 1.5 iff r > 4/3
  const TokenCounts in_prompt = Counts({0}, 0);
  auto greedy = [&](const std::vector<float>& l, float r, const TokenCounts& c) {
    return sampler.Sample(l.data(), 2, {.repetition_penalty = r}, &c, 0).token_id;
  };
  EXPECT_EQ(greedy(pos, 1.3f, in_prompt), 0);
  EXPECT_EQ(greedy(pos, 1.4f, in_prompt), 1);
  // Negative logits: token 0 generated; -1 * r < -1.2 iff r > 1.2.
  const std::vector<float> neg{-1.f, -1.2f};
  const TokenCounts only_0 = Counts({0}, 1);
  EXPECT_EQ(greedy(neg, 1.1f, only_0), 0);
  EXPECT_EQ(greedy(neg, 1.3f, only_0), 1);
  // When both occurred (1 in the prompt, 0 generated) both scale and the order stays.
  EXPECT_EQ(greedy(neg, 1.5f, Counts({1, 0}, 1)), 0);
}

// Penalties come before temperature: logits (0, 0), token 0 generated once, presence ln 2
// halves its weight before dividing by the temperature.
TEST(SamplerTest, PenaltiesApplyBeforeTemperature) {
  const std::vector<float> logits{0.f, 0.f};
  const TokenCounts c = Counts({0}, 1);
  const int n = 20000;
  for (double t : {1.0, 2.0}) {
    const double w0 = std::exp(-std::log(2.0) / t);
    const auto counts = Histogram(
        logits, {.temperature = float(t), .presence_penalty = float(std::log(2.0)), .seed = 4}, n,
        &c);
    ExpectDistribution(counts, {{0, w0 / (1 + w0)}, {1, 1 / (1 + w0)}}, n);
  }
}

void ExpectLogprobsMatchReference(const std::vector<float>& logits, const SamplingOptions& opts,
                                  const TokenCounts* history) {
  Sampler sampler;
  const auto p = RefSoftmax(logits);  // of the raw logits, whatever the options
  const auto order = RefOrder(logits);
  const int32_t vocab = int32_t(logits.size());
  for (int32_t i = 0; i < 20; ++i) {
    const SampleResult r = sampler.Sample(logits.data(), vocab, opts, history, i);
    EXPECT_NEAR(std::exp(double{r.logprob}), p[r.token_id], 1e-5);
    const size_t n = std::min<size_t>(std::max(opts.logprobs, 0), logits.size());
    ASSERT_EQ(r.top_logprobs.size(), n);
    for (size_t j = 0; j < n; ++j) {
      EXPECT_EQ(r.top_logprobs[j].first, order[j]) << "rank " << j;
      EXPECT_NEAR(std::exp(double{r.top_logprobs[j].second}), p[order[j]], 1e-5);
    }
  }
}

TEST(SamplerTest, LogprobsAreOfRawLogitsWithTopNInOrder) {
  auto logits = RandomLogits(5000, 31, 3.f);
  logits[17] = logits[4000] = logits[250] = 9.f;  // tied most likely: ids 17, 250, 4000
  const TokenCounts c = Counts({17, 250, 3, 3}, 2);
  for (int32_t n : {0, 1, 5, 20}) {
    SCOPED_TRACE("logprobs " + std::to_string(n));
    ExpectLogprobsMatchReference(logits, {.logprobs = n}, nullptr);
    ExpectLogprobsMatchReference(
        logits,
        {.temperature = 0.7f, .top_p = 0.9f, .top_k = 50, .min_p = 0.01f, .presence_penalty = 1.f,
         .frequency_penalty = 0.5f, .repetition_penalty = 1.3f, .logprobs = n, .seed = 6},
        &c);
  }
  // Fewer tokens than requested: all of them.
  ExpectLogprobsMatchReference({0.5f, 0.5f, -1.f}, {.temperature = 1.f, .logprobs = 20}, nullptr);
}

TEST(SamplerTest, LogprobsOffLeavesResultEmpty) {
  Sampler sampler;
  const auto logits = RandomLogits(100, 3);
  const SampleResult r = sampler.Sample(logits.data(), 100, {.logprobs = -1}, nullptr, 0);
  EXPECT_EQ(r.logprob, 0.f);
  EXPECT_TRUE(r.top_logprobs.empty());
}

TEST(SamplerTest, LogprobsInFullVocab) {
  const auto logits = RandomLogits(151936, 41, 2.f);
  ExpectLogprobsMatchReference(logits, {.temperature = 1.f, .logprobs = 20, .seed = 1}, nullptr);
}

TEST(SamplerTest, SameSeedAndIndexSameToken) {
  const auto logits = RandomLogits(5000, 1);
  const TokenCounts c = Counts({1, 2, 3, 2, 7, 7, 7}, 4);
  const SamplingOptions opts{.temperature = 0.8f, .top_p = 0.9f, .top_k = 50, .min_p = 0.02f,
                             .presence_penalty = 0.5f, .frequency_penalty = 0.3f,
                             .repetition_penalty = 1.2f, .logprobs = 3, .seed = 1234};
  Sampler a, b;
  for (int32_t i = 0; i < 200; ++i) {
    // Interleave other work on b so reused scratch cannot leak between calls.
    const auto other = RandomLogits(300, i);
    b.Sample(other.data(), 300, {.temperature = 1.f, .top_p = 0.5f, .seed = 5}, i);
    const SampleResult ra = a.Sample(logits.data(), 5000, opts, &c, i);
    const SampleResult rb = b.Sample(logits.data(), 5000, opts, &c, i);
    EXPECT_EQ(ra.token_id, rb.token_id);
    EXPECT_EQ(ra.logprob, rb.logprob);
    EXPECT_EQ(ra.top_logprobs, rb.top_logprobs);
  }
}

}  // namespace
}  // namespace ferry::worker
