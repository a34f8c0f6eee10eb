// Timeline tests of prefix caching: reuse by reference count, what the worker
// is told (num_cached_tokens, shared blocks first in new_block_ids), LRU
// eviction, chunked prefill after a cached prefix, preemption with identical
// resumed output, and the acceptance test (shared 1,000-token system prompt).
// The fake worker rejects a write into a shared block and samples from its
// simulated KV pool, so a wrongly shared block changes the output.
#include <gtest/gtest.h>

#include <cstdio>
#include <map>
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

std::string Iteration(int i) { return "iteration " + std::to_string(i); }

std::vector<int32_t> Prefix(int32_t first, int32_t n) {
  std::vector<int32_t> tokens;
  for (int32_t i = 0; i < n; ++i) tokens.push_back(first + i);
  return tokens;
}

SchedulerConfig CachingConfig(int32_t num_kv_blocks, int32_t block_size = 4,
                              int32_t max_model_len = 256) {
  SchedulerConfig cfg = MakeConfig(num_kv_blocks, block_size, max_model_len);
  cfg.enable_prefix_caching = true;
  return cfg;
}

const NewSequence* FindNew(const StepPlan& plan, uint64_t id) {
  for (const auto& n : plan.new_sequences) {
    if (n.seq_id == id) return &n;
  }
  return nullptr;
}

const ScheduledSequence* FindScheduled(const StepPlan& plan, uint64_t id) {
  for (const auto& s : plan.scheduled) {
    if (s.seq_id == id) return &s;
  }
  return nullptr;
}

TEST(PrefixCacheTest, SecondRequestReusesTheFirstsFullBlocks) {
  Harness h(CachingConfig(/*num_kv_blocks=*/64));
  const auto prefix = Prefix(2000, 16);  // four full blocks
  h.Add(MakeRequest(1, {.prompt_len = 6, .max_tokens = 3, .prefix = prefix}));
  h.Step();
  const auto table = h.core.block_ids(1);
  const std::vector<BlockId> first_blocks(table.begin(), table.begin() + 4);
  h.RunToCompletion();
  EXPECT_EQ(h.core.num_free_blocks(), 64) << "cached blocks count as allocatable";
  EXPECT_GE(h.core.num_cached_blocks(), 5);
  h.Add(MakeRequest(2, {.prompt_len = 5, .max_tokens = 3, .prefix = prefix}));
  StepPlan plan = h.Step();
  const NewSequence* sent = FindNew(plan, 2);
  const ScheduledSequence* entry = FindScheduled(plan, 2);
  ASSERT_NE(sent, nullptr);
  ASSERT_NE(entry, nullptr);
  EXPECT_EQ(sent->num_cached_tokens, 16);
  EXPECT_EQ(entry->num_tokens, 5) << "only the uncached suffix is computed";
  ASSERT_GE(entry->new_block_ids.size(), 4u);
  EXPECT_EQ(std::vector<BlockId>(entry->new_block_ids.begin(), entry->new_block_ids.begin() + 4),
            first_blocks) << "shared blocks come first in the table";
  // Queries: (21 - 1) / 4 = 5 blocks looked up for 1 (no hit), 5 for 2 (4 hits).
  EXPECT_EQ(h.core.num_prefix_cache_queries(), 5u + 5u);
  EXPECT_EQ(h.core.num_prefix_cache_hits(), 4u);
  h.RunToCompletion();
  h.ExpectOutcomesMatchReference();
}

TEST(PrefixCacheTest, RunningSequencesShareBlocksByRefCount) {
  Harness h(CachingConfig(/*num_kv_blocks=*/64));
  const auto prefix = Prefix(2000, 8);
  h.Add(MakeRequest(1, {.prompt_len = 4, .max_tokens = 20, .prefix = prefix}));
  h.Step();
  for (uint64_t id = 2; id <= 4; ++id) {
    h.Add(MakeRequest(id, {.prompt_len = 4, .max_tokens = 20, .prefix = prefix}));
  }
  h.Step();
  for (uint64_t id = 2; id <= 4; ++id) {
    EXPECT_EQ(h.core.block_ids(id)[0], h.core.block_ids(1)[0]);
    EXPECT_EQ(h.core.block_ids(id)[1], h.core.block_ids(1)[1]);
  }
  h.RunToCompletion();  // the harness checks invariants (ref count = holders) each step
  h.ExpectOutcomesMatchReference();
}

TEST(PrefixCacheTest, WholePromptCachedStillComputesTheLastBlock) {
  Harness h(CachingConfig(/*num_kv_blocks=*/64));
  const auto prompt = Prefix(2000, 16);
  h.Add(MakeRequest(1, {.prompt_len = 0, .max_tokens = 2, .prefix = prompt}));
  h.RunToCompletion();
  h.Add(MakeRequest(2, {.prompt_len = 0, .max_tokens = 2, .prefix = prompt}));
  StepPlan plan = h.Step();
  ASSERT_NE(FindNew(plan, 2), nullptr);
  EXPECT_EQ(FindNew(plan, 2)->num_cached_tokens, 12);
  EXPECT_EQ(FindScheduled(plan, 2)->num_tokens, 4) << "never writes into a shared block";
  h.RunToCompletion();
  h.ExpectOutcomesMatchReference();
}

TEST(PrefixCacheTest, EvictsTheLeastRecentlyUsedPrefixFirst) {
  Harness h(CachingConfig(/*num_kv_blocks=*/16));
  const auto prefix_a = Prefix(2000, 12), prefix_b = Prefix(3000, 12);
  h.Add(MakeRequest(1, {.prompt_len = 4, .max_tokens = 1, .prefix = prefix_a}));
  h.RunToCompletion();
  h.Add(MakeRequest(2, {.prompt_len = 4, .max_tokens = 1, .prefix = prefix_b}));
  h.RunToCompletion();
  EXPECT_EQ(h.core.num_cached_blocks(), 8);
  // 11 blocks: the 8 never-used ones, then 3 evicted: A's, released earlier.
  h.Add(MakeRequest(3, {.prompt_len = 44, .max_tokens = 1}));
  h.RunToCompletion();
  h.Add(MakeRequest(4, {.prompt_len = 4, .max_tokens = 1, .prefix = prefix_b}));
  EXPECT_EQ(FindNew(h.Step(), 4)->num_cached_tokens, 12) << "B's prefix survived";
  h.RunToCompletion();
  h.Add(MakeRequest(5, {.prompt_len = 4, .max_tokens = 1, .prefix = prefix_a}));
  EXPECT_EQ(FindNew(h.Step(), 5)->num_cached_tokens, 0) << "A's prefix was evicted";
  h.RunToCompletion();
  h.ExpectOutcomesMatchReference();
}

TEST(PrefixCacheTest, ChunkedPrefillStartsAfterTheCachedPrefix) {
  Harness h(CachingConfig(/*num_kv_blocks=*/128, /*block_size=*/4, /*max_model_len=*/256));
  const auto prefix = Prefix(2000, 40);
  h.Add(MakeRequest(1, {.prompt_len = 30, .max_tokens = 2, .prefix = prefix}));
  h.RunToCompletion();
  h.Add(MakeRequest(2, {.prompt_len = 30, .max_tokens = 2, .prefix = prefix}));
  const Budget budget = MakeBudget(/*max_num_seqs=*/8, /*max_num_batched_tokens=*/8);
  std::vector<int32_t> chunks;
  for (int i = 0; h.core.is_live(2) && h.outcomes[2].tokens.empty(); ++i) {
    SCOPED_TRACE(Iteration(i));
    ASSERT_LT(i, 100);
    StepPlan plan = h.Step(budget);
    if (const NewSequence* sent = FindNew(plan, 2)) EXPECT_EQ(sent->num_cached_tokens, 40);
    if (const ScheduledSequence* s = FindScheduled(plan, 2)) chunks.push_back(s->num_tokens);
  }
  EXPECT_EQ(chunks, (std::vector<int32_t>{8, 8, 8, 6}));
  h.RunToCompletion(budget);
  h.ExpectOutcomesMatchReference();
}

TEST(PrefixCacheTest, PreemptedSequencesResumeIdenticallyFromTheCache) {
  Harness h(CachingConfig(/*num_kv_blocks=*/24, /*block_size=*/4, /*max_model_len=*/64));
  const auto prefix = Prefix(2000, 8);
  for (uint64_t id = 1; id <= 6; ++id) {
    h.Add(MakeRequest(id, {.prompt_len = 4, .max_tokens = 30, .prefix = prefix}));
  }
  int num_resumed_from_cache = 0;
  for (int i = 0; h.core.has_work(); ++i) {
    SCOPED_TRACE(Iteration(i));
    ASSERT_LT(i, 2000);
    StepPlan plan = h.Step();
    for (const auto& n : plan.new_sequences) {
      if (h.times_preempted[n.seq_id] > 0 && n.num_cached_tokens > 0) ++num_resumed_from_cache;
    }
  }
  EXPECT_GT(h.core.num_preemptions(), 0u);
  EXPECT_GT(num_resumed_from_cache, 0);
  EXPECT_GT(h.core.num_prefix_cache_hits(), 0u);
  h.ExpectOutcomesMatchReference();  // recompute from cached blocks gives the same tokens
  EXPECT_EQ(h.core.num_free_blocks(), 24);
}

// Prefill tokens scheduled for requests 2..100, all sharing a 1,000-token system prompt.
int64_t SystemPromptPrefillTokens(bool enable_prefix_caching) {
  SchedulerConfig cfg = MakeConfig(/*num_kv_blocks=*/4000, /*block_size=*/16, /*max_model_len=*/2048);
  cfg.enable_prefix_caching = enable_prefix_caching;
  Harness h(cfg);
  const auto system_prompt = Prefix(2000, 1000);
  // max_tokens = 1: every scheduled token is a prefill token.
  h.Add(MakeRequest(1, {.prompt_len = 20, .max_tokens = 1, .prefix = system_prompt}));
  h.RunToCompletion();
  for (uint64_t id = 2; id <= 100; ++id) {
    h.Add(MakeRequest(id, {.prompt_len = 20, .max_tokens = 1, .prefix = system_prompt}));
  }
  const int64_t before = h.num_scheduled_tokens;
  h.RunToCompletion();
  h.ExpectOutcomesMatchReference();
  return h.num_scheduled_tokens - before;
}

TEST(PrefixCacheTest, SharedSystemPromptCutsPrefillTokensByNinetyPercent) {
  const int64_t off = SystemPromptPrefillTokens(false);
  const int64_t on = SystemPromptPrefillTokens(true);
  const double reduction = 1.0 - static_cast<double>(on) / static_cast<double>(off);
  std::printf("prefill tokens for requests 2..100: caching off %lld, on %lld (-%.1f%%)\n",
              static_cast<long long>(off), static_cast<long long>(on), 100.0 * reduction);
  EXPECT_EQ(off, 99 * 1020);
  EXPECT_GE(reduction, 0.90);
}

}  // namespace
}  // namespace ferry::scheduler

namespace ferry::scheduler {
namespace {

// Issue #57: the same prompt under two adapters and the base: none of them finds the others'
// blocks (each adapter's chain starts from its own root), and each finds its own again.
TEST(PrefixCacheLoraTest, APrefixComputedUnderOneAdapterIsNeverReusedUnderAnother) {
  Harness h(CachingConfig(/*num_kv_blocks=*/64));
  const auto prefix = Prefix(3000, 16);  // four full blocks
  auto under = [&](uint64_t id, const std::string& adapter) {
    RequestSpec r = MakeRequest(id, {.prompt_len = 5, .max_tokens = 2, .prefix = prefix});
    r.prompt.resize(16 + 1);  // the same prompt for all: the prefix and one token
    r.lora_name = adapter;
    return r;
  };
  h.Add(under(1, "tenant-a"));
  h.RunToCompletion();
  for (const auto& [id, adapter] : std::vector<std::pair<uint64_t, std::string>>{{2, "tenant-b"}, {3, ""}}) {
    h.Add(under(id, adapter));
    const StepPlan plan = h.Step();
    const NewSequence* sent = FindNew(plan, id);
    ASSERT_NE(sent, nullptr);
    EXPECT_EQ(sent->num_cached_tokens, 0) << "the blocks of another adapter were reused under '" << adapter << "'";
    EXPECT_EQ(sent->lora_name, adapter) << "the worker is told the sequence's adapter";
    h.RunToCompletion();
  }
  h.Add(under(4, "tenant-a"));
  const StepPlan plan = h.Step();
  ASSERT_NE(FindNew(plan, 4), nullptr);
  EXPECT_EQ(FindNew(plan, 4)->num_cached_tokens, 16) << "an adapter finds its own prefix again";
  EXPECT_NE(RootBlockHash("tenant-a"), RootBlockHash("tenant-b"));
  EXPECT_EQ(RootBlockHash(""), kRootBlockHash);
  h.RunToCompletion();
}

// At most max_loras distinct adapters run at once: a request of a third adapter waits (those of
// a running adapter behind it go on) until one adapter's sequences have all left.
TEST(PrefixCacheLoraTest, NoMoreThanMaxLorasDistinctAdaptersRunTogether) {
  SchedulerConfig cfg = CachingConfig(/*num_kv_blocks=*/256);
  cfg.max_loras = 2;
  Harness h(cfg);
  const std::vector<std::string> adapters = {"a", "b", "c", "a", "", "b", "c"};
  for (size_t i = 0; i < adapters.size(); ++i) {
    RequestSpec r = MakeRequest(i + 1, {.prompt_len = 6, .max_tokens = 4 + static_cast<int32_t>(i)});
    r.lora_name = adapters[i];
    h.Add(r);
  }
  bool c_ran = false, b_waited_for_c = false;
  for (int step = 0; step < 200 && h.core.has_work(); ++step) {
    const StepPlan plan = h.Step();
    std::vector<std::string> running;  // the distinct adapters the worker runs in this step
    for (const ScheduledSequence& s : plan.scheduled) {
      const std::string& a = adapters[s.seq_id - 1];
      if (!a.empty() && std::find(running.begin(), running.end(), a) == running.end()) running.push_back(a);
    }
    ASSERT_LE(running.size(), 2u) << "step " << step;
    const bool c = std::find(running.begin(), running.end(), "c") != running.end();
    b_waited_for_c = b_waited_for_c || (!c_ran && FindScheduled(plan, 6) != nullptr);
    c_ran = c_ran || c;
  }
  EXPECT_TRUE(c_ran) << "the third adapter never ran once another left";
  EXPECT_TRUE(b_waited_for_c) << "request 6 (adapter b, running) should pass the waiting c ahead of it";
  EXPECT_TRUE(c_ran) << "the third adapter never ran once another left";
  h.ExpectOutcomesMatchReference();
}

}  // namespace
}  // namespace ferry::scheduler
