// Sampling through the runner on a random tiny Qwen2 checkpoint: penalties see the right
// history (prompt, generated, across preemption), logprobs are filled from the raw logits, and
// seeded sampling with every option on is independent of batch mix, chunking and preemption.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <map>
#include <set>

#include "worker/arch/random_checkpoint.h"
#include "worker/model/runner_test_util.h"

namespace ferry::worker {
namespace {

using testing::MiniScheduler;
using testing::TempDir;

class SamplingRunnerTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    dir_ = new TempDir("sampling_runner_test");
    WriteRandomCheckpoint(TinyShape(), /*seed=*/23, "bfloat16", dir_->str(), {2});
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
    options.num_kv_blocks = 256;
    options.keep_logits = true;  // the test reads the logits
    return std::make_unique<CpuRunner>(options);
  }

  static std::vector<int32_t> Prompt(int32_t len, int32_t salt) {
    std::vector<int32_t> p(len);
    // Few distinct ids so the prompt repeats tokens the repetition penalty must see.
    for (int32_t i = 0; i < len; ++i) p[i] = (i % 5) * 97 + salt * 13;
    return p;
  }

  static void ExpectGreedyPenaltiesMatchReference(CpuRunner& runner,
                                                  const SamplingOptions& opts);

  static TempDir* dir_;
};
TempDir* SamplingRunnerTest::dir_ = nullptr;

// Like MiniScheduler::RunUntil, but keeps every sample as returned.
std::map<uint64_t, std::vector<SampledTokenOut>> RunCollect(MiniScheduler& sched,
                                                            const std::vector<uint64_t>& ids,
                                                            size_t num_new, int32_t chunk) {
  std::map<uint64_t, std::vector<SampledTokenOut>> out;
  for (;;) {
    std::vector<std::pair<uint64_t, int32_t>> work;
    for (uint64_t id : ids) {
      if (sched.Generated(id).size() < num_new) work.push_back({id, chunk});
    }
    if (work.empty()) return out;
    for (SampledTokenOut& s : sched.Step(work)) out[s.seq_id].push_back(std::move(s));
  }
}

// Log-softmax of one raw logits row, in double.
std::vector<double> RefLogSoftmax(const std::vector<float>& row) {
  const double mx = *std::max_element(row.begin(), row.end());
  double sum = 0;
  for (float x : row) sum += std::exp(x - mx);
  std::vector<double> out(row.size());
  for (size_t i = 0; i < row.size(); ++i) out[i] = row[i] - mx - std::log(sum);
  return out;
}

// The penalised row by the header's definitions, recounting the whole history naively.
std::vector<float> RefPenalised(std::vector<float> row, const std::vector<int32_t>& prompt,
                                const std::vector<int32_t>& generated, const SamplingOptions& o) {
  std::map<int32_t, int32_t> num_generated;
  for (int32_t t : generated) ++num_generated[t];
  std::set<int32_t> seen(prompt.begin(), prompt.end());
  seen.insert(generated.begin(), generated.end());
  for (int32_t t : seen) {
    float& x = row[t];
    x = x > 0.f ? x / o.repetition_penalty : x * o.repetition_penalty;
    if (num_generated.count(t)) {
      x -= o.presence_penalty + o.frequency_penalty * static_cast<float>(num_generated[t]);
    }
  }
  return row;
}

void SamplingRunnerTest::ExpectGreedyPenaltiesMatchReference(CpuRunner& runner,
                                                             const SamplingOptions& opts) {
  const auto prompt = Prompt(13, 1);
  MiniScheduler sched(runner, 1);
  sched.Add(1, prompt, opts);
  sched.Add(2, Prompt(6, 2));
  sched.RunUntil({1, 2}, 6, 4);
  sched.Preempt(1);
  sched.RunUntil({1, 2}, 16, 3);
  const auto generated = sched.Generated(1);
  ASSERT_EQ(generated.size(), 16u);
  int32_t num_changed = 0;  // steps where the penalty changed the greedy choice
  for (size_t k = 0; k < generated.size(); ++k) {
    const auto& raw = sched.Logits(1)[k];
    const std::vector<int32_t> before(generated.begin(), generated.begin() + k);
    const auto penalised = RefPenalised(raw, prompt, before, opts);
    EXPECT_EQ(generated[k], Argmax(penalised.data(), int32_t(penalised.size()))) << "sample " << k;
    num_changed += generated[k] != Argmax(raw.data(), int32_t(raw.size()));
  }
  EXPECT_GT(num_changed, 0) << "the penalties should matter on this prompt";
}

// Greedy with penalties equals argmax of the reference-penalised raw logits at every step,
// including after a preemption, where the runner rebuilds its counts from the resent tokens.
TEST_F(SamplingRunnerTest, GreedyPenaltiesMatchReferenceAcrossPreemption) {
  auto runner = MakeRunner();
  for (const SamplingOptions& opts :
       {SamplingOptions{.presence_penalty = 0.8f, .frequency_penalty = 0.6f,
                        .repetition_penalty = 1.5f},
        SamplingOptions{.frequency_penalty = 1.f}, SamplingOptions{.repetition_penalty = 2.f},
        // Negative presence rewards generated tokens back after repetition pushed them away.
        SamplingOptions{.presence_penalty = -1.5f, .repetition_penalty = 3.f}}) {
    SCOPED_TRACE("presence " + std::to_string(opts.presence_penalty) + " frequency " +
                 std::to_string(opts.frequency_penalty) + " repetition " +
                 std::to_string(opts.repetition_penalty));
    ExpectGreedyPenaltiesMatchReference(*runner, opts);
  }
}

TEST_F(SamplingRunnerTest, LogprobsFilledFromRawLogits) {
  auto runner = MakeRunner();
  MiniScheduler sched(*runner, 2);
  const SamplingOptions base{.temperature = 0.8f, .top_k = 40, .presence_penalty = 1.f,
                             .repetition_penalty = 1.2f, .seed = 3};
  const std::vector<int32_t> levels{-1, 0, 1, 20};
  std::vector<uint64_t> ids;
  for (size_t i = 0; i < levels.size(); ++i) {
    SamplingOptions o = base;
    o.logprobs = levels[i];
    sched.Add(10 + i, Prompt(5 + i, 3 + i), o);
    ids.push_back(10 + i);
  }
  auto out = RunCollect(sched, ids, 6, 64);
  for (size_t i = 0; i < levels.size(); ++i) {
    SCOPED_TRACE("logprobs " + std::to_string(levels[i]));
    const auto& samples = out[10 + i];
    ASSERT_EQ(samples.size(), 6u);
    for (size_t k = 0; k < samples.size(); ++k) {
      const SampledTokenOut& s = samples[k];
      EXPECT_EQ(s.has_logprobs, levels[i] >= 0);
      ASSERT_EQ(s.top_logprobs.size(), size_t(std::max(levels[i], 0)));
      if (levels[i] < 0) continue;
      const auto ref = RefLogSoftmax(sched.Logits(10 + i)[k]);
      EXPECT_NEAR(std::exp(double{s.logprob}), std::exp(ref[s.token_id]), 1e-5);
      for (size_t j = 0; j < s.top_logprobs.size(); ++j) {
        const auto [id, lp] = s.top_logprobs[j];
        EXPECT_NEAR(std::exp(double{lp}), std::exp(ref[id]), 1e-5);
        if (j > 0) EXPECT_LE(lp, s.top_logprobs[j - 1].second);  // most likely first
      }
      if (!s.top_logprobs.empty()) {
        const auto& row = sched.Logits(10 + i)[k];
        EXPECT_EQ(s.top_logprobs[0].first, Argmax(row.data(), int32_t(row.size())));
      }
    }
  }
}

struct Trace {
  std::vector<int32_t> tokens;
  std::vector<float> logprobs;
};

Trace TraceOf(const MiniScheduler& sched, const std::vector<SampledTokenOut>& samples,
              uint64_t id) {
  Trace t{sched.Generated(id), {}};
  for (const auto& s : samples) t.logprobs.push_back(s.logprob);
  return t;
}

// Every option on at once; the stream must not depend on what shares the batch, on prefill
// chunking, or on being preempted (and resent with prompt + generated) midway.
TEST_F(SamplingRunnerTest, SeededFullOptionsIndependentOfBatchMixAndPreemption) {
  auto runner = MakeRunner();
  const SamplingOptions opts{.temperature = 1.1f, .top_p = 0.95f, .top_k = 200, .min_p = 0.01f,
                             .presence_penalty = 0.4f, .frequency_penalty = 0.3f,
                             .repetition_penalty = 1.2f, .logprobs = 2, .seed = 99};
  const auto prompt = Prompt(10, 4);
  const int32_t num_new = 20;
  Trace alone;
  {
    MiniScheduler sched(*runner, 3);
    sched.Add(1, prompt, opts);
    alone = TraceOf(sched, RunCollect(sched, {1}, num_new, 1 << 20)[1], 1);
  }
  {
    MiniScheduler sched(*runner, 4);
    sched.Add(5, Prompt(17, 5), {.temperature = 0.7f, .top_p = 0.8f, .repetition_penalty = 2.f,
                                 .seed = 1});
    sched.Add(6, prompt, opts);
    sched.Add(7, Prompt(3, 6), {.temperature = 1.5f, .top_k = 5, .frequency_penalty = -1.f,
                                .logprobs = 20, .seed = 2});
    auto out = RunCollect(sched, {5, 6, 7}, num_new, 3);
    const Trace mixed = TraceOf(sched, out[6], 6);
    EXPECT_EQ(mixed.tokens, alone.tokens);
    ASSERT_EQ(mixed.logprobs.size(), alone.logprobs.size());
    for (size_t k = 0; k < alone.logprobs.size(); ++k) {
      EXPECT_NEAR(mixed.logprobs[k], alone.logprobs[k], 1e-4) << "sample " << k;
    }
  }
  for (int32_t preempt_at : {1, 7, 15}) {
    SCOPED_TRACE("preempted after " + std::to_string(preempt_at));
    MiniScheduler sched(*runner, 5 + preempt_at);
    sched.Add(8, prompt, opts);
    sched.Add(9, Prompt(8, 7), {.temperature = 1.f, .presence_penalty = 2.f, .seed = 4});
    sched.RunUntil({8, 9}, preempt_at, 1 << 20);
    sched.Preempt(8);
    sched.RunUntil({8, 9}, num_new, 5);
    EXPECT_EQ(sched.Generated(8), alone.tokens);
  }
  // The options matter: without penalties the same seed gives another stream.
  SamplingOptions plain = opts;
  plain.presence_penalty = plain.frequency_penalty = 0.f;
  plain.repetition_penalty = 1.f;
  MiniScheduler sched(*runner, 9);
  sched.Add(1, prompt, plain);
  sched.RunUntil({1}, num_new, 1 << 20);
  EXPECT_NE(sched.Generated(1), alone.tokens);
}

TEST_F(SamplingRunnerTest, RejectsOutOfRangeOptionsLeavingStateUnchanged) {
  auto runner = MakeRunner();
  for (const SamplingOptions& bad :
       {SamplingOptions{.min_p = 1.5f}, SamplingOptions{.presence_penalty = 3.f},
        SamplingOptions{.frequency_penalty = -2.5f}, SamplingOptions{.repetition_penalty = 0.f},
        SamplingOptions{.logprobs = 21}, SamplingOptions{.logprobs = -2}}) {
    StepSpec step;
    step.new_sequences.push_back({42, {1, 2, 3}, 0, bad});
    step.scheduled.push_back({42, 3, {0}});
    try {
      runner->Step(step);
      ADD_FAILURE() << "accepted bad options";
    } catch (const std::invalid_argument& e) {
      EXPECT_NE(std::string(e.what()).find("sequence 42"), std::string::npos) << e.what();
    }
    EXPECT_EQ(runner->num_sequences(), 0);
  }
}

}  // namespace
}  // namespace ferry::worker
