// The invariant test: 10,000 random requests with shared prefixes,
// random cancellations, deadlines and queue deadlines, priorities and lanes, prefix caching and
// aging on, under changing budgets. Invariants are checked after every step;
// at the end every KV block is free or cached-unreferenced and every request
// ended exactly once with output matching its reference (or a prefix of it).
#include <gtest/gtest.h>

#include <cstdio>
#include <map>
#include <random>
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
using testing::Ms;

// Run with one step in flight and with two (async scheduling: each step
// planned before the previous one's samples are known).
class SchedulerStressTest : public ::testing::TestWithParam<int32_t> {};

TEST_P(SchedulerStressTest, TenThousandRandomRequestsEndOnceAndLeaveNoBlockHeld) {
  SchedulerConfig cfg = MakeConfig(/*num_kv_blocks=*/64, /*block_size=*/4, /*max_model_len=*/128);
  cfg.max_steps_in_flight = GetParam();
  cfg.enable_prefix_caching = true;
  cfg.aging_interval_ms = 50;
  cfg.lane_reservations = {LaneReservation{.lane = "interactive", .min_seqs_fraction = 0.25,
                                           .min_blocks_fraction = 0.25}};
  Harness h(cfg);
  std::mt19937 rng(4242);
  auto uniform = [&](int lo, int hi) { return lo + static_cast<int>(rng() % (hi - lo + 1)); };
  std::vector<std::vector<int32_t>> prefixes = {{}};
  for (int p = 0; p < 6; ++p) {
    std::vector<int32_t> prefix;
    for (int i = uniform(3, 40); i > 0; --i) prefix.push_back(uniform(10, 999));
    prefixes.push_back(prefix);
  }
  constexpr uint64_t kNumRequests = 10000;
  uint64_t next_id = 1;
  std::vector<uint64_t> ids;
  for (int i = 0; next_id <= kNumRequests || h.core.has_work() || h.num_in_flight() > 0; ++i) {
    SCOPED_TRACE("iteration " + std::to_string(i));
    ASSERT_LT(i, 1000000);
    h.now = Ms(i);
    for (int n = uniform(0, 2); n > 0 && next_id <= kNumRequests; --n, ++next_id) {
      const auto& prefix = prefixes[rng() % prefixes.size()];
      const int32_t max_own = 80 - static_cast<int32_t>(prefix.size());
      h.Add(MakeRequest(next_id, {.prompt_len = uniform(1, max_own), .max_tokens = uniform(1, 40),
                                  .eos_after = -1, .priority = uniform(0, 2), .arrival_ms = i,
                                  .stop_token_ids = {static_cast<int32_t>(uniform(10, 999))},
                                  .lane = uniform(0, 3) == 0 ? "interactive" : "",
                                  .deadline_ms = uniform(0, 4) == 0 ? i + uniform(1, 300) : -1,
                                  // Drawn from no random number: the other draws stay as they were.
                                  .queue_deadline_ms = next_id % 10 == 0 ? i + 100 : -1,
                                  .prefix = prefix}));
      ids.push_back(next_id);
    }
    if (uniform(0, 99) < 5 && !ids.empty()) h.Cancel(ids[rng() % ids.size()]);
    h.Step(MakeBudget(uniform(1, 16), uniform(1, 128)));
  }
  // No sequence left: every block is free or cached with ref 0 (the invariant
  // check compares ref counts with holders and the lists with the cache).
  h.core.CheckInvariants();
  EXPECT_EQ(h.core.num_free_blocks(), h.core.num_total_blocks());
  EXPECT_EQ(h.core.num_running() + h.core.num_waiting(), 0);
  EXPECT_EQ(h.worker.num_known(), 0u);
  EXPECT_EQ(h.outcomes.size(), kNumRequests);
  EXPECT_GT(h.core.num_preemptions(), 0u);
  EXPECT_GT(h.core.num_prefix_cache_hits(), 0u);
  std::map<FinishKind, int> ends;
  for (const auto& [id, o] : h.outcomes) ++ends[o.finish];
  for (auto kind : {FinishKind::kStopToken, FinishKind::kLength, FinishKind::kCancelled,
                    FinishKind::kDeadlineExceeded, FinishKind::kQueueTimeout, FinishKind::kTimeout}) {
    EXPECT_GT(ends[kind], 0) << FinishKindName(kind);
  }
  std::printf("steps=%llu preemptions=%llu cache queries=%llu hits=%llu cached_blocks=%d\n",
              static_cast<unsigned long long>(h.core.num_steps()),
              static_cast<unsigned long long>(h.core.num_preemptions()),
              static_cast<unsigned long long>(h.core.num_prefix_cache_queries()),
              static_cast<unsigned long long>(h.core.num_prefix_cache_hits()),
              h.core.num_cached_blocks());
  for (const auto& [kind, n] : ends) std::printf("  %s=%d\n", FinishKindName(kind), n);
  h.ExpectOutcomesMatchReference();  // also: every request ended exactly once
}

INSTANTIATE_TEST_SUITE_P(StepsInFlight, SchedulerStressTest, ::testing::Values(1, 2));

}  // namespace
}  // namespace ferry::scheduler
