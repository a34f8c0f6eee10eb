// The device sampler's host side (packing: runs everywhere) and, where a GPU is present, the
// device sampler end to end against the CPU engine's Sampler (worker/engine/sampler.h).
#include "worker/gpu/device_sampler.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <numeric>
#include <random>
#include <vector>

#include "kernels/cuda/counter_uniform.h"
#include "kernels/cuda/test_util.h"

namespace ferry::worker::gpu {
namespace {

namespace kcu = ferry::kernels::cuda;

constexpr float kInf = std::numeric_limits<float>::infinity();

// A packer over an ordinary buffer, and views of what it wrote.
struct Packed {
  SamplerPacker packer;
  std::vector<uint64_t> storage;  // 8-byte aligned, as the pinned buffer
  Packed(int32_t max_rows, int32_t max_entries, int32_t vocab)
      : packer(max_rows, max_entries, vocab), storage((packer.total_bytes() + 7) / 8, 0xabababababababab) {
    packer.Reset(storage.data());
  }
  const kcu::SamplerRowParams& params(int32_t slot) const {
    return reinterpret_cast<const kcu::SamplerRowParams*>(storage.data())[slot];
  }
  const uint32_t* arena() const {
    return reinterpret_cast<const uint32_t*>(reinterpret_cast<const char*>(storage.data()) + packer.params_bytes());
  }
  std::vector<kcu::SamplerBias> bias(int32_t slot) const {
    const auto* b = reinterpret_cast<const kcu::SamplerBias*>(arena() + params(slot).bias_offset);
    return {b, b + params(slot).num_bias};
  }
  std::vector<kcu::SamplerPenalty> penalties(int32_t slot) const {
    const auto* p = reinterpret_cast<const kcu::SamplerPenalty*>(arena() + params(slot).penalty_offset);
    return {p, p + params(slot).num_penalties};
  }
  bool MaskBit(int32_t slot, int32_t id) const {
    return (arena()[params(slot).mask_offset + id / 32] >> (id % 32)) & 1u;
  }
};

TEST(DeviceSamplerPacking, CounterUniformMatchesTheCpuSampler) {
  std::mt19937_64 rng(7);
  for (int i = 0; i < 100000; ++i) {
    const uint64_t seed = i < 4 ? std::vector<uint64_t>{0, 1, ~0ull, 1ull << 63}[i] : rng();
    const uint64_t counter = i % 3 == 0 ? static_cast<uint64_t>(i) : rng();
    ASSERT_EQ(kcu::CounterUniform(seed, counter), CounterUniform(seed, counter)) << seed << " " << counter;
  }
}

TEST(DeviceSamplerPacking, RowsParamsEntriesAndMaskBits) {
  const int32_t vocab = 1000;
  Packed pk(4, 100, vocab);
  SamplingOptions greedy;
  SamplingOptions qwen;  // Qwen2.5-Instruct's defaults, plus logprobs and min_p
  qwen.temperature = 0.7f;
  qwen.top_p = 0.8f;
  qwen.top_k = 20;
  qwen.min_p = 0.05f;
  qwen.repetition_penalty = 1.05f;
  qwen.presence_penalty = 0.5f;
  qwen.logprobs = 5;
  qwen.seed = 99;
  TokenCounts counts;
  counts.Reset({5, 7, 5, 9, 7, 7}, 2);  // prompt 5 7 5 9, generated 7 7
  SamplingOptions biased;
  biased.logit_bias = {{30, 1.f}, {2, -3.f}, {30, 2.5f}, {vocab + 5, 9.f}};
  biased.min_tokens = 3;
  biased.min_tokens_suppressed_ids = {30, 4, vocab + 1};
  biased.logprobs = 40;  // more than 20: capped as the CPU caps it
  const std::unique_ptr<const TokenMask> allowed = AllowedIdsMask({1, 63, 64, 999, 500}, vocab);

  EXPECT_EQ(pk.packer.Add({&greedy, nullptr, 0, nullptr, 3}), 0);
  EXPECT_EQ(pk.packer.Add({&qwen, &counts, 2, nullptr, 0}), 1);
  EXPECT_EQ(pk.packer.Add({&biased, nullptr, 2, allowed.get(), 2}), 2);

  const kcu::SamplerRowParams& g = pk.params(0);
  EXPECT_EQ(g.logits_row, 3);
  EXPECT_EQ(g.is_greedy, 1);
  EXPECT_EQ(g.num_bias + g.num_penalties, 0);
  EXPECT_EQ(g.mask_offset, -1);
  EXPECT_EQ(g.num_top_logprobs, -1);
  EXPECT_EQ(g.min_p_log, -std::numeric_limits<double>::infinity());

  const kcu::SamplerRowParams& q = pk.params(1);
  EXPECT_EQ(q.is_greedy, 0);
  EXPECT_EQ(q.inv_temperature, 1.f / 0.7f);
  EXPECT_EQ(q.top_k, 20);
  EXPECT_EQ(q.top_p, 0.8f);
  EXPECT_EQ(q.min_p_log, std::log(double{0.05f}));
  EXPECT_EQ(q.repetition_penalty, 1.05f);
  EXPECT_EQ(q.presence_penalty, 0.5f);
  EXPECT_EQ(q.num_top_logprobs, 5);
  EXPECT_EQ(q.seed, 99u);
  EXPECT_EQ(q.sample_index, 2u);
  const auto pen = pk.penalties(1);
  ASSERT_EQ(pen.size(), counts.entries().size());
  for (size_t j = 0; j < pen.size(); ++j) {
    EXPECT_EQ(pen[j].token_id, counts.entries()[j].token_id);
    EXPECT_EQ(pen[j].num_generated, counts.entries()[j].num_generated);
  }
  EXPECT_EQ(pen[1].num_generated, 2);  // token 7: twice generated (and in the prompt)

  // Sorted by id, equal ids in the order the CPU applies them: bias entries, then -inf.
  const kcu::SamplerRowParams& b = pk.params(2);
  EXPECT_EQ(b.num_top_logprobs, 20);
  const auto bias = pk.bias(2);
  ASSERT_EQ(bias.size(), 5u);
  EXPECT_EQ(bias[0].token_id, 2);
  EXPECT_EQ(bias[0].bias, -3.f);
  EXPECT_EQ(bias[1].token_id, 4);
  EXPECT_EQ(bias[1].bias, -kInf);
  EXPECT_EQ(bias[2].token_id, 30);
  EXPECT_EQ(bias[2].bias, 1.f);
  EXPECT_EQ(bias[3].token_id, 30);
  EXPECT_EQ(bias[3].bias, 2.5f);
  EXPECT_EQ(bias[4].token_id, 30);
  EXPECT_EQ(bias[4].bias, -kInf);
  ASSERT_GE(b.mask_offset, 0);
  for (int32_t id = 0; id < vocab; ++id) EXPECT_EQ(pk.MaskBit(2, id), allowed->Test(id)) << id;
  for (int32_t id = vocab; id < pk.packer.mask_words() * 32; ++id) EXPECT_FALSE(pk.MaskBit(2, id)) << id;

  // Entries and masks lie one after another; the upload is the params region plus that prefix.
  EXPECT_EQ(q.penalty_offset, g.penalty_offset);  // greedy row: nothing appended
  EXPECT_EQ(b.bias_offset, q.penalty_offset + 2 * q.num_penalties);
  EXPECT_EQ(b.mask_offset, b.penalty_offset);
  EXPECT_EQ(pk.packer.num_entries(), int32_t(pen.size() + bias.size()));
  EXPECT_EQ(pk.packer.used_bytes(),
            pk.packer.params_bytes() + 4 * size_t(2 * pk.packer.num_entries() + pk.packer.mask_words()));
  EXPECT_EQ(pk.packer.mask_words(), (vocab + 31) / 32);
}

TEST(DeviceSamplerPacking, SuppressionEndsAtMinTokensAndYieldsToAMaskItWouldEmpty) {
  const int32_t vocab = 200;
  Packed pk(4, 100, vocab);
  SamplingOptions o;
  o.logit_bias = {{8, 4.f}};
  o.min_tokens = 2;
  o.min_tokens_suppressed_ids = {150, 151};
  EXPECT_EQ(pk.packer.Add({&o, nullptr, 2, nullptr, 0}), 0);  // min_tokens reached: bias only
  ASSERT_EQ(pk.bias(0).size(), 1u);
  EXPECT_EQ(pk.bias(0)[0].bias, 4.f);

  // Only end-of-sequence ids allowed, all suppressed: the CPU samples them from raw logits.
  TokenMask only_eos(vocab);
  only_eos.Set(150);
  only_eos.Set(151);
  EXPECT_EQ(pk.packer.Add({&o, nullptr, 1, &only_eos, 0}), 1);
  EXPECT_TRUE(pk.bias(1).empty());
  EXPECT_TRUE(SuppressionEmptiesMask(only_eos, o.min_tokens_suppressed_ids));

  TokenMask more = only_eos;
  more.Set(8);
  EXPECT_EQ(pk.packer.Add({&o, nullptr, 1, &more, 0}), 2);
  EXPECT_EQ(pk.bias(2).size(), 3u);
  EXPECT_FALSE(SuppressionEmptiesMask(more, o.min_tokens_suppressed_ids));
}

TEST(DeviceSamplerPacking, RowsPastTheEntryCapacityAreLeftToTheHost) {
  const int32_t vocab = 100;
  Packed pk(3, 5, vocab);
  SamplingOptions o;
  o.repetition_penalty = 1.2f;
  TokenCounts four, three;
  four.Reset({1, 2, 3, 4}, 0);
  three.Reset({1, 2, 3}, 1);
  EXPECT_EQ(pk.packer.Add({&o, &four, 0, nullptr, 0}), 0);
  const size_t used = pk.packer.used_bytes();
  EXPECT_EQ(pk.packer.Add({&o, &three, 0, nullptr, 1}), -1);  // 4 + 3 > 5: nothing written
  EXPECT_EQ(pk.packer.num_rows(), 1);
  EXPECT_EQ(pk.packer.num_entries(), 4);
  EXPECT_EQ(pk.packer.used_bytes(), used);
  SamplingOptions plain;
  plain.temperature = 1.f;
  EXPECT_EQ(pk.packer.Add({&plain, &three, 0, nullptr, 1}), 1);  // no penalty: no entries
  TokenCounts one;
  one.Reset({9}, 0);
  EXPECT_EQ(pk.packer.Add({&o, &one, 0, nullptr, 2}), 2);
  EXPECT_EQ(pk.packer.Add({&plain, nullptr, 0, nullptr, 2}), -1);  // max_rows reached
  pk.packer.Reset(pk.storage.data());
  EXPECT_EQ(pk.packer.num_rows(), 0);
  EXPECT_EQ(pk.packer.used_bytes(), pk.packer.params_bytes());
}

TEST(DeviceSamplerPacking, BadInputIsRefusedNamingIt) {
  Packed pk(2, 10, 100);
  SamplingOptions o;
  o.repetition_penalty = 2.f;
  TokenMask wrong(64);
  EXPECT_THROW(
      {
        try {
          pk.packer.Add({&o, nullptr, 0, &wrong, 0});
        } catch (const std::invalid_argument& e) {
          EXPECT_STREQ(e.what(), "sampling mask over 64 ids, vocab is 100");
          throw;
        }
      },
      std::invalid_argument);
  TokenCounts past;
  past.Reset({3, 100}, 0);
  EXPECT_THROW(pk.packer.Add({&o, &past, 0, nullptr, 0}), std::invalid_argument);
  EXPECT_EQ(pk.packer.num_rows(), 0);
  EXPECT_THROW(SamplerPacker(0, 10, 100), std::invalid_argument);
  EXPECT_THROW(SamplerPacker(1, 10, kcu::kSamplerMaxVocab + 1), std::invalid_argument);
}

TEST(DeviceSamplerPacking, ResultsAsTheCpuReportsThem) {
  kcu::SamplerResult r{};
  r.token_id = 42;
  r.logprob = -1.5f;
  for (int j = 0; j < kcu::kSamplerMaxTopLogprobs; ++j) {
    r.top_ids[j] = 100 + j;
    r.top_logprobs[j] = -0.1f * j;
  }
  SamplingOptions o;
  SampleResult none = ToSampleResult(r, o, 1000);
  EXPECT_EQ(none.token_id, 42);
  EXPECT_EQ(none.logprob, 0.f);
  EXPECT_TRUE(none.top_logprobs.empty());
  o.logprobs = 3;
  SampleResult three = ToSampleResult(r, o, 1000);
  EXPECT_EQ(three.logprob, -1.5f);
  ASSERT_EQ(three.top_logprobs.size(), 3u);
  EXPECT_EQ(three.top_logprobs[2], (std::pair<int32_t, float>{102, -0.1f * 2}));
  EXPECT_EQ(ToSampleResult(r, o, 2).top_logprobs.size(), 2u);  // no more than the vocabulary
}


// ---------------------------------------------------------------------------------------------
// On the device, against the CPU Sampler (skipped without a GPU)

using kcu::testing::DeviceVector;

struct Row {
  SamplingOptions options;
  TokenCounts counts;
  int32_t sample_index = 0;
  std::unique_ptr<const TokenMask> mask;
};

// Samples rows (row r reads logits row r % rows_of_logits) through DeviceSampler.
std::vector<kcu::SamplerResult> DeviceSample(const std::vector<float>& logits, int32_t vocab,
                                             const std::vector<const Row*>& rows) {
  const int32_t num_logits = static_cast<int32_t>(logits.size() / vocab);
  DeviceSampler sampler({static_cast<int32_t>(rows.size()), vocab, 0});
  sampler.Begin();
  for (size_t r = 0; r < rows.size(); ++r) {
    const Row& row = *rows[r];
    EXPECT_EQ(sampler.Add({&row.options, &row.counts, row.sample_index, row.mask.get(), int32_t(r) % num_logits}),
              int32_t(r));
  }
  DeviceVector<float> d_logits(logits);
  sampler.Enqueue(d_logits.get(), nullptr);
  FERRY_CUDA_CHECK(cudaDeviceSynchronize());
  std::vector<kcu::SamplerResult> out;
  for (size_t r = 0; r < rows.size(); ++r) out.push_back(sampler.result(int32_t(r)));
  return out;
}

SampleResult CpuSample(const float* logits, int32_t vocab, const Row& row) {
  Sampler cpu;
  return cpu.Sample(logits, vocab, row.options, &row.counts, row.sample_index, row.mask.get());
}

// The rows of the comparison: penalties with history, bias, min_tokens, allowed ids, logprobs.
std::vector<Row> MixedRows(int32_t vocab, std::mt19937& rng) {
  std::uniform_int_distribution<int32_t> id(0, vocab - 1);
  std::vector<Row> rows(6);
  std::vector<int32_t> history;
  for (int i = 0; i < 300; ++i) history.push_back(id(rng));
  rows[1].options.repetition_penalty = 1.05f;
  rows[1].options.presence_penalty = 0.4f;
  rows[1].options.frequency_penalty = 0.3f;
  rows[1].counts.Reset(history, 100);
  rows[2].options.logit_bias = {{id(rng), 100.f}, {id(rng), -100.f}, {3, 5.f}, {3, 5.f}};
  rows[3].options.min_tokens = 4;
  rows[3].options.min_tokens_suppressed_ids = {id(rng), id(rng)};
  rows[3].sample_index = 1;
  rows[4].mask = AllowedIdsMask({id(rng), id(rng), id(rng), 17}, vocab);
  rows[4].options.logit_bias = {{17, -50.f}};
  rows[5].options.logprobs = 20;
  rows[5].options.repetition_penalty = 1.3f;
  rows[5].counts.Reset(history, 0);
  return rows;
}

TEST(DeviceSamplerGpu, GreedyAndLogprobsEqualTheCpuSampler) {
  FERRY_SKIP_WITHOUT_GPU();
  std::mt19937 rng(kcu::testing::TestSeed());
  for (int32_t vocab : {151936, 5000}) {
    std::vector<Row> rows = MixedRows(vocab, rng);
    for (Row& r : rows) r.options.logprobs = std::max(r.options.logprobs, 7);
    std::vector<const Row*> ptrs;
    for (const Row& r : rows) ptrs.push_back(&r);
    const auto logits = kcu::testing::RandomVector(rows.size() * vocab, rng, 3.f);
    const auto out = DeviceSample(logits, vocab, ptrs);
    for (size_t r = 0; r < rows.size(); ++r) {
      const SampleResult cpu = CpuSample(logits.data() + r * vocab, vocab, rows[r]);
      const SampleResult gpu = ToSampleResult(out[r], rows[r].options, vocab);
      EXPECT_EQ(gpu.token_id, cpu.token_id) << "vocab " << vocab << " row " << r;
      EXPECT_NEAR(gpu.logprob, cpu.logprob, 1e-4) << r;
      ASSERT_EQ(gpu.top_logprobs.size(), cpu.top_logprobs.size()) << r;
      for (size_t j = 0; j < cpu.top_logprobs.size(); ++j) {
        EXPECT_EQ(gpu.top_logprobs[j].first, cpu.top_logprobs[j].first) << r << " " << j;
        EXPECT_NEAR(gpu.top_logprobs[j].second, cpu.top_logprobs[j].second, 1e-4) << r << " " << j;
      }
    }
  }
}

// Temperature with top-k / top-p / min-p over the mixed rows, over a sweep of seeds: no token is
// drawn more than 20 times by one side and never by the other (that would be a kept-set
// difference), and
// the device's counts match the CPU's: a two-sample chi-square over the tokens either drew (rare
// ones pooled), below df + 6 sqrt(2 df) (about six standard deviations). The kept sets are equal up to a
// top-p boundary within float rounding of the target, which random logits do not hit.
TEST(DeviceSamplerGpu, SampledDistributionMatchesTheCpuSampler) {
  FERRY_SKIP_WITHOUT_GPU();
  std::mt19937 rng(kcu::testing::TestSeed());
  const int32_t vocab = 5000, draws = 4000;
  std::vector<Row> base = MixedRows(vocab, rng);
  const auto logits = kcu::testing::RandomVector(vocab, rng, 2.f);
  for (Row& proto : base) {
    proto.options.temperature = 0.7f;
    proto.options.top_k = 20;
    proto.options.top_p = 0.8f;
    proto.options.min_p = 0.02f;
    proto.options.seed = rng();
    std::vector<Row> sweep(draws);
    std::vector<const Row*> ptrs;
    std::vector<double> cpu(vocab, 0), gpu(vocab, 0);
    for (int d = 0; d < draws; ++d) {
      sweep[d].options = proto.options;
      sweep[d].counts = proto.counts;
      sweep[d].sample_index = proto.sample_index;  // the seed varies: min_tokens stays active for row 3
      sweep[d].options.seed = proto.options.seed + d;
      if (proto.mask) sweep[d].mask = std::make_unique<const TokenMask>(*proto.mask);
      ptrs.push_back(&sweep[d]);
      cpu[CpuSample(logits.data(), vocab, sweep[d]).token_id] += 1;
    }
    for (const auto& r : DeviceSample(logits, vocab, ptrs)) gpu[r.token_id] += 1;
    // Tokens drawn fewer than 10 times in all share one cell.
    double chi2 = 0, pooled_cpu = 0, pooled_gpu = 0;
    int cells = 0;
    for (int32_t i = 0; i < vocab; ++i) {
      EXPECT_FALSE((cpu[i] == 0) != (gpu[i] == 0) && cpu[i] + gpu[i] > 20) << "token " << i << " cpu " << cpu[i]
                                                                          << " gpu " << gpu[i];
      if (cpu[i] + gpu[i] < 10) {
        pooled_cpu += cpu[i];
        pooled_gpu += gpu[i];
        continue;
      }
      chi2 += (cpu[i] - gpu[i]) * (cpu[i] - gpu[i]) / (cpu[i] + gpu[i]);
      ++cells;
    }
    if (pooled_cpu + pooled_gpu > 0) {
      chi2 += (pooled_cpu - pooled_gpu) * (pooled_cpu - pooled_gpu) / (pooled_cpu + pooled_gpu);
      ++cells;
    }
    const double df = std::max(1, cells - 1);
    EXPECT_LT(chi2, df + 6 * std::sqrt(2 * df)) << cells << " tokens";
  }
}

// A row's result is the same bytes alone and among others, in any position.
TEST(DeviceSamplerGpu, ARowIgnoresItsBatch) {
  FERRY_SKIP_WITHOUT_GPU();
  std::mt19937 rng(kcu::testing::TestSeed());
  const int32_t vocab = 151936;
  std::vector<Row> rows = MixedRows(vocab, rng);
  for (Row& r : rows) {
    r.options.temperature = 0.9f;
    r.options.top_p = 0.95f;
    r.options.seed = rng();
  }
  std::vector<const Row*> ptrs;
  for (const Row& r : rows) ptrs.push_back(&r);
  const auto logits = kcu::testing::RandomVector(vocab, rng, 3.f);  // every row reads row 0
  const auto together = DeviceSample(logits, vocab, ptrs);
  for (size_t r = 0; r < rows.size(); ++r) {
    const auto alone = DeviceSample(logits, vocab, {&rows[r]});
    EXPECT_EQ(std::memcmp(&alone[0], &together[r], sizeof(kcu::SamplerResult)), 0) << r;
  }
}

}  // namespace
}  // namespace ferry::worker::gpu
