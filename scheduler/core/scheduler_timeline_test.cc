// Timeline tests: the scheduler drives a fake worker for many iterations and
// every step of the timeline is checked (TensorRT-LLM microBatchSchedulerTest
// style). Failures name the iteration through SCOPED_TRACE.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdio>
#include <map>
#include <random>
#include <set>
#include <string>
#include <vector>

#include "scheduler/core/scheduler_core.h"
#include "scheduler/core/scheduler_test_util.h"

namespace ferry::scheduler {
namespace {

using testing::Harness;
using testing::MakeBudget;
using testing::MakeConfig;
using testing::MakeRequest;
using testing::RequestOptions;

std::string Iteration(int i) { return "iteration " + std::to_string(i); }

TEST(SchedulerTimelineTest, ContinuousBatchingAdmitsAsOthersFinish) {
  Harness h(MakeConfig());
  for (uint64_t id = 1; id <= 12; ++id) {
    h.Add(MakeRequest(id, {.prompt_len = 8, .max_tokens = 32,
                           .eos_after = static_cast<int32_t>(2 + (id * 5) % 11)}));
  }
  const Budget budget = MakeBudget(/*max_num_seqs=*/4);
  std::vector<uint64_t> admitted;
  for (int i = 0; h.core.has_work(); ++i) {
    SCOPED_TRACE(Iteration(i));
    ASSERT_LT(i, 1000);
    const int32_t waiting_before = h.core.num_waiting();
    const int32_t running_before = h.core.num_running();
    StepPlan plan = h.Step(budget);
    for (const auto& n : plan.new_sequences) admitted.push_back(n.seq_id);
    // A seat freed by a finished sequence is filled in the very next step.
    const int32_t expect_admit = std::min(waiting_before, 4 - running_before);
    EXPECT_EQ(static_cast<int32_t>(plan.new_sequences.size()), expect_admit);
    EXPECT_LE(h.core.num_running(), 4);
  }
  std::vector<uint64_t> in_order(12);
  for (uint64_t id = 1; id <= 12; ++id) in_order[id - 1] = id;
  EXPECT_EQ(admitted, in_order);  // same priority: arrival order
  h.ExpectOutcomesMatchReference();
  EXPECT_EQ(h.core.num_free_blocks(), h.core.num_total_blocks());
}

TEST(SchedulerTimelineTest, BudgetsNeverExceededUnderChangingBudgets) {
  Harness h(MakeConfig(/*num_kv_blocks=*/128, /*block_size=*/4, /*max_model_len=*/128));
  std::mt19937 rng(7);
  for (uint64_t id = 1; id <= 300; ++id) {
    h.Add(MakeRequest(id, {.prompt_len = 1 + static_cast<int32_t>(rng() % 70),
                           .max_tokens = 1 + static_cast<int32_t>(rng() % 30),
                           .eos_after = static_cast<int32_t>(rng() % 40) - 10}));
  }
  for (int i = 0; h.core.has_work(); ++i) {
    SCOPED_TRACE(Iteration(i));
    ASSERT_LT(i, 20000);
    Budget budget = MakeBudget(1 + static_cast<int32_t>(rng() % 12),
                               1 + static_cast<int32_t>(rng() % 96));
    StepPlan plan = h.Step(budget);  // the harness checks both limits
    if (h.core.num_running() > budget.max_num_seqs) {
      EXPECT_TRUE(plan.new_sequences.empty());  // never admits past the cap
    }
  }
  h.ExpectOutcomesMatchReference();
}

// The long prompt runs at the decodes' priority (served after them) and at a
// higher one (served first): either way the decodes keep their tokens.
class ChunkedPrefillTest : public ::testing::TestWithParam<int32_t> {};

TEST_P(ChunkedPrefillTest, SplitsLongPromptWithoutStarvingDecodes) {
  Harness h(MakeConfig(/*num_kv_blocks=*/256, /*block_size=*/4, /*max_model_len=*/512));
  const Budget budget = MakeBudget(/*max_num_seqs=*/8, /*max_num_batched_tokens=*/32);
  for (uint64_t id = 1; id <= 3; ++id) h.Add(MakeRequest(id, {.prompt_len = 6, .max_tokens = 60}));
  h.Step(budget);  // all three prefill together (18 tokens)
  h.Add(MakeRequest(9, {.prompt_len = 200, .max_tokens = 4, .priority = GetParam()}));
  std::vector<int32_t> chunks;
  for (int i = 0; h.core.is_live(9) && h.outcomes[9].tokens.empty(); ++i) {
    SCOPED_TRACE(Iteration(i));
    ASSERT_LT(i, 100);
    StepPlan plan = h.Step(budget);
    int32_t decodes = 0;
    for (const auto& s : plan.scheduled) {
      if (s.seq_id == 9) chunks.push_back(s.num_tokens);
      else if (s.num_tokens == 1) ++decodes;
    }
    EXPECT_EQ(decodes, 3) << "every decode runs while the long prompt prefills";
    EXPECT_LE(plan.num_scheduled_tokens(), 32);
  }
  // 200 tokens in chunks of 32 - 3 = 29.
  EXPECT_EQ(chunks, (std::vector<int32_t>{29, 29, 29, 29, 29, 29, 26}));
  EXPECT_EQ(h.times_sent[9], 1);
  h.RunToCompletion(budget);
  h.ExpectOutcomesMatchReference();
}

INSTANTIATE_TEST_SUITE_P(Priorities, ChunkedPrefillTest, ::testing::Values(0, 5));

TEST(SchedulerTimelineTest, PartialPrefillContinuesBeforeNewAdmissions) {
  Harness h(MakeConfig(/*num_kv_blocks=*/256, /*block_size=*/4, /*max_model_len=*/512));
  const Budget budget = MakeBudget(/*max_num_seqs=*/8, /*max_num_batched_tokens=*/16);
  h.Add(MakeRequest(1, {.prompt_len = 40, .max_tokens = 2}));
  for (uint64_t id = 2; id <= 4; ++id) h.Add(MakeRequest(id, {.prompt_len = 4, .max_tokens = 2}));
  StepPlan first = h.Step(budget);
  ASSERT_EQ(first.scheduled.size(), 1u);  // the whole budget goes to seq 1
  EXPECT_EQ(first.scheduled[0].num_tokens, 16);
  StepPlan second = h.Step(budget);
  ASSERT_EQ(second.scheduled.size(), 1u);
  EXPECT_EQ(second.scheduled[0].seq_id, 1u);
  StepPlan third = h.Step(budget);  // 8 left for seq 1, then 8 for the next two
  ASSERT_EQ(third.scheduled.size(), 3u);
  EXPECT_EQ(third.scheduled[0].num_tokens, 8);
  h.RunToCompletion(budget);
  h.ExpectOutcomesMatchReference();
}

TEST(SchedulerTimelineTest, AdmitsByPriorityThenArrival) {
  Harness h(MakeConfig());
  h.Add(MakeRequest(1, {.max_tokens = 3, .priority = 0, .arrival_ms = 10}));
  h.Add(MakeRequest(2, {.max_tokens = 3, .priority = 0, .arrival_ms = 20}));
  h.Add(MakeRequest(3, {.max_tokens = 3, .priority = 5, .arrival_ms = 30}));
  h.Add(MakeRequest(4, {.max_tokens = 3, .priority = 2, .arrival_ms = 40}));
  h.Add(MakeRequest(5, {.max_tokens = 3, .priority = 5, .arrival_ms = 50}));
  h.Add(MakeRequest(6, {.max_tokens = 3, .priority = 0, .arrival_ms = 5}));  // added late, arrived first
  std::vector<uint64_t> admitted;
  for (int i = 0; h.core.has_work(); ++i) {
    SCOPED_TRACE(Iteration(i));
    ASSERT_LT(i, 100);
    for (const auto& n : h.Step(MakeBudget(/*max_num_seqs=*/1)).new_sequences) {
      admitted.push_back(n.seq_id);
    }
  }
  EXPECT_EQ(admitted, (std::vector<uint64_t>{3, 5, 4, 6, 1, 2}));
  h.ExpectOutcomesMatchReference();
}

// Tracks start order to check the preemption victim rule.
struct StartTracker {
  std::vector<uint64_t> running;  // in (re)start order
  void After(const StepPlan& plan, const SchedulerCore& core) {
    for (uint64_t id : plan.preempted_ids) std::erase(running, id);
    for (const auto& n : plan.new_sequences) running.push_back(n.seq_id);
    std::erase_if(running, [&](uint64_t id) { return !core.is_live(id); });
  }
};

TEST(SchedulerTimelineTest, PreemptsNewestUnderBlockPressureAndResumesIdentically) {
  // Six sequences each needing 10 blocks at their end; the pool holds 24.
  Harness h(MakeConfig(/*num_kv_blocks=*/24, /*block_size=*/4, /*max_model_len=*/64));
  for (uint64_t id = 1; id <= 6; ++id) h.Add(MakeRequest(id, {.prompt_len = 10, .max_tokens = 30}));
  StartTracker starts;
  int num_preempting_steps = 0;
  for (int i = 0; h.core.has_work(); ++i) {
    SCOPED_TRACE(Iteration(i));
    ASSERT_LT(i, 2000);
    std::vector<uint64_t> before = starts.running;
    const auto outcomes_before = h.outcomes;  // Step records this step's samples
    StepPlan plan = h.Step();
    if (!plan.preempted_ids.empty()) {
      ++num_preempting_steps;
      // Victims are the most recently started running sequences, newest first.
      std::vector<uint64_t> newest(before.rbegin(), before.rbegin() + plan.preempted_ids.size());
      EXPECT_EQ(plan.preempted_ids, newest);
      EXPECT_TRUE(plan.new_sequences.empty()) << "no admission in a preempting step";
    }
    for (const auto& n : plan.new_sequences) {
      // A resumed sequence is re-sent with everything it generated so far.
      const auto& generated = outcomes_before.at(n.seq_id).tokens;
      EXPECT_EQ(n.num_generated, static_cast<int32_t>(generated.size()));
      EXPECT_TRUE(std::equal(generated.begin(), generated.end(),
                             n.token_ids.end() - n.num_generated));
    }
    starts.After(plan, h.core);
  }
  EXPECT_GT(num_preempting_steps, 0);
  EXPECT_GT(h.core.num_preemptions(), 0u);
  for (const auto& [id, n] : h.times_preempted) EXPECT_EQ(h.times_sent[id], n + 1);
  h.ExpectOutcomesMatchReference();  // recompute gives the same tokens
  EXPECT_EQ(h.core.num_free_blocks(), 24);
}

TEST(SchedulerTimelineTest, PreemptsLowestPriorityFirst) {
  Harness h(MakeConfig(/*num_kv_blocks=*/16, /*block_size=*/4, /*max_model_len=*/64));
  for (uint64_t id = 1; id <= 3; ++id) h.Add(MakeRequest(id, {.prompt_len = 8, .max_tokens = 40}));
  h.Step();
  h.Add(MakeRequest(10, {.prompt_len = 8, .max_tokens = 40, .priority = 9}));
  std::set<uint64_t> preempted;
  for (int i = 0; h.core.is_live(10); ++i) {
    SCOPED_TRACE(Iteration(i));
    ASSERT_LT(i, 500);
    StepPlan plan = h.Step();
    preempted.insert(plan.preempted_ids.begin(), plan.preempted_ids.end());
  }
  EXPECT_FALSE(preempted.empty());
  EXPECT_FALSE(preempted.contains(10)) << "the high-priority sequence is never the victim";
  EXPECT_EQ(h.times_sent[10], 1);
  h.RunToCompletion();
  h.ExpectOutcomesMatchReference();
}

TEST(SchedulerTimelineTest, CancellationFreesBlocksAndEndsOnce) {
  Harness h(MakeConfig(/*num_kv_blocks=*/32, /*block_size=*/4, /*max_model_len=*/128));
  for (uint64_t id = 1; id <= 6; ++id) h.Add(MakeRequest(id, {.prompt_len = 12, .max_tokens = 50}));
  const Budget budget = MakeBudget(/*max_num_seqs=*/4);
  for (int i = 0; i < 5; ++i) h.Step(budget);
  const int32_t free_before = h.core.num_free_blocks();
  const int32_t held = static_cast<int32_t>(h.core.block_ids(2).size());
  ASSERT_GT(held, 0);
  h.Cancel(2);  // running
  EXPECT_EQ(h.core.num_free_blocks(), free_before + held);
  h.Cancel(6);  // waiting, never sent
  StepPlan plan = h.Step(budget);
  EXPECT_EQ(plan.finished_ids, std::vector<uint64_t>{2});
  EXPECT_FALSE(h.worker.knows(2));
  h.RunToCompletion(budget);
  h.ExpectOutcomesMatchReference();
  EXPECT_EQ(h.worker.num_known(), 0u);
  EXPECT_EQ(h.core.num_free_blocks(), 32);
}

TEST(SchedulerTimelineTest, PlanDiffSendsTokensOnceAndBlocksRebuildTheTable) {
  Harness h(MakeConfig(/*num_kv_blocks=*/40, /*block_size=*/4, /*max_model_len=*/128));
  for (uint64_t id = 1; id <= 8; ++id) {
    h.Add(MakeRequest(id, {.prompt_len = static_cast<int32_t>(5 + 9 * id), .max_tokens = 20}));
  }
  const Budget budget = MakeBudget(/*max_num_seqs=*/6, /*max_num_batched_tokens=*/24);
  for (int i = 0; h.core.has_work(); ++i) {
    SCOPED_TRACE(Iteration(i));
    ASSERT_LT(i, 2000);
    StepPlan plan = h.Step(budget);
    for (const auto& n : plan.new_sequences) {
      if (h.times_preempted[n.seq_id] == 0) EXPECT_EQ(n.token_ids, h.requests[n.seq_id].prompt);
    }
    // The worker's table, built only from new_block_ids, is the scheduler's.
    for (const auto& s : plan.scheduled) {
      if (!h.core.is_live(s.seq_id)) continue;
      auto table = h.core.block_ids(s.seq_id);
      EXPECT_EQ(h.worker.block_table(s.seq_id), std::vector<BlockId>(table.begin(), table.end()));
    }
  }
  for (const auto& [id, n] : h.times_sent) EXPECT_EQ(n, 1 + h.times_preempted[id]);
  h.ExpectOutcomesMatchReference();
}

// With one step in flight and with two (async scheduling).
class RandomisedTimelineTest : public ::testing::TestWithParam<int32_t> {};

TEST_P(RandomisedTimelineTest, InvariantsHold) {
  SchedulerConfig cfg = MakeConfig(/*num_kv_blocks=*/48, /*block_size=*/4, /*max_model_len=*/128);
  cfg.max_steps_in_flight = GetParam();
  Harness h(cfg);
  std::mt19937 rng(2024);
  auto uniform = [&](int lo, int hi) { return lo + static_cast<int>(rng() % (hi - lo + 1)); };
  constexpr uint64_t kNumRequests = 2000;
  uint64_t next_id = 1;
  std::vector<uint64_t> ids;
  for (int i = 0; next_id <= kNumRequests || h.core.has_work() || h.num_in_flight() > 0; ++i) {
    SCOPED_TRACE(Iteration(i));
    ASSERT_LT(i, 200000);
    for (int n = uniform(0, 3); n > 0 && next_id <= kNumRequests; --n, ++next_id) {
      h.Add(MakeRequest(next_id, {.prompt_len = uniform(1, 60), .max_tokens = uniform(1, 40),
                                  .eos_after = uniform(-20, 30), .priority = uniform(0, 2),
                                  .arrival_ms = i,
                                  .stop_token_ids = {static_cast<int32_t>(uniform(10, 999))}}));
      ids.push_back(next_id);
    }
    if (uniform(0, 99) < 5 && !ids.empty()) h.Cancel(ids[rng() % ids.size()]);
    h.Step(MakeBudget(uniform(1, 16), uniform(1, 128)));
  }
  EXPECT_EQ(h.core.num_free_blocks(), h.core.num_total_blocks());
  EXPECT_EQ(h.core.num_running() + h.core.num_waiting(), 0);
  EXPECT_EQ(h.worker.num_known(), 0u);
  EXPECT_EQ(h.outcomes.size(), kNumRequests);
  EXPECT_GT(h.core.num_preemptions(), 0u);
  std::map<FinishKind, int> ends;
  for (const auto& [id, o] : h.outcomes) ++ends[o.finish];
  for (auto kind : {FinishKind::kEos, FinishKind::kStopToken, FinishKind::kLength,
                    FinishKind::kCancelled}) {
    EXPECT_GT(ends[kind], 0) << FinishKindName(kind);
  }
  std::printf("steps=%llu preemptions=%llu eos=%d stop=%d length=%d cancelled=%d\n",
              static_cast<unsigned long long>(h.core.num_steps()),
              static_cast<unsigned long long>(h.core.num_preemptions()), ends[FinishKind::kEos],
              ends[FinishKind::kStopToken], ends[FinishKind::kLength], ends[FinishKind::kCancelled]);
  h.ExpectOutcomesMatchReference();  // also: every request ended exactly once
}

INSTANTIATE_TEST_SUITE_P(StepsInFlight, RandomisedTimelineTest, ::testing::Values(1, 2, 3));

// Priority preemption: a waiting request short of a seat or blocks preempts
// the lowest-priority running sequence of strictly lower priority that has
// the fewest whole blocks to recompute (the latest started among equals), and
// starts in the same step.
bool Has(const std::vector<uint64_t>& ids, uint64_t id) {
  return std::find(ids.begin(), ids.end(), id) != ids.end();
}
bool IsScheduled(const StepPlan& plan, uint64_t id) {
  return std::any_of(plan.scheduled.begin(), plan.scheduled.end(),
                     [&](const ScheduledSequence& s) { return s.seq_id == id; });
}

TEST(PriorityPreemptionTest, HigherPriorityTakesASeatWithinOneStep) {
  Harness h(MakeConfig());
  const Budget two_seats = MakeBudget(/*max_num_seqs=*/2);
  h.Add(MakeRequest(1, {.prompt_len = 8, .max_tokens = 40, .ignore_eos = true}));
  h.Add(MakeRequest(2, {.prompt_len = 8, .max_tokens = 40, .ignore_eos = true}));
  h.Step(two_seats);
  h.Step(two_seats);
  h.Add(MakeRequest(3, {.prompt_len = 8, .max_tokens = 8, .priority = 1, .ignore_eos = true}));
  const StepPlan plan = h.Step(two_seats);
  EXPECT_EQ(plan.preempted_ids, std::vector<uint64_t>{2});  // the later started of equal priority
  EXPECT_TRUE(IsScheduled(plan, 3));
  EXPECT_TRUE(IsScheduled(plan, 1));
  EXPECT_FALSE(IsScheduled(plan, 2));
  EXPECT_EQ(h.core.num_priority_preemptions(), 1u);
  h.RunToCompletion(two_seats);
  h.ExpectOutcomesMatchReference();  // the resumed sequence's output is identical
}

TEST(PriorityPreemptionTest, TakesTheSeatThatIsCheapestToRecompute) {
  Harness h(MakeConfig());
  const Budget two_seats = MakeBudget(/*max_num_seqs=*/2);
  h.Add(MakeRequest(1, {.prompt_len = 8, .max_tokens = 40, .ignore_eos = true}));
  h.Step(two_seats);
  h.Add(MakeRequest(2, {.prompt_len = 120, .max_tokens = 40, .ignore_eos = true}));
  h.Step(two_seats);  // 2 started later but holds 30 blocks to recompute to 1's 2
  h.Add(MakeRequest(3, {.prompt_len = 8, .max_tokens = 8, .priority = 1, .ignore_eos = true}));
  const StepPlan plan = h.Step(two_seats);
  EXPECT_EQ(plan.preempted_ids, std::vector<uint64_t>{1});
  EXPECT_TRUE(IsScheduled(plan, 3));
  EXPECT_TRUE(IsScheduled(plan, 2));
  h.RunToCompletion(two_seats);
  h.ExpectOutcomesMatchReference();
}

TEST(PriorityPreemptionTest, CachedBlocksMakeAVictimCheap) {
  // The same sequences as above with prefix caching: 2's prompt sits in
  // published blocks, so resuming it recomputes less than a block, as for 1,
  // and the latest started is taken.
  SchedulerConfig cfg = MakeConfig();
  cfg.enable_prefix_caching = true;
  Harness h(cfg);
  const Budget two_seats = MakeBudget(/*max_num_seqs=*/2);
  h.Add(MakeRequest(1, {.prompt_len = 8, .max_tokens = 40, .ignore_eos = true}));
  h.Step(two_seats);
  h.Add(MakeRequest(2, {.prompt_len = 120, .max_tokens = 40, .ignore_eos = true}));
  h.Step(two_seats);
  h.Add(MakeRequest(3, {.prompt_len = 8, .max_tokens = 8, .priority = 1, .ignore_eos = true}));
  const StepPlan plan = h.Step(two_seats);
  EXPECT_EQ(plan.preempted_ids, std::vector<uint64_t>{2});
  EXPECT_TRUE(IsScheduled(plan, 3));
  h.RunToCompletion(two_seats);
  h.ExpectOutcomesMatchReference();
  EXPECT_GT(h.core.num_prefix_cache_hits(), 0u);  // 2 resumed from its cached blocks
}

TEST(PriorityPreemptionTest, EqualPriorityNeverPreempts) {
  Harness h(MakeConfig());
  const Budget two_seats = MakeBudget(/*max_num_seqs=*/2);
  h.Add(MakeRequest(1, {.prompt_len = 8, .max_tokens = 20, .priority = 1, .ignore_eos = true}));
  h.Add(MakeRequest(2, {.prompt_len = 8, .max_tokens = 20, .ignore_eos = true}));
  h.Step(two_seats);
  h.Add(MakeRequest(3, {.prompt_len = 8, .max_tokens = 8, .ignore_eos = true}));  // = 2's priority
  for (int i = 0; i < 5; ++i) {
    const StepPlan plan = h.Step(two_seats);
    SCOPED_TRACE(i);
    EXPECT_TRUE(plan.preempted_ids.empty());
    EXPECT_FALSE(IsScheduled(plan, 3));
  }
  h.RunToCompletion(two_seats);
  EXPECT_EQ(h.core.num_preemptions(), 0u);
  h.ExpectOutcomesMatchReference();
}

TEST(PriorityPreemptionTest, HigherPriorityTakesBlocksWithinOneStep) {
  // 12 blocks of 4 tokens: two low-priority sequences hold 5 each.
  Harness h(MakeConfig(/*num_kv_blocks=*/12, /*block_size=*/4, /*max_model_len=*/44));
  h.Add(MakeRequest(1, {.prompt_len = 20, .max_tokens = 20, .ignore_eos = true}));
  h.Add(MakeRequest(2, {.prompt_len = 20, .max_tokens = 20, .ignore_eos = true}));
  h.Step();
  h.Add(MakeRequest(3, {.prompt_len = 12, .max_tokens = 4, .priority = 2, .ignore_eos = true}));
  const StepPlan plan = h.Step();
  EXPECT_TRUE(Has(plan.preempted_ids, 2));
  EXPECT_FALSE(Has(plan.preempted_ids, 1));
  EXPECT_TRUE(IsScheduled(plan, 3));
  h.RunToCompletion();
  h.ExpectOutcomesMatchReference();
}

TEST(PriorityPreemptionTest, RandomPrioritiesKeepInvariantsAndOutput) {
  Harness h(MakeConfig(/*num_kv_blocks=*/48, /*block_size=*/4, /*max_model_len=*/96));
  std::mt19937 rng(5);
  uint64_t id = 0;
  for (int step = 0; step < 3000 && (id < 300 || h.core.has_work()); ++step) {
    SCOPED_TRACE(step);
    if (id < 300 && rng() % 3 == 0) {
      ++id;
      h.Add(MakeRequest(id, {.prompt_len = 1 + static_cast<int32_t>(rng() % 40),
                             .max_tokens = 1 + static_cast<int32_t>(rng() % 40),
                             .priority = static_cast<int32_t>(rng() % 3), .ignore_eos = true}));
    }
    ASSERT_NO_THROW(h.Step(MakeBudget(1 + static_cast<int32_t>(rng() % 6), 16 + static_cast<int32_t>(rng() % 64))));
  }
  EXPECT_FALSE(h.core.has_work());
  EXPECT_GT(h.core.num_priority_preemptions(), 0u);
  h.ExpectOutcomesMatchReference();
}

}  // namespace
}  // namespace ferry::scheduler
