// The core's steady state allocates nothing (#26): with the plans and the events vector of
// earlier steps passed back in, Plan + Commit of sequences decoding one token per step makes no
// heap allocation, whatever the number of sequences, with or without prefix caching, steps in
// flight, or sequences waiting for a seat. Counted by replacing operator new (count_allocations.cc).
#include <gtest/gtest.h>

#include <array>
#include <cstdint>
#include <string>
#include <vector>

#include "scheduler/core/count_allocations.h"
#include "scheduler/core/scheduler_core.h"

namespace ferry::scheduler {
namespace {

struct LoopShape {
  int32_t num_running = 8;
  int32_t num_waiting = 0;  // beyond the seats: queued every step, never admitted
  bool enable_prefix_caching = false;
  int32_t max_steps_in_flight = 1;
};

// Drives a core like the engine loop: plans reused round-robin, one events vector, samples for
// every scheduled sequence (every step of these reaches the end of its tokens).
class SteadyLoop {
 public:
  explicit SteadyLoop(const LoopShape& setup) : setup_(setup), core_(Config(setup)) {
    for (int32_t i = 0; i < setup.num_running + setup.num_waiting; ++i) core_.Add(Request(i));
    sampled_.reserve(static_cast<size_t>(setup.num_running));
  }

  // Runs `num_steps` steps; returns the heap allocations they made.
  int64_t Run(int32_t num_steps) {
    const int64_t before = testing::NumAllocations();
    for (int32_t i = 0; i < num_steps; ++i) Step();
    return testing::NumAllocations() - before;
  }

  const SchedulerCore& core() const { return core_; }
  size_t num_events() const { return events_.size(); }

 private:
  static SchedulerConfig Config(const LoopShape& setup) {
    SchedulerConfig cfg;
    cfg.max_num_seqs = setup.num_running;
    cfg.max_num_batched_tokens = 8192;
    cfg.max_model_len = 1024;
    cfg.block_size = 16;
    cfg.num_kv_blocks = (setup.num_running + setup.num_waiting) * 64;
    cfg.enable_prefix_caching = setup.enable_prefix_caching;
    cfg.max_steps_in_flight = setup.max_steps_in_flight;
    return cfg;
  }

  static RequestSpec Request(int32_t i) {
    RequestSpec r;
    r.seq_id = static_cast<uint64_t>(i) + 1;
    for (int32_t t = 0; t < 20; ++t) r.prompt.push_back(i * 100 + t);  // no shared prefix
    r.max_tokens = 900;
    r.arrival = TimePoint(std::chrono::milliseconds(i));
    return r;
  }

  void Step() {
    const auto depth = static_cast<size_t>(setup_.max_steps_in_flight);
    if (num_in_flight_ == depth) CommitOldest();
    StepPlan& plan = plans_[next_ % depth];
    core_.Plan(budget_, now_, plan);
    ASSERT_FALSE(plan.empty());
    ++next_;
    ++num_in_flight_;
    if (depth == 1) CommitOldest();
  }

  void CommitOldest() {
    const auto depth = static_cast<size_t>(setup_.max_steps_in_flight);
    const StepPlan& plan = plans_[(next_ - num_in_flight_) % depth];
    sampled_.clear();
    for (const ScheduledSequence& s : plan.scheduled) sampled_.push_back(SampledToken{s.seq_id, 7, std::nullopt});
    core_.Commit(plan, sampled_, no_prompt_logprobs_, events_);
    --num_in_flight_;
  }

  LoopShape setup_;
  SchedulerCore core_;
  Budget budget_{.max_num_seqs = setup_.num_running, .max_num_batched_tokens = 8192};
  TimePoint now_{std::chrono::seconds(1)};
  std::array<StepPlan, 4> plans_;
  size_t next_ = 0;
  size_t num_in_flight_ = 0;
  std::vector<SampledToken> sampled_;
  const std::vector<PromptLogprobs> no_prompt_logprobs_;
  std::vector<SeqEvent> events_;
};

std::string Name(const LoopShape& s) {
  return "running=" + std::to_string(s.num_running) + " waiting=" + std::to_string(s.num_waiting) +
         " prefix_caching=" + std::to_string(s.enable_prefix_caching) +
         " steps_in_flight=" + std::to_string(s.max_steps_in_flight);
}

// Warm-up: the prefill step, then enough decode steps that every reused buffer reached its size.
constexpr int32_t kWarmupSteps = 40;
// Three block boundaries per sequence (block_size 16): new blocks, and with prefix caching,
// published ones.
constexpr int32_t kMeasuredSteps = 48;

TEST(StepAllocTest, SteadyDecodeStepsAllocateNothing) {
  for (bool prefix : {false, true}) {
    for (int32_t depth : {1, 2}) {
      for (int32_t waiting : {0, 16}) {
        for (int32_t running : {8, 64}) {
          const LoopShape setup{.num_running = running, .num_waiting = waiting, .enable_prefix_caching = prefix,
                            .max_steps_in_flight = depth};
          SCOPED_TRACE(Name(setup));
          SteadyLoop loop(setup);
          loop.Run(kWarmupSteps);
          ASSERT_EQ(loop.core().num_running(), running);
          ASSERT_EQ(loop.core().num_waiting(), waiting);
          const int64_t allocations = loop.Run(kMeasuredSteps);
          EXPECT_EQ(loop.core().num_running(), running);  // still the steady state: none ended
          EXPECT_EQ(loop.num_events(), static_cast<size_t>(running));
          EXPECT_EQ(allocations, 0) << "in " << kMeasuredSteps << " steps";
        }
      }
    }
  }
}

// The counter sees what the core's containers allocate (else the test above proves nothing).
TEST(StepAllocTest, CounterSeesAllocations) {
  const int64_t before = testing::NumAllocations();
  std::vector<int32_t> v(100);
  EXPECT_GT(testing::NumAllocations(), before);
  SteadyLoop loop(LoopShape{});
  EXPECT_GT(testing::NumAllocations(), before + 1);
}

}  // namespace
}  // namespace ferry::scheduler
