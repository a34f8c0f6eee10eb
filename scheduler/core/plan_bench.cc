// One Plan call with 256 running (decoding) and 1,000 waiting sequences.
// Target: < 50 us. Commit runs between iterations with the timer paused.
// BM_Step256Running1000Waiting times the whole step of the core (Plan and Commit).
//   build/bin/ferry-plan-bench
#include <benchmark/benchmark.h>

#include <cstdint>
#include <vector>

#include "scheduler/core/scheduler_core.h"

namespace ferry::scheduler {
namespace {

constexpr int32_t kRunning = 256;
constexpr int32_t kWaiting = 1000;
constexpr int32_t kMaxTokens = 3000;

SchedulerConfig BenchConfig(bool enable_prefix_caching) {
  SchedulerConfig cfg;
  cfg.max_num_seqs = kRunning;
  cfg.max_num_batched_tokens = 16384;
  cfg.max_model_len = 4096;
  cfg.block_size = 16;
  cfg.num_kv_blocks = kRunning * (4096 / 16) + 1024;
  cfg.enable_prefix_caching = enable_prefix_caching;
  cfg.aging_interval_ms = 1000;
  return cfg;
}

RequestSpec BenchRequest(uint64_t id) {
  RequestSpec r;
  r.seq_id = id;
  for (int32_t i = 0; i < 64; ++i) r.prompt.push_back(static_cast<int32_t>(id * 131 + i) % 30000);
  r.max_tokens = kMaxTokens;
  r.eos_token_ids = {-1};
  r.priority = static_cast<int32_t>(id % 4);
  r.arrival = TimePoint(std::chrono::milliseconds(id));
  return r;
}

std::vector<SampledToken> SamplesFor(const StepPlan& plan) {
  std::vector<SampledToken> sampled;
  sampled.reserve(plan.scheduled.size());
  for (const auto& s : plan.scheduled) {
    sampled.push_back(SampledToken{s.seq_id, 7, std::nullopt});
  }
  return sampled;
}

void BM_Plan256Running1000Waiting(benchmark::State& state) {
  SchedulerCore core(BenchConfig(state.range(0) != 0));
  for (uint64_t id = 1; id <= kRunning; ++id) core.Add(BenchRequest(id));
  const Budget budget{.max_num_seqs = kRunning, .max_num_batched_tokens = 16384};
  const TimePoint now(std::chrono::seconds(100));
  StepPlan warm = core.Plan(budget, now);  // all 256 prefill, then decode
  core.Commit(warm, SamplesFor(warm));
  for (uint64_t id = kRunning + 1; id <= kRunning + kWaiting; ++id) core.Add(BenchRequest(id));
  for (auto _ : state) {
    StepPlan plan = core.Plan(budget, now);
    state.PauseTiming();
    if (static_cast<int32_t>(plan.scheduled.size()) != kRunning || core.num_waiting() != kWaiting) {
      state.SkipWithError("not 256 decodes with 1000 waiting");
      break;
    }
    core.Commit(plan, SamplesFor(plan));
    state.ResumeTiming();
  }
  state.counters["running"] = core.num_running();
  state.counters["waiting"] = core.num_waiting();
}
// Each iteration adds one token per sequence: stay under max_tokens.
BENCHMARK(BM_Plan256Running1000Waiting)->Arg(0)->Arg(1)->ArgName("prefix_caching")
    ->Iterations(2000)->Unit(benchmark::kMicrosecond);

// Plan and Commit of one decode step, as the engine loop runs them (a sample for each scheduled
// sequence, in a reused vector as the worker client hands them over).
void BM_Step256Running1000Waiting(benchmark::State& state) {
  SchedulerCore core(BenchConfig(state.range(0) != 0));
  for (uint64_t id = 1; id <= kRunning; ++id) core.Add(BenchRequest(id));
  const Budget budget{.max_num_seqs = kRunning, .max_num_batched_tokens = 16384};
  const TimePoint now(std::chrono::seconds(100));
  StepPlan warm = core.Plan(budget, now);
  core.Commit(warm, SamplesFor(warm));
  for (uint64_t id = kRunning + 1; id <= kRunning + kWaiting; ++id) core.Add(BenchRequest(id));
  // Reused from step to step, as the engine loop does: a steady step allocates nothing.
  StepPlan plan;
  std::vector<SampledToken> sampled;
  std::vector<SeqEvent> events;
  for (auto _ : state) {
    core.Plan(budget, now, plan);
    sampled.clear();
    for (const auto& s : plan.scheduled) sampled.push_back(SampledToken{s.seq_id, 7, std::nullopt});
    core.Commit(plan, sampled, {}, events);
  }
  if (events.size() != kRunning || core.num_waiting() != kWaiting) state.SkipWithError("not 256 decodes with 1000 waiting");
}
BENCHMARK(BM_Step256Running1000Waiting)->Arg(0)->Arg(1)->ArgName("prefix_caching")
    ->Iterations(2000)->Unit(benchmark::kMicrosecond);

}  // namespace
}  // namespace ferry::scheduler

BENCHMARK_MAIN();
