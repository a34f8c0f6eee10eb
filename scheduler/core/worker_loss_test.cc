// RequeueAll: a lost worker is a pause, not a loss. Every live sequence is kept, resumes by
// recompute on a fresh worker (whose KV slots were never written, so a block the core wrongly
// believed cached corrupts the output) and ends with exactly the tokens it gets without faults.
#include <gtest/gtest.h>

#include <map>
#include <random>

#include "scheduler/core/scheduler_core.h"
#include "scheduler/core/scheduler_test_util.h"

namespace ferry::scheduler {
namespace {

using testing::Harness;
using testing::MakeBudget;
using testing::MakeConfig;
using testing::MakeRequest;
using testing::Ms;
using testing::Outcome;
using testing::Reference;

class WorkerLossTest : public ::testing::TestWithParam<int32_t> {};

TEST_P(WorkerLossTest, EverySequenceResumesWithItsFaultFreeOutput) {
  SchedulerConfig cfg = MakeConfig(/*num_kv_blocks=*/48, /*block_size=*/4, /*max_model_len=*/128);
  cfg.max_steps_in_flight = GetParam();
  cfg.enable_prefix_caching = true;
  Harness h(cfg);
  std::mt19937 rng(27);
  auto uniform = [&](int lo, int hi) { return lo + static_cast<int>(rng() % (hi - lo + 1)); };
  const std::vector<int32_t> prefix = {7, 8, 9, 10, 11, 12, 13, 14, 15};
  uint64_t next_id = 1;
  int losses = 0;
  for (int step = 0; step < 3000; ++step) {
    if (next_id <= 400 && uniform(0, 2) == 0) {
      h.Add(MakeRequest(next_id++, {.prompt_len = uniform(1, 20), .max_tokens = uniform(1, 40),
                                    .eos_after = uniform(-1, 30), .priority = uniform(0, 2),
                                    .prefix = uniform(0, 1) ? prefix : std::vector<int32_t>{}}));
    }
    if (uniform(0, 60) == 0) {
      const int32_t live = static_cast<int32_t>(h.core.num_running() + h.core.num_waiting());
      EXPECT_EQ(h.LoseWorker(), live);
      EXPECT_EQ(h.core.num_running(), 0);
      EXPECT_EQ(h.core.num_free_blocks(), h.core.num_total_blocks());
      EXPECT_EQ(h.core.num_cached_blocks(), 0);
      ++losses;
    }
    h.Step(MakeBudget(/*max_num_seqs=*/uniform(4, 16)));
  }
  h.RunToCompletion();
  EXPECT_GT(losses, 20);
  EXPECT_EQ(h.outcomes.size(), 400u);
  for (const auto& [id, outcome] : h.outcomes) {
    EXPECT_NE(outcome.finish, FinishKind::kAborted) << id;
    EXPECT_NE(outcome.finish, FinishKind::kNone) << id;
  }
  h.ExpectOutcomesMatchReference();  // every one ran to its own end: exactly the reference
  EXPECT_EQ(h.core.num_free_blocks(), h.core.num_total_blocks());
}

INSTANTIATE_TEST_SUITE_P(StepsInFlight, WorkerLossTest, ::testing::Values(1, 2));

TEST(WorkerLossTest, SamplesOfStepsInFlightAreForgottenAndSampledAgain) {
  SchedulerConfig cfg = MakeConfig(/*num_kv_blocks=*/32, /*block_size=*/4, /*max_model_len=*/64);
  cfg.max_steps_in_flight = 2;
  Harness h(cfg);
  h.Add(MakeRequest(1, {.prompt_len = 6, .max_tokens = 10, .ignore_eos = true}));
  for (int i = 0; i < 4; ++i) h.Step();
  ASSERT_EQ(h.num_in_flight(), 1u);  // a sample is pending in the core
  const size_t delivered = h.outcomes[1].tokens.size();
  ASSERT_GT(delivered, 0u);
  h.LoseWorker();
  h.RunToCompletion();
  EXPECT_EQ(h.outcomes[1].finish, FinishKind::kLength);
  EXPECT_EQ(h.outcomes[1].tokens.size(), 10u);  // nothing twice, nothing missing
  EXPECT_EQ(h.times_sent[1], 2);                // sent again, with every delivered token
  h.ExpectOutcomesMatchReference();
}

TEST(WorkerLossTest, DeadlinesRunOutWhileTheWorkerIsAway) {
  Harness h(MakeConfig());
  h.Add(MakeRequest(1, {.prompt_len = 4, .max_tokens = 50, .deadline_ms = 100}));
  h.Add(MakeRequest(2, {.prompt_len = 4, .max_tokens = 5, .queue_deadline_ms = 50}));
  h.Add(MakeRequest(3, {.prompt_len = 4, .max_tokens = 5}));
  h.Step(MakeBudget(/*max_num_seqs=*/1));  // only 1 starts
  h.LoseWorker();
  h.core.ExpireDeadlines(Ms(60));  // 2 never started: its queue timeout ends it
  for (const SeqEvent& e : h.core.TakeEvents()) h.Record(e);
  EXPECT_EQ(h.outcomes[2].finish, FinishKind::kQueueTimeout);
  h.core.ExpireDeadlines(Ms(100));  // 1 started before the loss: it times out with its tokens
  for (const SeqEvent& e : h.core.TakeEvents()) h.Record(e);
  EXPECT_EQ(h.outcomes[1].finish, FinishKind::kTimeout);
  EXPECT_EQ(h.outcomes[3].finish, FinishKind::kNone);
  h.now = Ms(100);
  h.RunToCompletion();
  h.ExpectOutcomesMatchReference();
  h.core.CheckInvariants();
}

TEST(WorkerLossTest, AbortAllEndsWithTheKindGiven) {
  Harness h(MakeConfig());
  h.Add(MakeRequest(1));
  h.Step();
  h.LoseWorker();
  const auto events = h.core.AbortAll(FinishKind::kUnavailable);
  ASSERT_EQ(events.size(), 1u);
  EXPECT_EQ(events[0].finish, FinishKind::kUnavailable);
  EXPECT_STREQ(FinishKindName(FinishKind::kUnavailable), "unavailable");
  EXPECT_FALSE(h.core.has_work());  // the lost worker's ids are not sent to the new one
}

// A scheduler's loss, seen from the one that takes over: the gateway resubmits each started request
// with the tokens it already has (RequestSpec::generated). Whatever the share already produced, the
// resumed sequence ends with exactly the rest of its fault-free output, and its final account counts
// the given tokens as input: drafts, prefix caching and steps in flight included.
TEST_P(WorkerLossTest, AResumeContinuesWithTheRestOfItsFaultFreeOutput) {
  SchedulerConfig cfg = MakeConfig(/*num_kv_blocks=*/64, /*block_size=*/4, /*max_model_len=*/128);
  cfg.max_steps_in_flight = GetParam();
  cfg.enable_prefix_caching = true;
  Harness h(cfg);
  std::mt19937 rng(53);
  auto uniform = [&](int lo, int hi) { return lo + static_cast<int>(rng() % (hi - lo + 1)); };
  std::map<uint64_t, Outcome> expected;
  std::map<uint64_t, int32_t> given;
  for (uint64_t id = 1; id <= 200; ++id) {
    RequestSpec r = MakeRequest(id, {.prompt_len = uniform(1, 20), .max_tokens = uniform(1, 40),
                                     .eos_after = uniform(-1, 30), .stop_token_ids = {uniform(10, 999)}});
    if (uniform(0, 1) == 1) {
      r.sampling.speculative_method = SpeculativeMethod::kNgram;
      r.sampling.num_speculative_tokens = uniform(1, 4);
    }
    const Outcome full = Reference(r, cfg.max_model_len);
    // Any share of it before its end, none included.
    const auto k = static_cast<size_t>(uniform(0, static_cast<int>(full.tokens.size()) - 1));
    r.generated.assign(full.tokens.begin(), full.tokens.begin() + static_cast<std::ptrdiff_t>(k));
    expected[id] = Outcome{{full.tokens.begin() + static_cast<std::ptrdiff_t>(k), full.tokens.end()}, full.finish, 1};
    given[id] = static_cast<int32_t>(k);
    h.Add(r);
    if (uniform(0, 3) == 0) h.Step(MakeBudget(/*max_num_seqs=*/uniform(2, 12)));
  }
  int32_t given_total = 0, resumed = 0;
  for (const auto& [id, k] : given) given_total += k, resumed += k > 0;
  ASSERT_GT(resumed, 150);
  ASSERT_GT(given_total, 1000);
  h.RunToCompletion(MakeBudget(/*max_num_seqs=*/8));
  for (const auto& [id, want] : expected) {
    EXPECT_EQ(h.outcomes[id].tokens, want.tokens) << id << " resumed after " << given[id];
    EXPECT_EQ(h.outcomes[id].finish, want.finish) << id;
    EXPECT_EQ(h.outcomes[id].num_ends, 1) << id;
  }
}

TEST(WorkerLossTest, AResumeIsCheckedLikeAPrompt) {
  SchedulerCore core(MakeConfig());
  RequestSpec r = MakeRequest(1, {.max_tokens = 4});
  r.generated = {11, 12, 13, 14};
  EXPECT_THROW(
      {
        try {
          core.Add(r);
        } catch (const std::invalid_argument& e) {
          EXPECT_STREQ(e.what(), "seq_id 1: generated_token_ids (count) = 4, must be < max_tokens = 4");
          throw;
        }
      },
      std::invalid_argument);
  r.generated = {11, -3};
  EXPECT_THROW(core.Add(r), std::invalid_argument);
  r.generated = {11, 12, 13};
  core.Add(r);
  EXPECT_EQ(core.num_waiting(), 1);
}

// The account of a resumed sequence's end (what the controller's TTFT and TPOT read) counts only
// what it generated itself; the given tokens are input, as its prompt is.
TEST(WorkerLossTest, AResumesFinalAccountCountsOnlyWhatItGenerated) {
  Harness h(MakeConfig());
  RequestSpec r = MakeRequest(1, {.prompt_len = 5, .max_tokens = 9, .ignore_eos = true});
  r.generated = {21, 22, 23};
  h.Add(r);
  StepPlan first = h.Step();
  ASSERT_EQ(first.new_sequences.size(), 1u);
  EXPECT_EQ(first.new_sequences[0].num_generated, 3);  // the seeded draw goes on at 3
  EXPECT_EQ(first.new_sequences[0].token_ids.size(), 8u);
  h.RunToCompletion();
  EXPECT_EQ(h.outcomes[1].tokens.size(), 6u);
  EXPECT_EQ(h.outcomes[1].finish, FinishKind::kLength);
  EXPECT_EQ(h.outcomes[1].num_prompt_tokens, 8);
  EXPECT_EQ(h.outcomes[1].num_generated, 6);
}

}  // namespace
}  // namespace ferry::scheduler
