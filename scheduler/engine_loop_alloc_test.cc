// The engine loop's steady state allocates nothing (#26): with sequences decoding one token per
// step, a whole step on the loop thread (NextCap, Plan, ToStepRequest, the result's parse,
// Commit, Dispatch to the sinks, Publish) makes no heap allocation, whatever the number of
// sequences. Counted by replacing operator new (core/count_allocations.cc) around a window of
// steps of a running loop; the fake workers go through the real proto translation both ways.
// The shipped configuration too (#53): the goodput controller adjusting every few steps and the
// real session sink (the gRPC Session reactor a gateway talks to), counted on the loop thread.
#include <gtest/gtest.h>

#include <prometheus/registry.h>

#include <array>
#include <atomic>
#include <chrono>
#include <deque>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include <grpcpp/grpcpp.h>

#include "scheduler/core/count_allocations.h"
#include "scheduler/engine_loop.h"
#include "scheduler/scheduler_service.h"
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
    // The loop's thread: what it allocated up to this step.
    loop_thread_allocations.store(testing::NumAllocationsOnThisThread());
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
    std::this_thread::sleep_for(step_time);  // a step's time on the device
    if (!received_.ParseFromString(results_[num_received_++ % results_.size()])) {
      throw std::runtime_error("result does not parse");
    }
    FromStepResult(received_, output);
    num_steps.fetch_add(1);
  }
  std::atomic<int64_t> num_steps{0};
  std::atomic<int64_t> loop_thread_allocations{0};
  std::chrono::microseconds step_time{100};  // set before the loop starts

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
    const int64_t allocations = workers.loop_thread_allocations.load();
    wait_for(steps + 200);
    window.num_allocations = workers.loop_thread_allocations.load() - allocations;
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

// A gateway's session on loopback to the scheduler's gRPC service (the real session sink), reading
// every event on a thread of its own.
class GatewaySession {
 public:
  GatewaySession(EngineLoop& loop, int32_t max_model_len) : service_(loop, Info(max_model_len)) {
    grpc::ServerBuilder builder;
    int port = 0;
    builder.AddListeningPort("127.0.0.1:0", grpc::InsecureServerCredentials(), &port);
    builder.RegisterService(&service_);
    server_ = builder.BuildAndStart();
    stub_ = ferry::v1::Scheduler::NewStub(
        grpc::CreateChannel("127.0.0.1:" + std::to_string(port), grpc::InsecureChannelCredentials()));
    session_ = stub_->Session(&context_);
    reader_ = std::thread([this] {
      ferry::v1::SessionEvents in;
      while (session_->Read(&in)) {
        {
          // The session writes message k from the k-th swap of its two reused messages: storage k % 2.
          std::lock_guard lock(mu_);
          int64_t& most = max_events_[static_cast<size_t>(num_messages.load() % 2)];
          most = std::max<int64_t>(most, in.events_size());
        }
        num_messages.fetch_add(1);
        for (const ferry::v1::TokenEvent& e : in.events()) {
          num_tokens.fetch_add(e.token_ids_size());
          num_ended.fetch_add(e.finish() != ferry::v1::FINISH_KIND_NONE || e.status_code() != 0);
        }
      }
    });
  }
  ~GatewaySession() {
    context_.TryCancel();
    reader_.join();
    server_->Shutdown(std::chrono::system_clock::now() + 1s);
  }
  void Submit(const std::vector<RequestSpec>& specs, uint64_t first_tag) {
    ferry::v1::SessionRequests out;
    for (size_t i = 0; i < specs.size(); ++i) {
      ferry::v1::SessionSubmit* s = out.add_submits();
      s->set_stream_id(first_tag + i);
      s->mutable_request()->mutable_prompt_token_ids()->Add(specs[i].prompt.begin(), specs[i].prompt.end());
      s->mutable_request()->mutable_sampling()->set_max_tokens(specs[i].max_tokens);
    }
    ASSERT_TRUE(session_->Write(out));
  }
  std::atomic<int64_t> num_messages{0}, num_tokens{0}, num_ended{0};
  // The most events a message of each of the session's two reused messages has carried so far: what
  // their storage holds, since a cleared message keeps its events for the next deliveries.
  std::array<int64_t, 2> MaxEvents() {
    std::lock_guard lock(mu_);
    return max_events_;
  }

 private:
  std::mutex mu_;
  std::array<int64_t, 2> max_events_{0, 0};
  static ferry::v1::SchedulerInfo Info(int32_t max_model_len) {
    ferry::v1::SchedulerInfo info;
    info.set_max_model_len(max_model_len);
    info.set_vocab_size(1 << 20);
    return info;
  }
  SchedulerService service_;
  std::unique_ptr<grpc::Server> server_;
  std::unique_ptr<ferry::v1::Scheduler::Stub> stub_;
  grpc::ClientContext context_;
  std::unique_ptr<grpc::ClientReaderWriter<ferry::v1::SessionRequests, ferry::v1::SessionEvents>> session_;
  std::thread reader_;
};

struct GoodputWindow {
  int64_t num_allocations = 0;  // on the loop thread
  int64_t num_steps = 0;
  int64_t num_tokens = 0;
  int64_t num_ended = 0;
  int64_t num_messages = 0;  // session messages the gateway read (0 with the counting sink)
  // Events the session's two reused messages newly made room for (0 with the counting sink; see
  // TheSessionSinkAllocatesOnlyGrpcsMessageSlices).
  int64_t num_new_event_slots = 0;
  uint64_t num_plans = 0;
};

// `count` requests of 20 prompt tokens; the i-th generates max_tokens(i).
template <class MaxTokens>
std::vector<RequestSpec> Requests(int32_t count, MaxTokens max_tokens) {
  std::vector<RequestSpec> out(static_cast<size_t>(count));
  for (int32_t i = 0; i < count; ++i) {
    for (int32_t t = 0; t < 20; ++t) out[static_cast<size_t>(i)].prompt.push_back(i * 100 + t);
    out[static_cast<size_t>(i)].max_tokens = max_tokens(i);
  }
  return out;
}

// The shipped default, the goodput controller, in a steady state: 48 requests, all running from the
// start, end one after another (each a completion for the model: the controller learns on), and the
// controller plans every adjust interval. A step admits nobody, so whatever the loop thread allocates
// is the steps', the ends' and the plans'. The window starts once the controller's windows are full
// (the step model's ring has its size). The sink is a CountingSink or a gateway's session.
GoodputWindow SteadyGoodputWindow(bool session_sink) {
  SchedulerConfig config;
  config.max_num_seqs = 256;
  config.max_num_batched_tokens = 8192;
  config.max_model_len = 16384;
  config.block_size = 16;
  config.num_kv_blocks = 48 * 1024;
  config.max_steps_in_flight = 2;
  ControllerOptions controller;
  controller.mode = ControllerMode::kGoodput;
  controller.max_num_seqs = 64;
  controller.initial_num_seqs = 64;
  // A 100 ms TTFT target: the controller's times scale with it (a plan every 50 ms, a 2 s window of steps
  // and completions); the arrival rate over 10 s keeps the demand it plans for.
  controller.slo.ttft_target_s = 0.1;
  controller.slo.tpot_target_s = 0.05;
  controller.goodput.rate_window_s = 100;
  prometheus::Registry registry;
  WireWorkers workers;
  // 2 ms steps: the 2 s window holds at most 1,000 (the step model's ring, a power of two, is 1,024 once
  // it holds 513), so the ring stops growing in warm-up even if steps run slower then and faster later.
  workers.step_time = 2ms;
  auto counting = std::make_shared<CountingSink>();
  GoodputWindow w;
  EngineLoop loop(config, controller, workers, registry);
  std::optional<GatewaySession> session;
  if (session_sink) session.emplace(loop, config.max_model_len);
  const auto ended = [&] { return session ? session->num_ended.load() : counting->num_finished.load(); };
  const auto tokens = [&] { return session ? session->num_tokens.load() : counting->num_tokens.load(); };
  const auto wait_until = [](auto done) {
    for (int i = 0; i < 60000 && !done(); ++i) std::this_thread::sleep_for(1ms);
  };
  const auto requests = Requests(48, [](int32_t i) { return 300 + 150 * i; });  // ends 150 steps apart
  if (session) {
    session->Submit(requests, 1);
  } else {
    for (size_t i = 0; i < requests.size(); ++i) loop.Submit(requests[i], counting, i + 1);
  }
  // The window starts once the controller's 2 s window of steps has held more than 512 of them: its ring (a
  // power of two) then has the 1,024 slots that the most a 2 s window can hold at 2 ms a step needs, so a window
  // faster than the warm-up (a loaded machine, as CI's ctest -j2 is) cannot grow it. Timed by the step count
  // every 10 ms; at least 2.5 s, so that the first completions are in.
  const auto start = std::chrono::steady_clock::now();
  std::deque<std::pair<std::chrono::steady_clock::time_point, int64_t>> samples;
  wait_until([&] {
    const auto now = std::chrono::steady_clock::now();
    samples.emplace_back(now, workers.num_steps.load());
    while (samples.size() > 1 && now - samples[1].first >= 2s) samples.pop_front();
    const bool full = now - samples.front().first >= 2s && samples.back().second - samples.front().second > 520;
    return now - start > 2500ms && full;
  });
  const LoopState before = loop.State();
  const int64_t steps = workers.num_steps.load(), allocations = workers.loop_thread_allocations.load();
  const int64_t tokens_before = tokens(), ended_before = ended();
  const int64_t messages = session ? session->num_messages.load() : 0;
  const std::array<int64_t, 2> most_before = session ? session->MaxEvents() : std::array<int64_t, 2>{};
  wait_until([&] { return workers.num_steps.load() >= steps + 1000; });
  w.num_allocations = workers.loop_thread_allocations.load() - allocations;
  w.num_steps = workers.num_steps.load() - steps;
  w.num_tokens = tokens() - tokens_before;
  w.num_ended = ended() - ended_before;
  w.num_messages = session ? session->num_messages.load() - messages : 0;
  if (session) {
    // Events delivered in the window may still sit in the session's pending message: the next two messages
    // carry them, and with them any room made for them.
    const int64_t read = session->num_messages.load();
    wait_until([&] { return session->num_messages.load() >= read + 2; });
    const std::array<int64_t, 2> most_after = session->MaxEvents();
    for (size_t k = 0; k < 2; ++k) w.num_new_event_slots += std::max<int64_t>(0, most_after[k] - most_before[k]);
  }
  const LoopState after = loop.State();
  EXPECT_EQ(after.controller_mode, "goodput");
  EXPECT_GT(after.num_running, 0) << "the window should end with requests still running";
  w.num_plans = after.num_cap_plans - before.num_cap_plans;
  return w;
}

TEST(EngineLoopAllocTest, GoodputControllerStepsAllocateNothing) {
  const GoodputWindow w = SteadyGoodputWindow(/*session_sink=*/false);
  EXPECT_GE(w.num_plans, 3u) << "the window should span several of the controller's plans";
  EXPECT_GE(w.num_ended, 2) << "and completions";
  EXPECT_GE(w.num_tokens, w.num_steps);
  EXPECT_EQ(w.num_allocations, 0) << "in " << w.num_steps << " steps, " << w.num_plans << " plans and "
                                  << w.num_ended << " ends";
}

// The real session sink: each event goes into the session's reused message under its lock, and a write
// started on the loop thread costs gRPC one allocation, the serialised message's slice
// (grpc::ProtoBufferWriter): at most one per message the gateway receives, against one event per request per
// step in the sink (tens per step here). The reused messages allocate only to hold more events than they ever
// have: while a write is in flight the next message gathers the steps that end meanwhile, so a gateway that
// reads slower than before (a machine loaded mid-window, as under CI's ctest -j2: 1,042-1,156 allocations for
// about 1,000 messages, every extra one a TokenEvent or its token array added by SessionEvents::add_events)
// raises the high-water mark. Each event slot made costs at most three: the TokenEvent, its token array and
// at most one growth of the message's pointer array.

TEST(EngineLoopAllocTest, TheSessionSinkAllocatesOnlyGrpcsMessageSlices) {
  const GoodputWindow w = SteadyGoodputWindow(/*session_sink=*/true);
  EXPECT_GE(w.num_plans, 3u);
  EXPECT_GE(w.num_ended, 2);
  EXPECT_GE(w.num_tokens, w.num_steps) << "the session delivered the window's tokens";
  EXPECT_GT(w.num_messages, 0);
  EXPECT_LE(w.num_allocations, w.num_messages + 1 + 3 * w.num_new_event_slots)
      << "in " << w.num_steps << " steps, " << w.num_messages << " messages, " << w.num_new_event_slots
      << " new event slots and " << w.num_plans << " plans";
}

}  // namespace
}  // namespace ferry::scheduler
