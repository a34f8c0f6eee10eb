// Speculative decoding in the planner: a decode gets draft slots (num_lookahead_tokens) within its
// sequence's num_speculative_tokens, the step's token budget, the free blocks, max_tokens and
// max_model_len; its Commit takes 1 to 1 + slots samples and rolls the rejected slots back. Driven
// against the fake worker, whose drafts are right for a pseudo-random number of positions: every
// request's tokens equal its reference run, whatever the pool, prefix caching, steps in flight,
// preemptions or a lost worker.
#include <gtest/gtest.h>

#include <algorithm>
#include <random>

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
using testing::RequestOptions;

RequestSpec Speculating(uint64_t id, int32_t k, RequestOptions o) {
  RequestSpec r = MakeRequest(id, o);
  r.sampling.speculative_method = SpeculativeMethod::kNgram;
  r.sampling.num_speculative_tokens = k;
  return r;
}

TEST(SpeculativeSchedulingTest, DecodesGetSlotsWithinEveryLimit) {
  SchedulerConfig cfg = MakeConfig(64, 4, /*max_model_len=*/40);
  SchedulerCore core(cfg);
  FakeWorker worker(cfg.num_kv_blocks, cfg.block_size);
  core.Add(Speculating(1, 5, {.prompt_len = 6, .max_tokens = 4, .ignore_eos = true}));
  core.Add(Speculating(2, 5, {.prompt_len = 30, .max_tokens = 10, .ignore_eos = true}));
  core.Add(MakeRequest(3, {.prompt_len = 6, .max_tokens = 20, .ignore_eos = true}));
  StepPlan p = core.Plan(MakeBudget(), TimePoint{});
  for (const auto& s : p.scheduled) EXPECT_EQ(s.num_lookahead_tokens, 0) << "prefills speculate nothing";
  core.Commit(p, worker.Execute(p));
  p = core.Plan(MakeBudget(), TimePoint{});
  // 1: one generated, max_tokens 4: at most 2 drafts (1 + 2 samples reach 4).
  EXPECT_EQ(Find(p, 1)->num_lookahead_tokens, 2);
  // 2: 31 tokens of max_model_len 40: the step may bring 8 more at most, so 5 slots fit.
  EXPECT_EQ(Find(p, 2)->num_lookahead_tokens, 5);
  EXPECT_EQ(Find(p, 3)->num_lookahead_tokens, 0);
  EXPECT_EQ(p.num_scheduled_tokens(), 3);  // the drafts are not counted there...
  core.CheckInvariants();
  core.Commit(p, worker.Execute(p));
  core.CheckInvariants();
  // ...but they are in the token budget: with 4 tokens for 3 decodes, one slot is left.
  p = core.Plan(MakeBudget(256, 4), TimePoint{});
  int32_t slots = 0;
  for (const auto& s : p.scheduled) slots += s.num_lookahead_tokens;
  EXPECT_LE(slots + p.num_scheduled_tokens(), 4);
  core.Commit(p, worker.Execute(p));
  core.CheckInvariants();
}

TEST(SpeculativeSchedulingTest, CommitTakesOneToOnePlusSlotsSamples) {
  SchedulerConfig cfg = MakeConfig(64, 4, 64);
  SchedulerCore core(cfg);
  FakeWorker worker(cfg.num_kv_blocks, cfg.block_size);
  core.Add(Speculating(1, 3, {.prompt_len = 5, .max_tokens = 20, .ignore_eos = true}));
  StepPlan p = core.Plan(MakeBudget(), TimePoint{});
  core.Commit(p, worker.Execute(p));
  p = core.Plan(MakeBudget(), TimePoint{});
  ASSERT_EQ(Find(p, 1)->num_lookahead_tokens, 3);
  // Six tokens: five blocks of 4 cover the 5 + 1 computed and 3 slots.
  EXPECT_EQ(core.block_ids(1).size(), 3u);
  std::vector<SampledToken> five(5, SampledToken{1, 42});
  EXPECT_THROW(core.Commit(p, five), std::invalid_argument);
  EXPECT_THROW(core.Commit(p, {}), std::invalid_argument);
  const auto sampled = worker.Execute(p);
  const auto events = core.Commit(p, sampled);
  ASSERT_EQ(events.size(), 1u);
  EXPECT_EQ(events[0].new_tokens.size(), sampled.size());
  core.CheckInvariants();  // the lease covers exactly the computed tokens again
}

struct Scenario {
  const char* name;
  int32_t num_kv_blocks;
  bool prefix_caching;
  int32_t steps_in_flight;
  int32_t max_num_batched_tokens;
};

class SpeculativeScenarioTest : public ::testing::TestWithParam<Scenario> {};

// Mixed requests, some speculating, some not, some ending at eos mid-draft, some sharing a prefix,
// arriving over time; every request's tokens equal its reference, and speculating took fewer steps.
TEST_P(SpeculativeScenarioTest, OutputsEqualReference) {
  const Scenario sc = GetParam();
  SchedulerConfig cfg = MakeConfig(sc.num_kv_blocks, 4, 128);
  cfg.enable_prefix_caching = sc.prefix_caching;
  cfg.max_steps_in_flight = sc.steps_in_flight;
  auto run = [&](bool speculate) {
    Harness h(cfg);
    std::mt19937 rng(7);
    const std::vector<int32_t> prefix = {5, 6, 7, 8, 9, 10, 11, 12};
    for (uint64_t id = 1; id <= 40; ++id) {
      RequestOptions o{.prompt_len = 3 + static_cast<int32_t>(rng() % 20),
                       .max_tokens = 1 + static_cast<int32_t>(rng() % 30)};
      if (id % 5 == 0) o.eos_after = static_cast<int32_t>(rng() % 12);
      if (id % 3 == 0) o.prefix = prefix;
      const int32_t k = speculate && id % 4 != 0 ? 1 + static_cast<int32_t>(rng() % 6) : 0;
      h.Add(Speculating(id, k, o));
      for (int i = 0; i < 2; ++i) h.Step(MakeBudget(16, sc.max_num_batched_tokens));
      if (id == 25) h.LoseWorker();
    }
    h.RunToCompletion(MakeBudget(16, sc.max_num_batched_tokens));
    h.ExpectOutcomesMatchReference();
    return h.core.num_steps();  // engine steps (a wait for a speculative step's Commit is none)
  };
  const uint64_t plain = run(false);
  const uint64_t speculative = run(true);
  EXPECT_LT(speculative, plain) << sc.name;
}

INSTANTIATE_TEST_SUITE_P(
    Scenarios, SpeculativeScenarioTest,
    ::testing::Values(Scenario{"roomy", 512, false, 1, 8192}, Scenario{"prefix_cache", 512, true, 1, 8192},
                      Scenario{"async", 512, true, 2, 8192}, Scenario{"tight_kv", 28, true, 1, 8192},
                      Scenario{"tight_kv_async", 28, false, 2, 8192}, Scenario{"small_budget", 256, true, 1, 24}),
    [](const ::testing::TestParamInfo<Scenario>& info) { return std::string(info.param.name); });

}  // namespace
}  // namespace ferry::scheduler
