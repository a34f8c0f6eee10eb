// The batched device sampler against a small host reference in double (the comparison with the
// CPU engine's Sampler is worker/gpu/device_sampler_test.cc). Runs only where a GPU is present,
// except the argument checks, which launch nothing.
#include "kernels/cuda/sampler.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <numeric>
#include <random>
#include <vector>

#include "kernels/cuda/counter_uniform.h"
#include "kernels/cuda/test_util.h"

namespace ferry::kernels::cuda {
namespace {

using testing::DeviceVector;

constexpr float kInf = std::numeric_limits<float>::infinity();

// Rows' parameters plus the arena their entries and masks live in.
struct Batch {
  std::vector<SamplerRowParams> params;
  std::vector<uint32_t> arena = {0};  // never empty: the launcher wants a pointer

  template <typename T>
  int32_t Append(const std::vector<T>& items) {
    static_assert(sizeof(T) % 4 == 0);
    const int32_t offset = static_cast<int32_t>(arena.size());
    arena.resize(arena.size() + items.size() * sizeof(T) / 4);
    if (!items.empty()) std::memcpy(arena.data() + offset, items.data(), items.size() * sizeof(T));
    return offset;
  }
  void SetBias(SamplerRowParams* p, std::vector<SamplerBias> bias) {
    std::stable_sort(bias.begin(), bias.end(), [](auto& a, auto& b) { return a.token_id < b.token_id; });
    p->bias_offset = Append(bias);
    p->num_bias = static_cast<int32_t>(bias.size());
  }
  void SetPenalties(SamplerRowParams* p, const std::vector<SamplerPenalty>& penalties) {
    p->penalty_offset = Append(penalties);
    p->num_penalties = static_cast<int32_t>(penalties.size());
  }
  void SetMask(SamplerRowParams* p, const std::vector<bool>& allowed) {
    std::vector<uint32_t> words((allowed.size() + 31) / 32, 0);
    for (size_t i = 0; i < allowed.size(); ++i) words[i / 32] |= uint32_t{allowed[i]} << (i % 32);
    p->mask_offset = Append(words);
  }
};

std::vector<SamplerResult> SampleOnDevice(const std::vector<float>& logits, int vocab, const Batch& batch) {
  const int rows = static_cast<int>(batch.params.size());
  DeviceVector<float> d_logits(logits);
  DeviceVector<SamplerRowParams> d_params(batch.params);
  DeviceVector<uint32_t> d_arena(batch.arena);
  DeviceVector<float> d_scratch(size_t(rows) * vocab);
  DeviceVector<SamplerResult> d_out(rows);
  EXPECT_EQ(Sample({d_logits.get(), d_params.get(), d_arena.get(), d_scratch.get(), d_out.get(), rows, vocab, nullptr}),
            0);
  return d_out.ToHost();
}

// The reference: the row after bias, mask and penalties (the CPU's order), in float as the kernel.
std::vector<float> Effective(const float* raw, int vocab, const SamplerRowParams& p, const Batch& b) {
  std::vector<float> x(raw, raw + vocab);
  const auto* bias = reinterpret_cast<const SamplerBias*>(b.arena.data() + p.bias_offset);
  for (int j = 0; j < p.num_bias; ++j) x[bias[j].token_id] += bias[j].bias;
  if (p.mask_offset >= 0) {
    for (int i = 0; i < vocab; ++i) {
      if (((b.arena[p.mask_offset + i / 32] >> (i % 32)) & 1u) == 0) x[i] = -kInf;
    }
  }
  const auto* pen = reinterpret_cast<const SamplerPenalty*>(b.arena.data() + p.penalty_offset);
  for (int j = 0; j < p.num_penalties; ++j) {
    float& v = x[pen[j].token_id];
    if (p.repetition_penalty != 1.f) v = v > 0.f ? v / p.repetition_penalty : v * p.repetition_penalty;
    if (pen[j].num_generated > 0) {
      const volatile float f = p.frequency_penalty * static_cast<float>(pen[j].num_generated);
      v -= p.presence_penalty + f;
    }
  }
  return x;
}

int32_t ReferenceArgmax(const std::vector<float>& x) {
  int32_t best = 0;
  for (int32_t i = 1; i < static_cast<int32_t>(x.size()); ++i) {
    if (x[i] > x[best]) best = i;
  }
  return best;
}

// The kept set and each kept id's probability, in double.
std::vector<std::pair<int32_t, double>> ReferenceKept(const std::vector<float>& eff, const SamplerRowParams& p) {
  const int vocab = static_cast<int>(eff.size());
  std::vector<float> c(vocab);
  for (int i = 0; i < vocab; ++i) c[i] = eff[i] * p.inv_temperature;
  std::vector<int32_t> order(vocab);
  std::iota(order.begin(), order.end(), 0);
  std::stable_sort(order.begin(), order.end(), [&](int32_t a, int32_t b) { return c[a] > c[b]; });
  const double max = c[order[0]];
  auto w = [&](int32_t i) { return std::exp(double(c[i]) - max); };
  size_t n = vocab;
  if (p.top_k > 0 && p.top_k < vocab) n = p.top_k;
  if (p.top_p < 1.f) {
    double mass = 0;
    for (size_t j = 0; j < n; ++j) mass += w(order[j]);
    double acc = 0;
    for (size_t j = 0; j < n; ++j) {
      acc += w(order[j]);
      if (acc >= p.top_p * mass) {
        n = j + 1;
        break;
      }
    }
  }
  size_t m = 0;
  while (m < n && double(c[order[m]]) - max >= p.min_p_log) ++m;
  double total = 0;
  for (size_t j = 0; j < m; ++j) total += w(order[j]);
  std::vector<std::pair<int32_t, double>> kept;
  for (size_t j = 0; j < m; ++j) kept.emplace_back(order[j], w(order[j]) / total);
  return kept;
}

TEST(CudaSampler, ArgumentsAreChecked) {  // runs without a GPU: nothing is launched
  float f = 0.f;
  SamplerRowParams params;
  uint32_t arena = 0;
  SamplerResult out{};
  const SampleArgs good{&f, &params, &arena, &f, &out, 1, 1, nullptr};
  auto with = [&](auto edit) {
    SampleArgs a = good;
    edit(a);
    return Sample(a);
  };
  const int invalid = static_cast<int>(cudaErrorInvalidValue);
  EXPECT_EQ(with([](SampleArgs& a) { a.logits = nullptr; }), invalid);
  EXPECT_EQ(with([](SampleArgs& a) { a.params = nullptr; }), invalid);
  EXPECT_EQ(with([](SampleArgs& a) { a.arena = nullptr; }), invalid);
  EXPECT_EQ(with([](SampleArgs& a) { a.scratch = nullptr; }), invalid);
  EXPECT_EQ(with([](SampleArgs& a) { a.out = nullptr; }), invalid);
  EXPECT_EQ(with([](SampleArgs& a) { a.vocab = 0; }), invalid);
  EXPECT_EQ(with([](SampleArgs& a) { a.vocab = kSamplerMaxVocab + 1; }), invalid);
  EXPECT_EQ(with([](SampleArgs& a) { a.num_rows = -1; }), invalid);
  EXPECT_EQ(with([](SampleArgs& a) { a.num_rows = 0; }), 0);  // an empty batch is a no-op
}

// Greedy rows, plain and after bias, suppression, mask and penalties: the reference's argmax
// exactly, ties (and -0 against +0) to the lowest id.
TEST(CudaSampler, GreedyMatchesReference) {
  FERRY_SKIP_WITHOUT_GPU();
  std::mt19937 rng(testing::TestSeed());
  for (int vocab : {151936, 1000, 33}) {
    const int rows = 6;
    auto logits = testing::RandomVector(size_t(rows) * vocab, rng, 3.f);
    logits[size_t(1) * vocab + 5] = logits[size_t(1) * vocab + 3] = 50.f;  // a tie
    // -0 and +0 tie: the lower id (holding -0) wins.
    for (int i = 0; i < vocab; ++i) logits[size_t(2) * vocab + i] = i == 7 ? -0.f : (i == 9 ? 0.f : -1.f);
    Batch b;
    b.params.resize(rows);
    for (int r = 0; r < rows; ++r) b.params[r].logits_row = r;
    std::uniform_int_distribution<int32_t> id(0, vocab - 1);
    b.SetBias(&b.params[3], {{id(rng), 5.f}, {id(rng), -kInf}, {3, 2.f}, {3, -1.5f}});
    std::vector<SamplerPenalty> pen;
    for (int j = 0; j < std::min(vocab, 300); j += 3) pen.push_back({j, j % 4});
    b.params[4].repetition_penalty = 1.3f;
    b.params[4].presence_penalty = 0.5f;
    b.params[4].frequency_penalty = 0.25f;
    b.SetPenalties(&b.params[4], pen);
    std::vector<bool> allowed(vocab);
    for (int i = 0; i < vocab; ++i) allowed[i] = i % 5 == 1;
    b.SetMask(&b.params[5], allowed);
    b.SetBias(&b.params[5], {{1, -kInf}});
    const auto out = SampleOnDevice(logits, vocab, b);
    for (int r = 0; r < rows; ++r) {
      const auto eff = Effective(logits.data() + size_t(r) * vocab, vocab, b.params[r], b);
      EXPECT_EQ(out[r].token_id, ReferenceArgmax(eff)) << "vocab " << vocab << " row " << r;
    }
  }
}

// Top-k / top-p / min-p with temperature: every draw is in the reference's kept set, and over a
// sweep of seeds the counts match its probabilities: chi-square below df + 6 sqrt(2 df) (about
// six standard deviations; the reference's own rounding is far below the sampling noise), rare
// tokens pooled into one cell.
TEST(CudaSampler, KeptSetAndDistributionMatchReference) {
  FERRY_SKIP_WITHOUT_GPU();
  std::mt19937 rng(testing::TestSeed());
  const int vocab = 300, draws = 20000;
  const auto logits = testing::RandomVector(vocab, rng, 2.f);
  struct Case {
    float t, top_p, min_p;
    int top_k;
  };
  for (const Case c : {Case{0.7f, 0.8f, 0.f, 20}, Case{1.f, 1.f, 0.f, 7}, Case{1.3f, 0.9f, 0.f, 0},
                       Case{0.8f, 1.f, 0.05f, 0}, Case{1.f, 0.5f, 0.1f, 50}}) {
    Batch b;
    SamplerRowParams p;
    p.is_greedy = 0;
    p.inv_temperature = 1.f / c.t;
    p.top_k = c.top_k;
    p.top_p = c.top_p;
    p.min_p_log = c.min_p > 0 ? std::log(double{c.min_p}) : -INFINITY;
    p.seed = rng();
    for (int d = 0; d < draws; ++d) {
      p.sample_index = d;
      b.params.push_back(p);
    }
    const auto out = SampleOnDevice(logits, vocab, b);
    const auto kept = ReferenceKept(logits, p);
    std::vector<double> counts(vocab, 0);
    for (const auto& r : out) counts[r.token_id] += 1;
    // Tokens expected fewer than 5 times share one cell (chi-square needs populated cells).
    double chi2 = 0, in_kept = 0, pooled_seen = 0, pooled_expected = 0;
    int cells = 0;
    for (const auto& [id, prob] : kept) {
      in_kept += counts[id];
      const double expected = draws * prob;
      if (expected < 5) {
        pooled_seen += counts[id];
        pooled_expected += expected;
        continue;
      }
      chi2 += (counts[id] - expected) * (counts[id] - expected) / expected;
      ++cells;
    }
    if (pooled_expected > 0) {
      chi2 += (pooled_seen - pooled_expected) * (pooled_seen - pooled_expected) / pooled_expected;
      ++cells;
    }
    EXPECT_EQ(in_kept, draws) << "draws outside the kept set, t " << c.t << " top_k " << c.top_k;
    const double df = std::max(1, cells - 1);
    EXPECT_LT(chi2, df + 6 * std::sqrt(2 * df)) << "kept " << kept.size() << " t " << c.t << " top_k " << c.top_k;
  }
}

// Logprobs of the raw logits: the token's and the top 20 (ties by lower id) within 1e-4 of a
// double log-softmax, and identical whatever shares the batch.
TEST(CudaSampler, LogprobsAndBatchInvariance) {
  FERRY_SKIP_WITHOUT_GPU();
  std::mt19937 rng(testing::TestSeed());
  const int vocab = 151936, rows = 5;
  auto logits = testing::RandomVector(size_t(rows) * vocab, rng, 4.f);
  logits[100] = logits[50] = logits[70] = 30.f;  // ties at the top of row 0
  Batch b;
  for (int r = 0; r < rows; ++r) {
    SamplerRowParams p;
    p.logits_row = r;
    p.is_greedy = r % 2;
    p.inv_temperature = 1.f / 0.7f;
    p.top_k = 40;
    p.top_p = 0.9f;
    p.seed = 1234 + r;
    p.sample_index = 17;
    p.num_top_logprobs = r == 1 ? 0 : 20;
    b.params.push_back(p);
  }
  b.params[3].repetition_penalty = 1.1f;
  b.SetPenalties(&b.params[3], {{1, 2}, {2, 0}, {3, 1}});
  const auto out = SampleOnDevice(logits, vocab, b);
  for (int r = 0; r < rows; ++r) {
    const float* row = logits.data() + size_t(r) * vocab;
    const double max = *std::max_element(row, row + vocab);
    double sum = 0;
    for (int i = 0; i < vocab; ++i) sum += std::exp(row[i] - max);
    const double log_z = max + std::log(sum);
    EXPECT_NEAR(out[r].logprob, row[out[r].token_id] - log_z, 1e-4) << r;
    std::vector<int32_t> order(vocab);
    std::iota(order.begin(), order.end(), 0);
    std::partial_sort(order.begin(), order.begin() + 20, order.end(),
                      [&](int32_t x, int32_t y) { return row[x] > row[y] || (row[x] == row[y] && x < y); });
    for (int j = 0; j < b.params[r].num_top_logprobs; ++j) {
      EXPECT_EQ(out[r].top_ids[j], order[j]) << r << " " << j;
      EXPECT_NEAR(out[r].top_logprobs[j], row[order[j]] - log_z, 1e-4) << r << " " << j;
    }
  }
  // Each row alone, and the batch reversed: the same bytes.
  for (int r = 0; r < rows; ++r) {
    Batch alone = b;
    alone.params = {b.params[r]};
    const auto one = SampleOnDevice(logits, vocab, alone);
    EXPECT_EQ(std::memcmp(&one[0], &out[r], sizeof(SamplerResult)), 0) << r;
  }
  Batch reversed = b;
  std::reverse(reversed.params.begin(), reversed.params.end());
  const auto back = SampleOnDevice(logits, vocab, reversed);
  for (int r = 0; r < rows; ++r) EXPECT_EQ(std::memcmp(&back[rows - 1 - r], &out[r], sizeof(SamplerResult)), 0) << r;
}

}  // namespace
}  // namespace ferry::kernels::cuda
