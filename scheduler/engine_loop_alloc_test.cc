// The engine loop's steady state allocates nothing (#26): with sequences decoding one token per
// step, a whole step on the loop thread (NextCap, Plan, ToStepRequest, the result's parse,
// Commit, Dispatch to the sinks, Publish) makes no heap allocation, whatever the number of
// sequences. Counted by replacing operator new (core/count_allocations.cc) around a window of
// steps of a running loop; the fake workers go through the real proto translation both ways.
#include <gtest/gtest.h>

#include <prometheus/registry.h>

#include <array>
#include <atomic>
#include <chrono>
#include <memory>
#include <string>
#include <thread>

#include "scheduler/core/count_allocations.h"
#include "scheduler/engine_loop.h"
#include "scheduler/worker_client.h"

namespace ferry::scheduler {
namespace {

using namespace std::chrono_literals;

// Samples token 7 for every scheduled sequence (each step of these reaches the end of its
// tokens), through the wire: the request and the result are serialized and parsed as gRPC would,
// into messages and strings reused from step to step.
class WireWorkers : public WorkerGroup {
 public:
  void Send(uint64_t step_id, const StepPlan& plan) override {
    ToStepRequest(step_id, plan, request_);
    request_.SerializeToString(&request_wire_);
    result_.Clear();
    for (const auto& s : request_.scheduled()) {
      ferry::v1::SampledToken* token = result_.add_sampled();
      token->set_seq_id(s.seq_id());
      token->set_token_id(7);
    }
    result_.SerializeToString(&results_[num_sent_++ % results_.size()]);
  }
  void Receive(StepOutput& output) override {
    std::this_thread::sleep_for(100us);  // a step's time on the device
    if (!received_.ParseFromString(results_[num_received_++ % results_.size()])) {
      throw std::runtime_error("result does not parse");
    }
    FromStepResult(received_, output);
    num_steps.fetch_add(1);
  }
  std::atomic<int64_t> num_steps{0};

 private:
  ferry::v1::StepRequest request_;
  std::string request_wire_;
  ferry::v1::StepResult result_, received_;
  std::array<std::string, 4> results_;  // of the steps in flight, by step
  size_t num_sent_ = 0, num_received_ = 0;
};

class CountingSink : public EventSink {
 public:
  void Deliver(uint64_t, const SeqEvent& event) override {
    num_tokens.fetch_add(static_cast<int64_t>(event.new_tokens.size()));
    if (event.finish != FinishKind::kNone) num_finished.fetch_add(1);
  }
  void Flush() override {}
  std::atomic<int64_t> num_tokens{0};
  std::atomic<int64_t> num_finished{0};
};

struct Window {
  int64_t num_allocations = 0;
  int64_t num_steps = 0;
  int64_t num_tokens = 0;
};

Window SteadyWindow(int32_t num_seqs, bool prefix_caching, int32_t steps_in_flight) {
  SchedulerConfig config;
  config.max_num_seqs = 256;
  config.max_num_batched_tokens = 8192;
  config.max_model_len = 8192;
  config.block_size = 16;
  config.num_kv_blocks = num_seqs * 512;
  config.enable_prefix_caching = prefix_caching;
  config.max_steps_in_flight = steps_in_flight;
  // The controller's window of recent steps grows until it spans window_s, then keeps its
  // storage. 1 ms holds at most 10 steps of >= 100 us: its first 16 slots, from the first steps.
  ControllerOptions controller;
  controller.max_num_seqs = config.max_num_seqs;
  controller.slo.window_s = 0.001;
  prometheus::Registry registry;
  WireWorkers workers;
  auto sink = std::make_shared<CountingSink>();
  Window window;
  {
    EngineLoop loop(config, controller, workers, registry);
    for (int32_t i = 0; i < num_seqs; ++i) {
      RequestSpec spec;
      for (int32_t t = 0; t < 20; ++t) spec.prompt.push_back(i * 100 + t);
      spec.max_tokens = 8000;
      spec.sampling.encoded = "";  // the default ferry.v1.SamplingParams
      loop.Submit(std::move(spec), sink, static_cast<uint64_t>(i));
    }
    const auto wait_for = [&](int64_t steps) {
      while (workers.num_steps.load() < steps) std::this_thread::sleep_for(1ms);
    };
    wait_for(300);  // admitted, prefilled, every reused buffer grown
    const int64_t steps = workers.num_steps.load(), tokens = sink->num_tokens.load();
    const int64_t allocations = testing::NumAllocations();
    wait_for(steps + 200);
    window.num_allocations = testing::NumAllocations() - allocations;
    window.num_steps = workers.num_steps.load() - steps;
    window.num_tokens = sink->num_tokens.load() - tokens;
  }
  EXPECT_EQ(sink->num_finished.load(), num_seqs) << "each ends aborted when the loop stops";
  return window;
}

TEST(EngineLoopAllocTest, SteadyDecodeStepsAllocateNothing) {
  for (bool prefix : {false, true}) {
    for (int32_t depth : {1, 2}) {
      for (int32_t num_seqs : {8, 64}) {
        SCOPED_TRACE("seqs=" + std::to_string(num_seqs) + " prefix_caching=" + std::to_string(prefix) +
                     " steps_in_flight=" + std::to_string(depth));
        const Window w = SteadyWindow(num_seqs, prefix, depth);
        ASSERT_GE(w.num_steps, 200);
        // Every step of the window delivered a token to every sequence (give or take the edges).
        EXPECT_GE(w.num_tokens, (w.num_steps - 2) * num_seqs);
        EXPECT_EQ(w.num_allocations, 0) << "in " << w.num_steps << " steps";
      }
    }
  }
}

}  // namespace
}  // namespace ferry::scheduler
