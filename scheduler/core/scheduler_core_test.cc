// Unit tests of the SchedulerCore facade: validation, the plan/commit
// protocol, finish kinds, cancellation and abort.
#include "scheduler/core/scheduler_core.h"

#include <gtest/gtest.h>

#include <stdexcept>
#include <string>

#include "scheduler/core/scheduler_test_util.h"

namespace ferry::scheduler {
namespace {

using testing::MakeBudget;
using testing::MakeConfig;
using testing::MakeRequest;
using testing::RequestOptions;

std::string AddError(SchedulerCore& core, const RequestSpec& r) {
  try {
    core.Add(r);
  } catch (const std::invalid_argument& e) {
    return e.what();
  }
  return "";
}

TEST(SchedulerCoreTest, RejectsBadConfig) {
  SchedulerConfig cfg = MakeConfig();
  cfg.num_kv_blocks = 0;
  EXPECT_THROW(SchedulerCore{cfg}, std::invalid_argument);
  cfg = MakeConfig();
  cfg.max_model_len = 0;
  EXPECT_THROW(SchedulerCore{cfg}, std::invalid_argument);
}

TEST(SchedulerCoreTest, AddRejectsTooLongNamingFieldValueAndLimit) {
  SchedulerCore core(MakeConfig(/*num_kv_blocks=*/64, /*block_size=*/4, /*max_model_len=*/100));
  std::string err = AddError(core, MakeRequest(1, {.prompt_len = 90, .max_tokens = 20}));
  EXPECT_NE(err.find("prompt+max_tokens = 110"), std::string::npos) << err;
  EXPECT_NE(err.find("max_model_len = 100"), std::string::npos) << err;
  EXPECT_FALSE(core.is_live(1));
  EXPECT_EQ(core.num_waiting(), 0);
}

TEST(SchedulerCoreTest, AddRejectsMoreBlocksThanThePoolHas) {
  SchedulerCore core(MakeConfig(/*num_kv_blocks=*/4, /*block_size=*/4, /*max_model_len=*/100));
  // 17 tokens, 16 of them computed: exactly 4 blocks. Accepted.
  EXPECT_EQ(AddError(core, MakeRequest(1, {.prompt_len = 16, .max_tokens = 1})), "");
  std::string err = AddError(core, MakeRequest(2, {.prompt_len = 17, .max_tokens = 1}));
  EXPECT_NE(err.find("needs 5 KV blocks"), std::string::npos) << err;
  EXPECT_NE(err.find("num_kv_blocks = 4"), std::string::npos) << err;
}

TEST(SchedulerCoreTest, AddRejectsEmptyPromptBadMaxTokensAndDuplicates) {
  SchedulerCore core(MakeConfig());
  EXPECT_NE(AddError(core, MakeRequest(1, {.prompt_len = 0})).find("prompt is empty"),
            std::string::npos);
  EXPECT_NE(AddError(core, MakeRequest(1, {.max_tokens = 0})).find("max_tokens = 0"),
            std::string::npos);
  core.Add(MakeRequest(1));
  EXPECT_NE(AddError(core, MakeRequest(1)).find("already live"), std::string::npos);
}

TEST(SchedulerCoreTest, ASequenceThatCouldNotBeSentInOneStepIsRefusedAtStart) {
  SchedulerConfig cfg = MakeConfig(/*num_kv_blocks=*/256, /*block_size=*/4, /*max_model_len=*/256);
  cfg.max_step_sent_tokens = 100;
  try {
    SchedulerCore core(cfg);
    FAIL() << "accepted";
  } catch (const std::invalid_argument& e) {
    EXPECT_STREQ(e.what(),
                 "max_model_len = 256 exceeds max_step_sent_tokens = 100: a sequence could not be sent to the worker "
                 "in one step");
  }
}

// New sequences are sent whole (prompt and all) in the step that first runs them; a step sends at
// most max_step_sent_tokens of them, whatever the batched-token budget, and the rest start in the
// next steps, in order, with nothing preempted for them.
TEST(SchedulerCoreTest, AStepSendsAtMostMaxStepSentTokensOfNewSequences) {
  SchedulerConfig cfg = MakeConfig(/*num_kv_blocks=*/256, /*block_size=*/4, /*max_model_len=*/100);
  cfg.max_step_sent_tokens = 100;
  SchedulerCore core(cfg);
  for (uint64_t id = 1; id <= 5; ++id) core.Add(MakeRequest(id, {.prompt_len = 40, .max_tokens = 4}));
  std::vector<std::vector<uint64_t>> started;
  for (int step = 0; step < 3; ++step) {
    StepPlan plan = core.Plan(MakeBudget(/*max_num_seqs=*/256, /*max_num_batched_tokens=*/8192), TimePoint{});
    int64_t sent = 0;
    std::vector<uint64_t> ids;
    for (const NewSequence& n : plan.new_sequences) {
      sent += static_cast<int64_t>(n.token_ids.size());
      ids.push_back(n.seq_id);
    }
    EXPECT_LE(sent, 100);
    started.push_back(ids);
    std::vector<SampledToken> samples;
    for (const ScheduledSequence& s : plan.scheduled) samples.push_back({s.seq_id, 7});
    core.Commit(plan, samples);
  }
  EXPECT_EQ(started, (std::vector<std::vector<uint64_t>>{{1, 2}, {3, 4}, {5}}));
  EXPECT_EQ(core.num_preemptions(), 0u);
}

TEST(SchedulerCoreTest, EmptyWhenIdle) {
  SchedulerCore core(MakeConfig());
  StepPlan plan = core.Plan(MakeBudget(), TimePoint{});
  EXPECT_TRUE(plan.empty());
  EXPECT_EQ(plan.step_id, 0u);
  EXPECT_EQ(core.num_steps(), 0u);
  EXPECT_FALSE(core.has_work());
  EXPECT_FALSE(core.is_step_in_flight());
}

TEST(SchedulerCoreTest, FirstPlanSendsPromptAndBlocks) {
  SchedulerCore core(MakeConfig(/*num_kv_blocks=*/16, /*block_size=*/4));
  RequestSpec r = MakeRequest(7, {.prompt_len = 10});
  core.Add(r);
  StepPlan plan = core.Plan(MakeBudget(), TimePoint{});
  EXPECT_EQ(plan.step_id, 1u);
  ASSERT_EQ(plan.new_sequences.size(), 1u);
  EXPECT_EQ(plan.new_sequences[0].seq_id, 7u);
  EXPECT_EQ(plan.new_sequences[0].token_ids, r.prompt);
  EXPECT_EQ(plan.new_sequences[0].num_generated, 0);
  EXPECT_EQ(plan.new_sequences[0].sampling.encoded, r.sampling.encoded);  // carried as it came
  ASSERT_EQ(plan.scheduled.size(), 1u);
  EXPECT_EQ(plan.scheduled[0].num_tokens, 10);
  EXPECT_EQ(plan.scheduled[0].new_block_ids.size(), 3u);
  EXPECT_EQ(core.num_free_blocks(), 13);
  EXPECT_EQ(core.num_running(), 1);
  EXPECT_TRUE(core.is_step_in_flight());
  EXPECT_THROW(core.Plan(MakeBudget(), TimePoint{}), std::logic_error);
}

TEST(SchedulerCoreTest, CommitValidatesSamplesAndLeavesStateUnchanged) {
  SchedulerCore core(MakeConfig());
  core.Add(MakeRequest(1));
  core.Add(MakeRequest(2));
  StepPlan plan = core.Plan(MakeBudget(), TimePoint{});
  EXPECT_THROW(core.Commit(plan, {{1, 50}}), std::invalid_argument);                    // 2 missing
  EXPECT_THROW(core.Commit(plan, {{1, 50}, {2, 51}, {2, 52}}), std::invalid_argument);  // twice
  EXPECT_THROW(core.Commit(plan, {{1, 50}, {2, 51}, {9, 1}}), std::invalid_argument);   // stray
  StepPlan stale = plan;
  stale.step_id = 99;
  EXPECT_THROW(core.Commit(stale, {{1, 50}, {2, 51}}), std::invalid_argument);
  core.CheckInvariants();
  auto events = core.Commit(plan, {{2, 51}, {1, 50}});
  ASSERT_EQ(events.size(), 2u);
  EXPECT_EQ(events[0].seq_id, 1u);
  EXPECT_EQ(events[0].new_tokens, std::vector<int32_t>{50});
  EXPECT_EQ(events[0].finish, FinishKind::kNone);
  EXPECT_EQ(events[1].new_tokens, std::vector<int32_t>{51});
  EXPECT_THROW(core.Commit(plan, {}), std::invalid_argument);  // already committed
  StepPlan next = core.Plan(MakeBudget(), TimePoint{});
  EXPECT_EQ(next.step_id, 2u);
  EXPECT_TRUE(next.new_sequences.empty());
  ASSERT_EQ(next.scheduled.size(), 2u);
  EXPECT_EQ(next.scheduled[0].num_tokens, 1);
}

// Runs a single request to its end with the given samples; returns the last event.
SeqEvent RunWith(SchedulerCore& core, uint64_t id, const std::vector<int32_t>& samples) {
  SeqEvent last;
  for (int32_t token : samples) {
    StepPlan plan = core.Plan(MakeBudget(), TimePoint{});
    auto events = core.Commit(plan, {{id, token}});
    EXPECT_EQ(events.size(), 1u);
    last = events.back();
    if (last.finish != FinishKind::kNone) break;
  }
  return last;
}

TEST(SchedulerCoreTest, FinishKinds) {
  SchedulerCore core(MakeConfig());
  core.Add(MakeRequest(1, {.max_tokens = 5}));
  EXPECT_EQ(RunWith(core, 1, {20, testing::kEosToken}).finish, FinishKind::kEos);
  core.Add(MakeRequest(2, {.max_tokens = 3, .ignore_eos = true}));
  EXPECT_EQ(RunWith(core, 2, {testing::kEosToken, testing::kEosToken, 20}).finish,
            FinishKind::kLength);
  core.Add(MakeRequest(3, {.max_tokens = 5, .stop_token_ids = {77}}));
  SeqEvent stop = RunWith(core, 3, {20, 77});
  EXPECT_EQ(stop.finish, FinishKind::kStopToken);
  EXPECT_EQ(stop.new_tokens, std::vector<int32_t>{77});
  SchedulerCore tight(MakeConfig(64, 4, /*max_model_len=*/10));
  tight.Add(MakeRequest(4, {.prompt_len = 8, .max_tokens = 2}));
  EXPECT_EQ(RunWith(tight, 4, {20, 21}).finish, FinishKind::kLength);
  EXPECT_FALSE(core.is_live(1));
  // Finished ids reach the worker in the next plan; then nothing is left.
  StepPlan plan = core.Plan(MakeBudget(), TimePoint{});
  EXPECT_EQ(plan.finished_ids, std::vector<uint64_t>{3});
  core.Commit(plan, {});
  EXPECT_FALSE(core.has_work());
  EXPECT_EQ(core.num_free_blocks(), core.num_total_blocks());
}

TEST(SchedulerCoreTest, MinTokensLetsNoEndTokenFinishBeforeIt) {
  SchedulerCore core(MakeConfig());
  RequestSpec r = MakeRequest(1, {.max_tokens = 6, .stop_token_ids = {77}});
  r.sampling.min_tokens = 3;
  core.Add(r);
  // The worker suppresses these before min_tokens; should one come, it ends nothing.
  SeqEvent early = RunWith(core, 1, {testing::kEosToken, 77});
  EXPECT_EQ(early.finish, FinishKind::kNone);
  EXPECT_EQ(RunWith(core, 1, {77}).finish, FinishKind::kStopToken);  // the third token may stop
}

TEST(SchedulerCoreTest, CancelRunningFreesBlocksAndTellsWorker) {
  SchedulerCore core(MakeConfig(16, 4));
  core.Add(MakeRequest(1, {.prompt_len = 10}));
  core.Add(MakeRequest(2, {.prompt_len = 10}));
  StepPlan plan = core.Plan(MakeBudget(), TimePoint{});
  core.Commit(plan, {{1, 20}, {2, 21}});
  EXPECT_EQ(core.num_free_blocks(), 10);
  core.Cancel(1);
  EXPECT_EQ(core.num_free_blocks(), 13);
  EXPECT_FALSE(core.is_live(1));
  core.Cancel(1);     // twice: ignored
  core.Cancel(1234);  // unknown: ignored
  StepPlan next = core.Plan(MakeBudget(), TimePoint{});
  EXPECT_EQ(next.finished_ids, std::vector<uint64_t>{1});
  ASSERT_EQ(next.scheduled.size(), 1u);
  EXPECT_EQ(next.scheduled[0].seq_id, 2u);
  core.CheckInvariants();
}

TEST(SchedulerCoreTest, CancelWaitingIsNotSentToWorker) {
  SchedulerCore core(MakeConfig());
  core.Add(MakeRequest(1));
  core.Cancel(1);
  EXPECT_EQ(core.num_waiting(), 0);
  EXPECT_TRUE(core.Plan(MakeBudget(), TimePoint{}).empty());
}

TEST(SchedulerCoreTest, CancelDuringStepIgnoresItsSample) {
  SchedulerCore core(MakeConfig(16, 4));
  core.Add(MakeRequest(1));
  core.Add(MakeRequest(2));
  StepPlan plan = core.Plan(MakeBudget(), TimePoint{});
  core.Cancel(2);
  EXPECT_EQ(core.num_free_blocks(), 14);
  auto events = core.Commit(plan, {{1, 20}, {2, 21}});
  ASSERT_EQ(events.size(), 1u);
  EXPECT_EQ(events[0].seq_id, 1u);
  core.CheckInvariants();
  EXPECT_EQ(core.Plan(MakeBudget(), TimePoint{}).finished_ids, std::vector<uint64_t>{2});
}

TEST(SchedulerCoreTest, AbortAllEndsEverythingOnce) {
  SchedulerCore core(MakeConfig(16, 4));
  for (uint64_t id : {3, 1, 2}) core.Add(MakeRequest(id));
  StepPlan plan = core.Plan(MakeBudget(/*max_num_seqs=*/2), TimePoint{});
  ASSERT_EQ(plan.scheduled.size(), 2u);
  auto events = core.AbortAll();  // with the step in flight
  ASSERT_EQ(events.size(), 3u);
  for (size_t i = 0; i < 3; ++i) {
    EXPECT_EQ(events[i].seq_id, i + 1);
    EXPECT_EQ(events[i].finish, FinishKind::kAborted);
  }
  EXPECT_EQ(core.num_free_blocks(), 16);
  EXPECT_EQ(core.num_running() + core.num_waiting(), 0);
  EXPECT_FALSE(core.is_step_in_flight());
  EXPECT_TRUE(core.AbortAll().empty());
  StepPlan next = core.Plan(MakeBudget(), TimePoint{});  // the two the worker saw
  EXPECT_EQ(next.finished_ids.size(), 2u);
  core.CheckInvariants();
}

TEST(SchedulerCoreTest, ChunkedPrefillSamplesOnlyAtTheEnd) {
  SchedulerCore core(MakeConfig(64, 4));
  core.Add(MakeRequest(1, {.prompt_len = 25}));
  StepPlan a = core.Plan(MakeBudget(256, 10), TimePoint{});
  EXPECT_EQ(a.scheduled[0].num_tokens, 10);
  EXPECT_THROW(core.Commit(a, {{1, 5}}), std::invalid_argument);  // no sample mid-prompt
  EXPECT_TRUE(core.Commit(a, {}).empty());
  StepPlan b = core.Plan(MakeBudget(256, 10), TimePoint{});
  EXPECT_TRUE(b.new_sequences.empty());
  EXPECT_EQ(b.scheduled[0].num_tokens, 10);
  core.Commit(b, {});
  StepPlan c = core.Plan(MakeBudget(256, 10), TimePoint{});
  EXPECT_EQ(c.scheduled[0].num_tokens, 5);
  EXPECT_EQ(core.Commit(c, {{1, 42}}).size(), 1u);
  EXPECT_EQ(core.block_ids(1).size(), 7u);  // 25 computed tokens
}

TEST(SchedulerCoreTest, RejectsNonPositiveBudget) {
  SchedulerCore core(MakeConfig());
  EXPECT_THROW(core.Plan(MakeBudget(0, 10), TimePoint{}), std::invalid_argument);
  EXPECT_THROW(core.Plan(MakeBudget(1, 0), TimePoint{}), std::invalid_argument);
}

// Scores prompt tokens [first_index, first_index + count) of `r` as a worker would.
PromptLogprobs ScorePrompt(const RequestSpec& r, int32_t first_index, int32_t count) {
  PromptLogprobs out{.seq_id = r.seq_id, .first_index = first_index, .logprobs = {}};
  for (int32_t i = first_index; i < first_index + count; ++i) {
    out.logprobs.push_back(TokenLogprob{.token_id = r.prompt[static_cast<size_t>(i)], .logprob = -0.5f * i, .top = {}});
  }
  return out;
}

TEST(SchedulerCoreTest, PromptLogprobsAreForwardedOnceInOrderAndNeverServedFromCache) {
  SchedulerConfig cfg = MakeConfig(/*num_kv_blocks=*/64, /*block_size=*/4);
  cfg.enable_prefix_caching = true;
  SchedulerCore core(cfg);
  // A first request leaves the 12-token prompt's blocks in the prefix cache.
  const RequestSpec cached = MakeRequest(1, {.prompt_len = 12, .max_tokens = 1});
  core.Add(cached);
  StepPlan plan = core.Plan(MakeBudget(), TimePoint{});
  core.Commit(plan, {SampledToken{1, 5, std::nullopt}});
  RequestSpec scored = cached;
  scored.seq_id = 2;
  scored.sampling.prompt_logprobs = 0;
  core.Add(scored);
  plan = core.Plan(MakeBudget(256, /*max_num_batched_tokens=*/8), TimePoint{});
  ASSERT_EQ(plan.new_sequences.size(), 1u);
  EXPECT_EQ(plan.new_sequences[0].num_cached_tokens, 0) << "its prompt positions must all be computed";
  EXPECT_EQ(plan.new_sequences[0].sampling.prompt_logprobs, 0);
  // Positions 0..7 score prompt tokens 1..8; no token is sampled yet.
  std::vector<SeqEvent> events = core.Commit(plan, {}, {ScorePrompt(scored, 1, 8)});
  ASSERT_EQ(events.size(), 1u);
  EXPECT_TRUE(events[0].new_tokens.empty());
  EXPECT_EQ(events[0].finish, FinishKind::kNone);
  ASSERT_EQ(events[0].prompt_logprobs.size(), 8u);
  EXPECT_EQ(events[0].prompt_logprobs[0].token_id, scored.prompt[1]);
  // The last chunk comes from a worker that recomputed the whole prompt (as after a preemption):
  // only tokens 9..11 are new, and they come with the first sampled token.
  plan = core.Plan(MakeBudget(256, 8), TimePoint{});
  events = core.Commit(plan, {SampledToken{2, 6, std::nullopt}}, {ScorePrompt(scored, 1, 11)});
  ASSERT_EQ(events.size(), 1u);
  EXPECT_EQ(events[0].new_tokens, std::vector<int32_t>{6});
  ASSERT_EQ(events[0].prompt_logprobs.size(), 3u);
  for (int32_t i = 0; i < 3; ++i) {
    EXPECT_EQ(events[0].prompt_logprobs[static_cast<size_t>(i)].token_id, scored.prompt[static_cast<size_t>(9 + i)]);
    EXPECT_FLOAT_EQ(events[0].prompt_logprobs[static_cast<size_t>(i)].logprob, -0.5f * static_cast<float>(9 + i));
  }
  EXPECT_EQ(events[0].finish, FinishKind::kLength);
}

}  // namespace
}  // namespace ferry::scheduler
