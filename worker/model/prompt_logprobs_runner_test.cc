// Prompt logprobs through the CPU runner on a random tiny Qwen2 checkpoint: a whole prompt in one
// step (its rows scored a slice at a time, slices crossing from one sequence to the next) gives
// the same logprobs as the prompt fed in small chunks, and the same samples as a step that asked
// for none; bad values are refused with the state untouched.
#include <gtest/gtest.h>

#include <cmath>
#include <numeric>
#include <stdexcept>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include "worker/arch/random_checkpoint.h"
#include "worker/model/runner_test_util.h"

namespace ferry::worker {
namespace {

using testing::TempDir;

class PromptLogprobsRunnerTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    dir_ = new TempDir("prompt_logprobs_runner_test");
    WriteRandomCheckpoint(TinyShape(), /*seed=*/31, "bfloat16", dir_->str(), {2});
  }
  static void TearDownTestSuite() {
    delete dir_;
    dir_ = nullptr;
  }

  static std::unique_ptr<CpuRunner> MakeRunner() {
    RunnerOptions options;
    options.model_dir = dir_->str();
    options.dtype = "float32";
    options.block_size = 4;
    options.num_kv_blocks = 512;
    options.keep_logits = true;  // the test reads the logits
    return std::make_unique<CpuRunner>(options);
  }

  static TempDir* dir_;
};
TempDir* PromptLogprobsRunnerTest::dir_ = nullptr;

std::vector<int32_t> Prompt(int32_t len, int32_t salt) {
  std::vector<int32_t> p(static_cast<size_t>(len));
  for (int32_t i = 0; i < len; ++i) p[static_cast<size_t>(i)] = (i * 37 + salt * 101) % 2000 + 3;
  return p;
}

std::vector<int32_t> Blocks(int32_t first, int32_t count) {
  std::vector<int32_t> b(static_cast<size_t>(count));
  std::iota(b.begin(), b.end(), first);
  return b;
}

NewSequenceSpec NewSeq(uint64_t id, std::vector<int32_t> prompt, int32_t prompt_logprobs) {
  NewSequenceSpec n;
  n.seq_id = id;
  n.token_ids = std::move(prompt);
  n.prompt_logprobs = prompt_logprobs;
  return n;
}

// Feeds `prompt` to a fresh runner `chunk` tokens a step; returns every prompt logprob entry and
// the token sampled at the end.
std::pair<std::vector<SampledTokenOut>, int32_t> Chunked(CpuRunner& runner, const std::vector<int32_t>& prompt,
                                                         int32_t chunk, int32_t prompt_logprobs) {
  std::vector<SampledTokenOut> entries;
  int32_t sampled = -1;
  const auto len = static_cast<int32_t>(prompt.size());
  int32_t num_blocks = 0;  // given so far: block i holds positions [4i, 4i + 4)
  for (int32_t done = 0; done < len; done += chunk) {
    StepSpec step;
    if (done == 0) step.new_sequences.push_back(NewSeq(7, prompt, prompt_logprobs));
    const int32_t n = std::min(chunk, len - done);
    const int32_t end_block = (done + n + 3) / 4;
    step.scheduled.push_back({7, n, Blocks(num_blocks, end_block - num_blocks)});
    num_blocks = end_block;
    const auto out = runner.Step(step);
    if (!out.empty()) sampled = out[0].token_id;
    for (const PromptLogprobsOut& p : runner.TakePromptLogprobs()) {
      EXPECT_EQ(p.first_index, static_cast<int32_t>(entries.size()) + 1) << "in order, each once";
      entries.insert(entries.end(), p.tokens.begin(), p.tokens.end());
    }
  }
  return {entries, sampled};
}

TEST_F(PromptLogprobsRunnerTest, AWholePromptScoredInSlicesEqualsSmallChunks) {
  const std::vector<int32_t> long_prompt = Prompt(600, 1), short_prompt = Prompt(90, 2);
  auto runner = MakeRunner();
  StepSpec step;  // 599 + 89 prompt rows: three slices of 256, one straddling the two sequences
  step.new_sequences = {NewSeq(1, long_prompt, 3), NewSeq(2, short_prompt, 0)};
  step.scheduled = {{1, 600, Blocks(0, 150)}, {2, 90, Blocks(150, 23)}};
  const std::vector<SampledTokenOut> samples = runner->Step(step);
  const std::vector<PromptLogprobsOut> scored = runner->TakePromptLogprobs();
  ASSERT_EQ(scored.size(), 2u);
  EXPECT_TRUE(runner->TakePromptLogprobs().empty()) << "taken once";
  ASSERT_EQ(scored[0].tokens.size(), 599u);
  ASSERT_EQ(scored[1].tokens.size(), 89u);
  EXPECT_EQ(scored[0].first_index, 1);

  for (const auto& [index, prompt, top] : {std::tuple{0, long_prompt, 3}, std::tuple{1, short_prompt, 0}}) {
    auto reference_runner = MakeRunner();
    const auto [reference, sampled] = Chunked(*reference_runner, prompt, /*chunk=*/7, top);
    const PromptLogprobsOut& got = scored[static_cast<size_t>(index)];
    ASSERT_EQ(reference.size(), got.tokens.size());
    for (size_t i = 0; i < reference.size(); ++i) {
      SCOPED_TRACE("sequence " + std::to_string(index) + " prompt token " + std::to_string(i + 1));
      EXPECT_EQ(got.tokens[i].token_id, prompt[i + 1]);
      EXPECT_NEAR(got.tokens[i].logprob, reference[i].logprob, 1e-4);
      EXPECT_LE(got.tokens[i].logprob, 0.f);
      ASSERT_EQ(got.tokens[i].top_logprobs.size(), static_cast<size_t>(top));
      for (size_t j = 0; j < got.tokens[i].top_logprobs.size(); ++j) {
        EXPECT_EQ(got.tokens[i].top_logprobs[j].first, reference[i].top_logprobs[j].first);
      }
    }
    EXPECT_EQ(samples[static_cast<size_t>(index)].token_id, sampled);
  }

  // The samples and their logits are those of the same step without prompt logprobs.
  auto plain = MakeRunner();
  step.new_sequences = {NewSeq(1, long_prompt, -1), NewSeq(2, short_prompt, -1)};
  const std::vector<SampledTokenOut> plain_samples = plain->Step(step);
  EXPECT_TRUE(plain->TakePromptLogprobs().empty());
  ASSERT_EQ(plain_samples.size(), samples.size());
  for (size_t i = 0; i < samples.size(); ++i) EXPECT_EQ(plain_samples[i].token_id, samples[i].token_id);
}

TEST_F(PromptLogprobsRunnerTest, BadValuesAreRefusedLeavingStateUnchanged) {
  auto runner = MakeRunner();
  StepSpec step;
  step.new_sequences = {NewSeq(1, Prompt(8, 3), 21)};
  step.scheduled = {{1, 8, Blocks(0, 2)}};
  EXPECT_THROW(runner->Step(step), std::invalid_argument);
  step.new_sequences = {NewSeq(1, Prompt(8, 3), 0)};
  step.new_sequences[0].num_cached_tokens = 4;  // cached positions would have no logits
  try {
    runner->Step(step);
    ADD_FAILURE() << "accepted prompt_logprobs with a cached prefix";
  } catch (const std::invalid_argument& e) {
    EXPECT_NE(std::string(e.what()).find("num_cached_tokens"), std::string::npos) << e.what();
  }
  EXPECT_EQ(runner->num_sequences(), 0);
  step.new_sequences[0].num_cached_tokens = 0;
  EXPECT_EQ(runner->Step(step).size(), 1u);
  EXPECT_EQ(runner->TakePromptLogprobs().at(0).tokens.size(), 7u);
}

}  // namespace
}  // namespace ferry::worker
