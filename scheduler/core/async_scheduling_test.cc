// Async scheduling (SchedulerConfig::max_steps_in_flight = 2): step N+1 is
// planned before step N's samples are known. Each test walks the protocol by
// hand against the fake worker, which runs every plan when it is sent (a
// worker runs steps in order), and checks the output equals the sequence run
// alone.
#include <gtest/gtest.h>

#include <algorithm>
#include <stdexcept>

#include "scheduler/core/scheduler_core.h"
#include "scheduler/core/scheduler_test_util.h"

namespace ferry::scheduler {
namespace {

using testing::FakeWorker;
using testing::Find;
using testing::Harness;
using testing::MakeBudget;
using testing::MakeConfig;
using testing::MakeRequest;
using testing::Reference;

SchedulerConfig AsyncConfig(int32_t num_kv_blocks = 64, int32_t block_size = 4) {
  SchedulerConfig cfg = MakeConfig(num_kv_blocks, block_size, /*max_model_len=*/128);
  cfg.max_steps_in_flight = 2;
  return cfg;
}

bool Has(const std::vector<uint64_t>& ids, uint64_t id) {
  return std::find(ids.begin(), ids.end(), id) != ids.end();
}

TEST(AsyncSchedulingTest, PlansTheNextDecodeBeforeTheSampleIsKnown) {
  const SchedulerConfig cfg = AsyncConfig();
  SchedulerCore core(cfg);
  FakeWorker worker(cfg.num_kv_blocks, cfg.block_size);
  const RequestSpec r = MakeRequest(1, {.prompt_len = 6, .max_tokens = 3, .ignore_eos = true});
  core.Add(r);
  const StepPlan p1 = core.Plan(MakeBudget(), TimePoint{});
  const auto s1 = worker.Execute(p1);
  // The prefill samples; step 2 decodes that token without knowing it.
  const StepPlan p2 = core.Plan(MakeBudget(), TimePoint{});
  ASSERT_NE(Find(p2, 1), nullptr);
  EXPECT_EQ(Find(p2, 1)->num_tokens, 1);
  EXPECT_TRUE(p2.new_sequences.empty());  // the worker appends its own sample
  EXPECT_EQ(core.num_steps_in_flight(), 2);
  EXPECT_THROW(core.Plan(MakeBudget(), TimePoint{}), std::logic_error);  // a third
  const auto s2 = worker.Execute(p2);
  EXPECT_THROW(core.Commit(p2, s2), std::invalid_argument);  // out of order
  std::vector<int32_t> out;
  for (const auto& e : core.Commit(p1, s1)) out.insert(out.end(), e.new_tokens.begin(), e.new_tokens.end());
  core.CheckInvariants();
  // The third token is the last: nothing more is planned for it.
  const StepPlan p3 = core.Plan(MakeBudget(), TimePoint{});
  ASSERT_NE(Find(p3, 1), nullptr);
  const auto s3 = worker.Execute(p3);
  for (const auto& e : core.Commit(p2, s2)) out.insert(out.end(), e.new_tokens.begin(), e.new_tokens.end());
  EXPECT_TRUE(core.Plan(MakeBudget(), TimePoint{}).empty());  // length is known ahead
  const auto events = core.Commit(p3, s3);
  ASSERT_EQ(events.size(), 1u);
  EXPECT_EQ(events[0].finish, FinishKind::kLength);
  out.push_back(events[0].new_tokens.at(0));
  EXPECT_EQ(out, Reference(r, cfg.max_model_len).tokens);
  core.CheckInvariants();
  EXPECT_EQ(core.num_free_blocks(), core.num_total_blocks());
}

TEST(AsyncSchedulingTest, AnEosFoundLateDropsTheExtraStep) {
  const SchedulerConfig cfg = AsyncConfig();
  SchedulerCore core(cfg);
  FakeWorker worker(cfg.num_kv_blocks, cfg.block_size);
  core.Add(MakeRequest(1, {.prompt_len = 6, .max_tokens = 10, .eos_after = 0}));  // eos first
  const StepPlan p1 = core.Plan(MakeBudget(), TimePoint{});
  const auto s1 = worker.Execute(p1);
  const StepPlan p2 = core.Plan(MakeBudget(), TimePoint{});  // runs it once more, unknowing
  ASSERT_NE(Find(p2, 1), nullptr);
  const auto s2 = worker.Execute(p2);
  const auto events = core.Commit(p1, s1);
  ASSERT_EQ(events.size(), 1u);
  EXPECT_EQ(events[0].finish, FinishKind::kEos);
  EXPECT_FALSE(core.is_live(1));
  EXPECT_EQ(core.num_free_blocks(), core.num_total_blocks());  // freed at once
  EXPECT_TRUE(core.Commit(p2, s2).empty());  // its extra sample is dropped
  const StepPlan p3 = core.Plan(MakeBudget(), TimePoint{});
  EXPECT_TRUE(Has(p3.finished_ids, 1));  // and the worker forgets it
  worker.Execute(p3);
  EXPECT_EQ(worker.num_known(), 0u);
}

TEST(AsyncSchedulingTest, ACancelWhileInFlightIgnoresItsSample) {
  const SchedulerConfig cfg = AsyncConfig();
  SchedulerCore core(cfg);
  FakeWorker worker(cfg.num_kv_blocks, cfg.block_size);
  core.Add(MakeRequest(1, {.prompt_len = 6, .max_tokens = 10}));
  core.Add(MakeRequest(2, {.prompt_len = 6, .max_tokens = 10}));
  const StepPlan p1 = core.Plan(MakeBudget(), TimePoint{});
  const auto s1 = worker.Execute(p1);
  const StepPlan p2 = core.Plan(MakeBudget(), TimePoint{});
  const auto s2 = worker.Execute(p2);
  core.Cancel(1);  // both its steps are in flight
  const auto events = core.Commit(p1, s1);
  ASSERT_EQ(events.size(), 1u);
  EXPECT_EQ(events[0].seq_id, 2u);
  EXPECT_EQ(core.Commit(p2, s2).size(), 1u);
  const StepPlan p3 = core.Plan(MakeBudget(), TimePoint{});
  EXPECT_TRUE(Has(p3.finished_ids, 1));
  worker.Execute(p3);  // the fake worker checks no block of 1 is reused while it holds it
  core.CheckInvariants();
}

TEST(AsyncSchedulingTest, APreemptedSequenceResumesOnlyWithItsPendingToken) {
  SchedulerConfig cfg = AsyncConfig();
  Harness h(cfg);
  const Budget one_seat = MakeBudget(/*max_num_seqs=*/1);
  h.Add(MakeRequest(1, {.prompt_len = 6, .max_tokens = 8, .ignore_eos = true}));
  h.Step(one_seat);  // 1's prefill, sampling: in flight
  h.Add(MakeRequest(2, {.prompt_len = 5, .max_tokens = 3, .priority = 1, .ignore_eos = true}));
  const StepPlan p2 = h.Step(one_seat);  // 2 takes the seat while 1's sample is pending
  EXPECT_TRUE(Has(p2.preempted_ids, 1));
  EXPECT_NE(Find(p2, 2), nullptr);
  h.RunToCompletion(one_seat);
  EXPECT_EQ(h.times_preempted[1], 1);
  EXPECT_EQ(h.times_sent[1], 2);
  h.ExpectOutcomesMatchReference();  // 1 resumed with the token sampled before its preemption
}

TEST(AsyncSchedulingTest, BlocksArePublishedWhenTheirStepIsCommitted) {
  SchedulerConfig cfg = AsyncConfig();
  cfg.enable_prefix_caching = true;
  Harness h(cfg);
  const std::vector<int32_t> prefix = {11, 12, 13, 14, 15, 16, 17, 18};  // two blocks of 4
  h.Add(MakeRequest(1, {.prompt_len = 3, .max_tokens = 4, .ignore_eos = true, .prefix = prefix}));
  h.Step();  // 1's prompt in flight
  // Planned while the step writing 1's blocks is in flight: no reuse yet.
  h.Add(MakeRequest(2, {.prompt_len = 3, .max_tokens = 4, .ignore_eos = true, .prefix = prefix}));
  h.Step();
  EXPECT_EQ(h.core.num_prefix_cache_hits(), 0u);
  h.RunToCompletion();
  h.Add(MakeRequest(3, {.prompt_len = 3, .max_tokens = 4, .ignore_eos = true, .prefix = prefix}));
  h.RunToCompletion();
  EXPECT_EQ(h.core.num_prefix_cache_hits(), 2u);  // committed by now: 3 reuses both blocks
  h.ExpectOutcomesMatchReference();
}

TEST(AsyncSchedulingTest, RejectsAStepsInFlightLimitOutsideOneToFour) {
  SchedulerConfig cfg = MakeConfig();
  cfg.max_steps_in_flight = 0;
  EXPECT_THROW(SchedulerCore{cfg}, std::invalid_argument);
  cfg.max_steps_in_flight = 5;
  EXPECT_THROW(SchedulerCore{cfg}, std::invalid_argument);
}

TEST(AsyncSchedulingTest, RejectsANegativeTokenIdNamingItsPosition) {
  SchedulerCore core(AsyncConfig());
  RequestSpec r = MakeRequest(1);
  r.prompt[3] = -1;
  try {
    core.Add(r);
    FAIL() << "accepted";
  } catch (const std::invalid_argument& e) {
    EXPECT_NE(std::string(e.what()).find("prompt[3] = -1, must be >= 0"), std::string::npos) << e.what();
  }
}

}  // namespace
}  // namespace ferry::scheduler
