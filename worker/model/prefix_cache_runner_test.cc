// A new sequence whose first blocks already hold its prefix (shared by prefix caching) gives the
// same tokens and logits as computing the whole prompt, for both dtypes.
#include <gtest/gtest.h>

#include <cmath>

#include "worker/arch/random_checkpoint.h"
#include "worker/model/bf16_test_util.h"
#include "worker/model/cpu_runner.h"
#include "worker/model/runner_test_util.h"

namespace ferry::worker {
namespace {

using testing::TempDir;

constexpr int32_t kBlock = 4;

std::vector<int32_t> Tokens(int32_t len, int32_t salt) {
  std::vector<int32_t> t(len);
  for (int32_t i = 0; i < len; ++i) t[i] = (i * 37 + salt * 11) % 1900 + 5;
  return t;
}

// Runs seq to the end of its prompt plus `decode` greedy tokens; returns tokens and the first
// sample's logits. blocks: the full block table (first step sends all of it).
std::pair<std::vector<int32_t>, std::vector<float>> RunSeq(CpuRunner& runner, uint64_t id,
                                                        const std::vector<int32_t>& prompt,
                                                        int32_t cached, std::vector<int32_t> blocks,
                                                        int32_t decode) {
  StepSpec first;
  NewSequenceSpec n;
  n.seq_id = id;
  n.token_ids = prompt;
  n.num_cached_tokens = cached;
  first.new_sequences.push_back(n);
  first.scheduled.push_back({id, static_cast<int32_t>(prompt.size()) - cached, blocks});
  std::vector<int32_t> out;
  out.push_back(runner.Step(first).at(0).token_id);
  std::vector<float> logits = runner.last_logits();
  for (int32_t i = 1; i < decode; ++i) {
    StepSpec step;
    step.scheduled.push_back({id, 1, {}});
    out.push_back(runner.Step(step).at(0).token_id);
  }
  StepSpec done;
  done.finished_ids.push_back(id);
  runner.Step(done);
  return {out, logits};
}

class PrefixCacheRunnerTest : public ::testing::TestWithParam<const char*> {};

TEST_P(PrefixCacheRunnerTest, CachedPrefixEqualsFullPrompt) {
  FERRY_SKIP_WITHOUT_BF16(GetParam());
  TempDir dir("prefix_cache_runner_test");
  WriteRandomCheckpoint(TinyShape(), /*seed=*/5, "bfloat16", dir.str(), {2});
  RunnerOptions options;
  options.model_dir = dir.str();
  options.dtype = GetParam();
  options.block_size = kBlock;
  options.num_kv_blocks = 64;
  options.keep_logits = true;  // the test reads the logits
  CpuRunner runner(options);

  const std::vector<int32_t> shared = Tokens(12, 1);  // 3 full blocks
  std::vector<int32_t> a = shared, b = shared;
  for (int32_t t : Tokens(5, 2)) a.push_back(t);
  for (int32_t t : Tokens(6, 3)) b.push_back(t);

  // A fills blocks 10..14; its first three blocks then hold the shared prefix.
  RunSeq(runner, 1, a, 0, {10, 11, 12, 13, 14, 15}, 4);
  // B reuses blocks 10..12 for its first 12 tokens and computes only its own suffix.
  const auto cached = RunSeq(runner, 2, b, 12, {10, 11, 12, 20, 21, 22}, 6);
  // Reference: B from scratch in other blocks.
  const auto full = RunSeq(runner, 3, b, 0, {30, 31, 32, 33, 34, 35}, 6);
  EXPECT_EQ(cached.first, full.first);
  ASSERT_EQ(cached.second.size(), full.second.size());
  double max_diff = 0;
  for (size_t i = 0; i < full.second.size(); ++i) {
    max_diff = std::max(max_diff, double(std::fabs(cached.second[i] - full.second[i])));
  }
  EXPECT_LT(max_diff, 1e-4) << GetParam();
}

TEST_P(PrefixCacheRunnerTest, WholePromptCachedIsRejected) {
  FERRY_SKIP_WITHOUT_BF16(GetParam());
  TempDir dir("prefix_cache_runner_test2");
  WriteRandomCheckpoint(TinyShape(), /*seed=*/5, "bfloat16", dir.str(), {2});
  RunnerOptions options;
  options.model_dir = dir.str();
  options.dtype = GetParam();
  options.block_size = kBlock;
  options.num_kv_blocks = 16;
  options.keep_logits = true;  // the test reads the logits
  CpuRunner runner(options);
  StepSpec step;
  NewSequenceSpec n;
  n.seq_id = 1;
  n.token_ids = Tokens(8, 1);
  n.num_cached_tokens = 8;  // nothing left to compute: no logits to sample from
  step.new_sequences.push_back(n);
  step.scheduled.push_back({1, 1, {0, 1, 2}});
  EXPECT_THROW(runner.Step(step), std::invalid_argument);
}

INSTANTIATE_TEST_SUITE_P(Dtypes, PrefixCacheRunnerTest, ::testing::Values("float32", "bfloat16"));

}  // namespace
}  // namespace ferry::worker
