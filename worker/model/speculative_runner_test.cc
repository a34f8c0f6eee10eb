// Speculative decoding by prompt lookup on the CPU runner: drafts verified in the same forward
// pass never change a token, greedy or seeded, alone or batched with chunked prefills, across a
// preemption, with penalties; and the step's lookahead is validated like its tokens.
#include <gtest/gtest.h>

#include <map>

#include "worker/arch/random_checkpoint.h"
#include "worker/model/cpu_runner.h"
#include "worker/model/runner_test_util.h"

namespace ferry::worker {
namespace {

using testing::MiniScheduler;
using testing::TempDir;

constexpr int32_t kNew = 48;  // tokens generated per sequence

// A prompt with a repeated passage (what copying feeds on) and one without.
std::vector<int32_t> Prompt(int32_t salt, bool repetitive) {
  std::vector<int32_t> t;
  for (int32_t i = 0; i < 11; ++i) t.push_back((i * 53 + salt * 17) % 1900 + 5);
  if (repetitive) {
    const std::vector<int32_t> passage(t.begin(), t.end());
    t.insert(t.end(), passage.begin(), passage.end());
    t.insert(t.end(), passage.begin(), passage.begin() + 4);
  }
  return t;
}

class SpeculativeRunnerTest : public ::testing::Test {
 protected:
  void SetUp() override {
    WriteRandomCheckpoint(TinyShape(), /*seed=*/11, "float32", dir_.str(), {2});
    MakeRunner({SpeculativeMethod::kNgram, 4, 1, 3});
  }
  void MakeRunner(const SpeculativeConfig& speculative, const std::string& quantization = "none") {
    RunnerOptions options;
    options.model_dir = dir_.str();
    options.dtype = "float32";
    options.quantization = quantization;
    options.block_size = 4;
    options.num_kv_blocks = 256;
    options.speculative = speculative;
    runner_.reset();
    runner_ = std::make_unique<CpuRunner>(options);
    method_ = speculative.method;
  }

  // Generates kNew tokens for each prompt, together, prefills chunked by `chunk`; with lookahead
  // slots when `lookahead` > 0. preempt_at > 0 preempts the first sequence once it has that many.
  std::map<uint64_t, std::vector<int32_t>> Run(const std::vector<std::vector<int32_t>>& prompts,
                                                const SamplingOptions& sampling, int32_t lookahead, int32_t chunk,
                                                int32_t preempt_at = 0, SpeculationCounts* counts = nullptr,
                                                int64_t* steps = nullptr) {
    MiniScheduler sched(*runner_, /*seed=*/3);
    std::vector<uint64_t> ids;
    for (size_t i = 0; i < prompts.size(); ++i) {
      ids.push_back(i + 1);
      sched.Add(i + 1, prompts[i], sampling, lookahead, method_);
    }
    bool preempted = false;
    for (;;) {
      std::vector<std::pair<uint64_t, int32_t>> work;
      for (uint64_t id : ids) {
        if (sched.Generated(id).size() < size_t{kNew}) work.push_back({id, chunk});
      }
      if (work.empty()) break;
      sched.Step(work);
      if (preempt_at > 0 && !preempted && sched.Generated(1).size() >= size_t(preempt_at)) {
        sched.Preempt(1);
        preempted = true;
      }
    }
    std::map<uint64_t, std::vector<int32_t>> out;
    for (uint64_t id : ids) {
      auto g = sched.Generated(id);
      g.resize(kNew);  // a last speculative step may overshoot; the scheduler caps it at max_tokens
      out[id] = g;
    }
    if (counts != nullptr) *counts = sched.speculation();
    if (steps != nullptr) *steps = sched.num_steps();
    return out;
  }

  TempDir dir_{"speculative_runner_test"};
  std::unique_ptr<CpuRunner> runner_;
  SpeculativeMethod method_ = SpeculativeMethod::kNgram;
};

TEST_F(SpeculativeRunnerTest, GreedyTokensUnchangedAloneAndBatched) {
  const std::vector<std::vector<int32_t>> prompts = {Prompt(1, true), Prompt(2, false), Prompt(3, true)};
  const auto plain = Run(prompts, {}, 0, 7);
  for (size_t i = 0; i < prompts.size(); ++i) {
    SpeculationCounts counts;
    int64_t spec_steps = 0, plain_steps = 0;
    Run({prompts[i]}, {}, 0, 1000, 0, nullptr, &plain_steps);
    const auto alone = Run({prompts[i]}, {}, 4, 1000, 0, &counts, &spec_steps);
    EXPECT_EQ(alone.at(1), plain.at(i + 1)) << "prompt " << i;
    // Each accepted draft saves a step (those of a last step past kNew save none).
    EXPECT_LT(spec_steps, plain_steps) << "prompt " << i;
    EXPECT_GE(spec_steps, plain_steps - counts.num_accepted_tokens) << "prompt " << i;
  }
  SpeculationCounts counts;
  const auto batched = Run(prompts, {}, 4, 7, 0, &counts);
  EXPECT_EQ(batched, plain);
  // The check above means something only if drafts were both accepted and rejected.
  EXPECT_GT(counts.num_accepted_tokens, 0);
  EXPECT_LT(counts.num_accepted_tokens, counts.num_draft_tokens);
}

TEST_F(SpeculativeRunnerTest, SeededSamplingWithPenaltiesUnchanged) {
  SamplingOptions sampling;
  sampling.temperature = 0.7f;
  sampling.top_p = 0.95f;
  sampling.seed = 1234;
  sampling.repetition_penalty = 1.05f;
  sampling.frequency_penalty = 0.1f;
  sampling.logprobs = 2;
  const std::vector<std::vector<int32_t>> prompts = {Prompt(4, true), Prompt(5, true)};
  SpeculationCounts counts;
  EXPECT_EQ(Run(prompts, sampling, 5, 6, 0, &counts), Run(prompts, sampling, 0, 6));
  EXPECT_GT(counts.num_accepted_tokens, 0);
}

// logit_bias changes what is sampled; the drafts are verified against the biased distribution, so
// the tokens are plain decoding's, greedy and seeded, and drafts are accepted all the same.
TEST_F(SpeculativeRunnerTest, LogitBiasUnchangedGreedyAndSeeded) {
  const std::vector<std::vector<int32_t>> prompts = {Prompt(9, true), Prompt(10, true)};
  SamplingOptions biased;
  for (int32_t t = 5; t < 400; t += 7) biased.logit_bias.push_back({t, 3.5f});
  biased.logit_bias.push_back({Prompt(9, true)[3], -100.f});  // a token of the passage banned
  const auto unbiased = Run(prompts, {}, 0, 6);
  const auto plain = Run(prompts, biased, 0, 6);
  ASSERT_NE(plain, unbiased) << "the bias should change the output";
  SpeculationCounts counts;
  EXPECT_EQ(Run(prompts, biased, 4, 6, 0, &counts), plain);
  EXPECT_GT(counts.num_accepted_tokens, 0);
  biased.temperature = 0.8f;
  biased.seed = 4321;
  SpeculationCounts seeded_counts;
  EXPECT_EQ(Run(prompts, biased, 4, 6, 0, &seeded_counts), Run(prompts, biased, 0, 6));
  EXPECT_GT(seeded_counts.num_draft_tokens, 0);
}

// --quantization int8 with prompt lookup: the verification pass runs the drafts through the same int8
// matrix products as single decodes (activations quantized per token row), so the tokens are int8
// plain decoding's, greedy and seeded, with drafts accepted.
TEST_F(SpeculativeRunnerTest, Int8WeightsUnchangedGreedyAndSeeded) {
  const std::vector<std::vector<int32_t>> prompts = {Prompt(1, true), Prompt(2, false), Prompt(3, true)};
  SamplingOptions seeded;
  seeded.temperature = 0.7f;
  seeded.top_p = 0.9f;
  seeded.seed = 99;
  MakeRunner({}, "int8");
  ASSERT_EQ(runner_->info().quantization, "int8");
  const auto greedy = Run(prompts, {}, 0, 7), sampled = Run(prompts, seeded, 0, 7);
  MakeRunner({SpeculativeMethod::kNgram, 4, 1, 3}, "int8");
  ASSERT_EQ(runner_->info().quantization, "int8");
  SpeculationCounts counts;
  EXPECT_EQ(Run(prompts, {}, 4, 7, 0, &counts), greedy);
  EXPECT_GT(counts.num_accepted_tokens, 0);
  SpeculationCounts seeded_counts;
  EXPECT_EQ(Run(prompts, seeded, 4, 7, 0, &seeded_counts), sampled);
  EXPECT_GT(seeded_counts.num_accepted_tokens, 0);
}

TEST_F(SpeculativeRunnerTest, PreemptionAndRecomputeUnchanged) {
  const std::vector<std::vector<int32_t>> prompts = {Prompt(6, true), Prompt(7, false)};
  EXPECT_EQ(Run(prompts, {}, 3, 5, /*preempt_at=*/9), Run(prompts, {}, 0, 5));
}

TEST_F(SpeculativeRunnerTest, LookaheadIsValidated) {
  StepSpec step;
  NewSequenceSpec n{.seq_id = 1, .token_ids = {5, 6, 7, 5, 6}, .speculative = SpeculativeMethod::kNgram};
  step.new_sequences.push_back(n);
  // 5 tokens + 4 slots need 3 blocks of 4.
  step.scheduled.push_back({1, 5, {0, 1}, 4});
  try {
    runner_->Step(step);
    FAIL() << "two blocks for nine positions were accepted";
  } catch (const std::invalid_argument& e) {
    EXPECT_STREQ(e.what(), "sequence 1: 2 blocks cannot hold positions up to 9 (need 3)");
  }
  step.scheduled[0] = {1, 5, {0, 1, 2, 3, 4}, kMaxSpeculativeTokens + 1};
  EXPECT_THROW(runner_->Step(step), std::invalid_argument);
  EXPECT_EQ(runner_->num_sequences(), 0);  // nothing applied
  // Accepted with room: the "6" after "5" is proposed, then the table keeps only what it needs.
  step.scheduled[0] = {1, 5, {0, 1, 2}, 4};
  const auto out = runner_->Step(step);
  ASSERT_GE(out.size(), 1u);
  EXPECT_LE(out.size(), 5u);
  EXPECT_EQ(runner_->TakeSpeculationCounts().num_draft_tokens, 4);
}

// A draft model that is the target itself proposes exactly the target's greedy tokens: every draft
// is accepted, which holds only if the draft's own KV cache (in the target's blocks, caught up and
// rolled forward per step) is right at every position.
TEST_F(SpeculativeRunnerTest, DraftModelThatIsTheTargetHasEveryDraftAccepted) {
  MakeRunner({SpeculativeMethod::kDraftModel, 3, 1, 4, dir_.str()});
  const std::vector<std::vector<int32_t>> prompts = {Prompt(1, false), Prompt(2, true), Prompt(8, false)};
  SpeculationCounts counts;
  int64_t steps = 0;
  const auto speculative = Run(prompts, {}, 3, 5, /*preempt_at=*/10, &counts, &steps);
  MakeRunner({});
  EXPECT_EQ(speculative, Run(prompts, {}, 0, 5, 10));
  EXPECT_GT(counts.num_draft_tokens, 0);
  EXPECT_EQ(counts.num_accepted_tokens, counts.num_draft_tokens);
}

// Another model's drafts are mostly wrong; the tokens are the target's all the same, greedy and seeded.
TEST_F(SpeculativeRunnerTest, OtherDraftModelLeavesTokensUnchanged) {
  TempDir draft("speculative_runner_test_draft");
  WriteRandomCheckpoint(TinyShape(), /*seed=*/99, "float32", draft.str(), {2});
  SamplingOptions seeded;
  seeded.temperature = 0.9f;
  seeded.seed = 77;
  const std::vector<std::vector<int32_t>> prompts = {Prompt(3, true), Prompt(4, false)};
  MakeRunner({});
  const auto greedy = Run(prompts, {}, 0, 6), sampled = Run(prompts, seeded, 0, 6);
  MakeRunner({SpeculativeMethod::kDraftModel, 4, 1, 4, draft.str()});
  SpeculationCounts counts;
  EXPECT_EQ(Run(prompts, {}, 4, 6, 0, &counts), greedy);
  EXPECT_EQ(Run(prompts, seeded, 4, 6), sampled);
  EXPECT_GT(counts.num_draft_tokens, 0);
}

// Under seeded sampling a draft (the draft model's argmax) is accepted when the target's own draw at
// that position equals it: with the target as its own draft that happens often, not always.
TEST_F(SpeculativeRunnerTest, DraftModelDraftsAreAcceptedUnderSeededSampling) {
  SamplingOptions seeded;
  seeded.temperature = 0.6f;
  seeded.top_p = 0.95f;
  seeded.seed = 2024;
  seeded.presence_penalty = 0.2f;
  const std::vector<std::vector<int32_t>> prompts = {Prompt(5, false), Prompt(6, true)};
  MakeRunner({});
  const auto plain = Run(prompts, seeded, 0, 5);
  MakeRunner({SpeculativeMethod::kDraftModel, 4, 1, 4, dir_.str()});
  SpeculationCounts counts;
  EXPECT_EQ(Run(prompts, seeded, 4, 5, /*preempt_at=*/12, &counts), plain);
  EXPECT_GT(counts.num_accepted_tokens, 0);
  EXPECT_LT(counts.num_accepted_tokens, counts.num_draft_tokens);  // a draw that is not the argmax rejects
}

TEST_F(SpeculativeRunnerTest, DraftModelOfAnotherVocabularyIsRefused) {
  TempDir draft("speculative_runner_test_vocab");
  ModelShape shape = TinyShape();
  shape.vocab_size = 1024;
  WriteRandomCheckpoint(shape, 5, "float32", draft.str(), {2});
  try {
    MakeRunner({SpeculativeMethod::kDraftModel, 4, 1, 4, draft.str()});
    FAIL() << "a draft of another vocabulary was loaded";
  } catch (const std::runtime_error& e) {
    EXPECT_NE(std::string(e.what()).find("vocab_size 1024 differs from the target's 2048"), std::string::npos)
        << e.what();
  }
}

}  // namespace
}  // namespace ferry::worker
