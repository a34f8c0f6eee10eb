// The engine loop with an in-process fake worker: threading, cancellation and
// one terminal event per request.
#include "scheduler/engine_loop.h"
#include "scheduler/sim/simulator.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <atomic>
#include <condition_variable>
#include <deque>
#include <future>
#include <map>
#include <mutex>
#include <optional>
#include <random>
#include <set>
#include <stdexcept>
#include <thread>

namespace ferry::scheduler {
namespace {

// Mirrors the worker's per-sequence bookkeeping; the token sampled depends only
// on the sequence's own tokens, as greedy decoding does.
class FakeWorkers : public WorkerGroup {
 public:
  void Send(uint64_t, const StepPlan& plan) override {
    sent_.push_back(plan);
    max_outstanding = std::max(max_outstanding, sent_.size());
  }
  // Runs the oldest step sent (a worker runs them in order).
  void Receive(StepOutput& output) override {
    if (gate.valid()) gate.wait();
    const StepPlan plan = std::move(sent_.front());
    sent_.pop_front();
    // As the real worker: a failed step changes nothing and the next one runs.
    if (plan.step_id == fail_step) throw std::runtime_error("worker failed step: injected");
    // A lost worker takes every sequence and every step sent with it.
    if (plan.step_id == lose_step) {
      seqs_.clear();
      sent_.clear();
      std::lock_guard lock(lora_mu);
      adapters.clear();  // its replacement holds only what it reads at start
      throw WorkerLostError(WorkerLostError::Reason::kDisconnected, "injected: the worker died");
    }
    for (uint64_t id : plan.finished_ids) seqs_.erase(id), refused_forgotten += static_cast<int>(refused_.erase(id));
    for (uint64_t id : plan.preempted_ids) seqs_.erase(id);
    // As the real worker screens: a new sequence whose prompt starts with `refuse_first_token` is refused
    // alone, and skipped until the scheduler's finished_ids names it.
    std::vector<SequenceError> refused;
    for (const auto& n : plan.new_sequences) {
      if (refuse_first_token != 0 && n.token_ids.front() == refuse_first_token) {
        refused.push_back({n.seq_id, "sequence " + std::to_string(n.seq_id) + ": injected refusal"});
        refused_.insert(n.seq_id);
        continue;
      }
      // As the real worker: a sequence holds its adapter's weights (here: their path) from its start.
      std::string weights;
      if (!n.lora_name.empty()) {
        std::lock_guard lock(lora_mu);
        if (!adapters.count(n.lora_name)) {
          refused.push_back({n.seq_id, "lora_name \"" + n.lora_name + "\" is not loaded"});
          refused_.insert(n.seq_id);
          continue;
        }
        weights = adapters.at(n.lora_name);
      }
      seqs_[n.seq_id] = {n.token_ids, 0, weights};
    }
    std::vector<SampledToken> out;
    for (const auto& s : plan.scheduled) {
      if (refused_.count(s.seq_id)) continue;
      auto& seq = seqs_.at(s.seq_id);
      seq.computed += s.num_tokens;
      if (seq.computed == static_cast<int>(seq.tokens.size())) {
        int64_t h = static_cast<int64_t>(std::hash<std::string>{}(seq.weights) % 1000003);
        for (int32_t t : seq.tokens) h = (h * 31 + t) % 1000003;
        const int32_t token = 10 + static_cast<int32_t>(h % 50);
        seq.tokens.push_back(token);
        out.push_back({s.seq_id, token});
      }
    }
    std::this_thread::sleep_for(std::chrono::microseconds(200));
    output = StepOutput{std::move(out), {}, std::move(refused)};
  }
  Reconnection Reconnect(std::chrono::milliseconds) override {
    ++reconnect_attempts;
    if (!back.load()) return Reconnection{.detail = "injected: not back"};
    return Reconnection{.back = true, .restarted_ranks = {0}, .detail = "injected: back"};
  }
  // Set: the worker died while idle (the next CheckIdle finds it gone).
  void CheckIdle() override {
    ++idle_checks;
    if (!gone_while_idle.exchange(false)) return;
    seqs_.clear();
    throw WorkerLostError(WorkerLostError::Reason::kDisconnected, "injected: died while idle");
  }
  void LoadLora(const std::string& key, const std::string& path) override {
    if (path.find("missing") != std::string::npos) throw std::invalid_argument("lora_path " + path + " is missing");
    std::lock_guard lock(lora_mu);
    adapters[key] = path;
    loads.push_back(key);
  }
  void UnloadLora(const std::string& key) override {
    std::lock_guard lock(lora_mu);
    adapters.erase(key);
  }
  bool Holds(const std::string& key) {
    std::lock_guard lock(lora_mu);
    return adapters.count(key) != 0;
  }
  size_t live() const { return seqs_.size(); }
  std::mutex lora_mu;
  std::map<std::string, std::string> adapters;  // key -> path (the fake's "weights")
  std::vector<std::string> loads;               // every LoadLora's key, in order
  std::atomic<bool> gone_while_idle{false};
  std::atomic<int> idle_checks{0};
  uint64_t lose_step = 0;            // this step's Receive loses the worker (0: none)
  std::atomic<bool> back{true};      // whether Reconnect finds it back
  std::atomic<int> reconnect_attempts{0};
  // Most steps sent and not yet received at once (written by the loop thread;
  // read after the loop is gone).
  size_t max_outstanding = 0;
  uint64_t fail_step = 0;  // this step's Receive throws (0: none)
  int32_t refuse_first_token = 0;  // refuse new sequences whose prompt starts with it (0: none)
  std::atomic<int> refused_forgotten{0};  // refused sequences a plan's finished_ids named since
  // When set, no step completes before it is ready: lets a test act before the
  // loop has made any progress, whatever the machine's timing.
  std::shared_future<void> gate;

 private:
  struct Seq {
    std::vector<int32_t> tokens;
    int computed = 0;
    std::string weights;  // its adapter's path; empty: the base model
  };
  std::map<uint64_t, Seq> seqs_;
  std::set<uint64_t> refused_;
  std::deque<StepPlan> sent_;
};

RequestSpec Request(int prompt_len, int max_tokens) {
  RequestSpec r;
  for (int i = 0; i < prompt_len; ++i) r.prompt.push_back(100 + i % 7);
  r.max_tokens = max_tokens;
  r.arrival = Clock::now();
  return r;
}

SchedulerConfig Config(int32_t max_steps_in_flight = 1) {
  SchedulerConfig c;
  c.max_steps_in_flight = max_steps_in_flight;
  c.max_num_seqs = 8;
  c.max_num_batched_tokens = 64;
  c.max_model_len = 256;
  c.block_size = 4;
  c.num_kv_blocks = 96;
  return c;
}

// One request's events as the loop hands them over: a delivery is seen only once the loop has
// flushed it, as a session writes only on a flush.
class QueueSink final : public EventSink {
 public:
  void Deliver(uint64_t, const SeqEvent& event) override {
    std::lock_guard lock(mu_);
    staged_.push_back(event);
  }
  void Flush() override {
    std::lock_guard lock(mu_);
    for (SeqEvent& event : staged_) flushed_.push_back(std::move(event));
    staged_.clear();
    cv_.notify_all();
  }
  // The next flushed event; nullopt if none comes within `timeout`.
  std::optional<SeqEvent> Next(std::chrono::milliseconds timeout) {
    std::unique_lock lock(mu_);
    if (!cv_.wait_for(lock, timeout, [&] { return !flushed_.empty(); })) return std::nullopt;
    SeqEvent event = std::move(flushed_.front());
    flushed_.pop_front();
    return event;
  }

 private:
  std::mutex mu_;
  std::condition_variable cv_;
  std::vector<SeqEvent> staged_;
  std::deque<SeqEvent> flushed_;
};

struct Sub {
  uint64_t id;
  std::shared_ptr<QueueSink> sink;
};

Sub Submit(EngineLoop& loop, RequestSpec spec) {
  auto sink = std::make_shared<QueueSink>();
  const uint64_t id = loop.Submit(std::move(spec), sink, 7);
  return {id, sink};
}

std::optional<SeqEvent> Next(QueueSink& ch, std::chrono::milliseconds timeout) { return ch.Next(timeout); }

// Pops until the terminal event; returns (tokens, finish).
std::pair<std::vector<int32_t>, FinishKind> Drain(QueueSink& ch) {
  std::vector<int32_t> tokens;
  while (true) {
    auto ev = Next(ch, std::chrono::milliseconds(5000));
    if (!ev) return {tokens, FinishKind::kNone};
    tokens.insert(tokens.end(), ev->new_tokens.begin(), ev->new_tokens.end());
    if (ev->finish != FinishKind::kNone) return {tokens, ev->finish};
  }
}

// Each with one step in flight and with two (async scheduling).
class EngineLoopTest : public ::testing::TestWithParam<int32_t> {};

TEST_P(EngineLoopTest, ConcurrentEqualsAloneAndAllEndOnce) {
  prometheus::Registry registry;
  FakeWorkers workers;
  auto loop = std::make_unique<EngineLoop>(Config(GetParam()), workers, registry);
  std::vector<std::vector<int32_t>> alone;
  for (int i = 0; i < 12; ++i) {
    auto [id, ch] = Submit(*loop, Request(3 + 9 * i, 10));
    auto [tokens, finish] = Drain(*ch);
    ASSERT_EQ(finish, FinishKind::kLength);
    alone.push_back(tokens);
  }
  std::vector<std::shared_ptr<QueueSink>> channels;
  for (int i = 0; i < 12; ++i) channels.push_back(Submit(*loop, Request(3 + 9 * i, 10)).sink);
  for (int i = 0; i < 12; ++i) {
    auto [tokens, finish] = Drain(*channels[i]);
    EXPECT_EQ(finish, FinishKind::kLength);
    EXPECT_EQ(tokens, alone[i]) << "request " << i;
  }
  EXPECT_EQ(loop->num_live(), 0);
  loop.reset();  // joins the loop thread before reading what it wrote
  // With two in flight the next step was sent before the last one's samples came.
  EXPECT_EQ(workers.max_outstanding, static_cast<size_t>(GetParam()));
}

TEST_P(EngineLoopTest, CancelStormLeavesNothingLive) {
  prometheus::Registry registry;
  FakeWorkers workers;
  EngineLoop loop(Config(GetParam()), workers, registry);
  std::mt19937 rng(5);
  std::promise<void> open;
  workers.gate = open.get_future().share();
  std::vector<Sub> subs;
  for (int i = 0; i < 200; ++i) subs.push_back(Submit(loop, Request(1 + rng() % 40, 2 + rng() % 30)));
  // The first cancel lands before any step completes (at least one request
  // is cancelled, however a loaded machine stretches the sleeps below); the
  // rest race the loop.
  loop.Cancel(subs[0].id);
  open.set_value();
  for (int i = 2; i < 200; i += 2) {
    std::this_thread::sleep_for(std::chrono::microseconds(rng() % 500));
    loop.Cancel(subs[i].id);
  }
  int cancelled = 0;
  for (auto& [id, ch] : subs) {
    auto [tokens, finish] = Drain(*ch);
    ASSERT_NE(finish, FinishKind::kNone) << "seq " << id << " never ended";
    cancelled += finish == FinishKind::kCancelled;
    // Exactly one terminal event: nothing follows it.
    EXPECT_FALSE(Next(*ch, std::chrono::milliseconds(1)).has_value());
  }
  EXPECT_GT(cancelled, 0);
  EXPECT_EQ(loop.num_live(), 0);
}

// A failed step aborts every sequence; the steps sent after it are drained, so
// the next request's samples are its own.
TEST_P(EngineLoopTest, AFailedStepAbortsAllAndTheNextRequestIsServed) {
  prometheus::Registry registry;
  std::vector<int32_t> alone;
  {
    FakeWorkers workers;
    EngineLoop loop(Config(GetParam()), workers, registry);
    alone = Drain(*Submit(loop, Request(5, 6)).sink).first;
  }
  FakeWorkers workers;
  workers.fail_step = 3;
  prometheus::Registry registry2;
  EngineLoop loop(Config(GetParam()), workers, registry2);
  std::vector<std::shared_ptr<QueueSink>> channels;
  std::promise<void> open;
  workers.gate = open.get_future().share();  // all four start in the first step
  for (int i = 0; i < 4; ++i) channels.push_back(Submit(loop, Request(3 + i, 20)).sink);
  open.set_value();
  for (auto& ch : channels) EXPECT_EQ(Drain(*ch).second, FinishKind::kAborted);
  auto [tokens, finish] = Drain(*Submit(loop, Request(5, 6)).sink);
  EXPECT_EQ(finish, FinishKind::kLength);
  EXPECT_EQ(tokens, alone);
  EXPECT_EQ(loop.num_live(), 0);
}

// A lost worker is a pause: every request waits for it and, once it is back, ends with exactly
// the tokens it gets without the fault; nothing is delivered twice.
TEST_P(EngineLoopTest, ALostWorkerIsAPauseAndEveryRequestEndsAsWithoutIt) {
  std::vector<std::vector<int32_t>> alone;
  {
    prometheus::Registry registry;
    FakeWorkers workers;
    EngineLoop loop(Config(GetParam()), workers, registry);
    for (int i = 0; i < 6; ++i) alone.push_back(Drain(*Submit(loop, Request(3 + 5 * i, 12)).sink).first);
  }
  prometheus::Registry registry;
  FakeWorkers workers;
  workers.lose_step = 6;
  workers.back = false;
  EngineLoop loop(Config(GetParam()), workers, registry);
  std::promise<void> open;
  workers.gate = open.get_future().share();  // all six start before the loss
  std::vector<std::shared_ptr<QueueSink>> channels;
  for (int i = 0; i < 6; ++i) channels.push_back(Submit(loop, Request(3 + 5 * i, 12)).sink);
  open.set_value();
  for (int i = 0; i < 500 && !loop.State().workers_lost; ++i) std::this_thread::sleep_for(std::chrono::milliseconds(10));
  ASSERT_TRUE(loop.State().workers_lost);
  std::this_thread::sleep_for(std::chrono::milliseconds(300));
  EXPECT_GT(workers.reconnect_attempts.load(), 0);
  EXPECT_EQ(loop.num_live(), 6);  // every request waits
  workers.back = true;
  for (int i = 0; i < 6; ++i) {
    auto [tokens, finish] = Drain(*channels[i]);
    EXPECT_EQ(finish, FinishKind::kLength) << "request " << i;
    EXPECT_EQ(tokens, alone[i]) << "request " << i;
  }
  EXPECT_FALSE(loop.State().workers_lost);
  EXPECT_EQ(loop.num_live(), 0);
}

// The loop drives a scheduler::Replica, the one ferry-sim drives (issue #54): what it told its replica, replayed
// into a fresh one, gives the same caps and plans step for step, through the goodput controller's changes, a
// cancel, an admin's cap and a lost worker.
TEST_P(EngineLoopTest, ItsReplicaReplaysStepForStep) {
  prometheus::Registry registry;
  FakeWorkers workers;
  workers.lose_step = 40;
  ControllerOptions controller;
  controller.mode = ControllerMode::kGoodput;
  controller.max_num_seqs = 8;
  controller.slo.ttft_target_s = 0.02;  // its times scale with the target: a plan every 10 ms
  controller.slo.tpot_target_s = 0.002;
  controller.goodput.min_completions = 1;
  std::vector<ReplicaInput> record;
  std::vector<std::shared_ptr<QueueSink>> channels;
  {
    EngineLoop loop(Config(GetParam()), controller, workers, registry, RecoveryOptions{});
    loop.RecordReplica(&record);
    for (int i = 0; i < 24; ++i) {
      channels.push_back(Submit(loop, Request(3 + (5 * i) % 40, 4 + (7 * i) % 30)).sink);
      if (i == 10) loop.Cancel(channels.size());  // seq ids count from 1
      if (i == 16) loop.SetMaxNumSeqs(3, /*hold=*/false);
      std::this_thread::sleep_for(std::chrono::milliseconds(3));
    }
    for (auto& ch : channels) Drain(*ch);
    loop.RecordReplica(nullptr);
  }
  int plans = 0;
  std::set<int32_t> caps;
  bool requeued = false;
  for (const ReplicaInput& in : record) {
    plans += in.kind == ReplicaInput::Kind::kPlan;
    if (in.kind == ReplicaInput::Kind::kPlan) caps.insert(in.cap);
    requeued = requeued || in.kind == ReplicaInput::Kind::kRequeueAll;
  }
  ASSERT_GT(plans, 50);
  EXPECT_GE(caps.size(), 2u) << "the cap should change along the way";
  EXPECT_TRUE(requeued) << "the worker should have been lost";
  Replica replica(Config(GetParam()), controller);
  const ReplayResult replay = Replay(replica, record);
  EXPECT_EQ(replay.num_plans, static_cast<size_t>(plans));
  EXPECT_EQ(replay.num_same, replay.num_plans) << replay.first_difference;
}

// The live scheduler's replica and the simulator's, fed the same record (issue #54). The engine loop serves two
// lanes with first-token targets, "interactive" (the SLO lane, or with no SLO lane named, one of all) and
// "batch", under late-last order; its record, replayed into the replica ferry-sim builds for a trace with those
// lanes (SimSchedulerConfig and the same controller options), gives the same caps and plans step for step. Both
// take the planner's assumptions about the queue from one rule (ForQueue): before, ferry-sim assumed late-last
// order with no SLO lane named where ferry-scheduler did not.
TEST_P(EngineLoopTest, TheSimulatorsReplicaMakesTheLiveReplicasPlans) {
  for (const std::vector<std::string>& slo_lanes : {std::vector<std::string>{"interactive"}, std::vector<std::string>{}}) {
    SCOPED_TRACE(slo_lanes.empty() ? "no SLO lane named" : "SLO lane interactive");
    prometheus::Registry registry;
    FakeWorkers workers;
    ControllerOptions controller;
    controller.mode = ControllerMode::kGoodput;
    controller.max_num_seqs = 8;
    controller.slo.ttft_target_s = 0.02;
    controller.slo.tpot_target_s = 0.002;
    controller.slo.lanes = slo_lanes;
    controller.goodput.min_completions = 1;
    SchedulerConfig live = Config(GetParam());
    live.serve_late_last = true;  // as ferry-scheduler's main assembles it from --lane-ttft-ms and --slo-lane
    live.lane_ttft = LaneTargets({{"interactive", 20}, {"batch", 200}}, slo_lanes, 20);
    std::vector<ReplicaInput> record;
    std::vector<std::shared_ptr<QueueSink>> channels;
    std::vector<sim::TraceRequest> trace;
    {
      EngineLoop loop(live, controller, workers, registry, RecoveryOptions{});
      loop.RecordReplica(&record);
      for (int i = 0; i < 30; ++i) {
        RequestSpec r = Request(3 + (5 * i) % 40, 4 + (7 * i) % 30);
        r.lane = i % 3 == 0 ? "batch" : "interactive";
        trace.push_back({.lane = r.lane});
        channels.push_back(Submit(loop, std::move(r)).sink);
        std::this_thread::sleep_for(std::chrono::milliseconds(2));
      }
      for (auto& ch : channels) Drain(*ch);
      loop.RecordReplica(nullptr);
    }
    sim::SimOptions o;
    o.scheduler = Config(GetParam());
    o.scheduler.serve_late_last = true;
    o.controller = controller;
    o.lanes = {{.name = "interactive", .ttft_slo_s = 0.02}, {.name = "batch", .ttft_slo_s = 0.2}};
    Replica simulated(sim::SimSchedulerConfig(o, trace), o.controller);
    Replica made_live(live, controller);
    EXPECT_EQ(simulated.controller().options().goodput.late_last, !slo_lanes.empty());
    EXPECT_EQ(simulated.controller().options().goodput.late_last, made_live.controller().options().goodput.late_last);
    EXPECT_EQ(simulated.controller().options().goodput.other_ttft_target_s,
              made_live.controller().options().goodput.other_ttft_target_s);
    const size_t plans = std::count_if(record.begin(), record.end(),
                                       [](const ReplicaInput& in) { return in.kind == ReplicaInput::Kind::kPlan; });
    ASSERT_GT(plans, 30u);
    const ReplayResult replay = Replay(simulated, record);
    EXPECT_EQ(replay.num_plans, plans);
    EXPECT_EQ(replay.num_same, replay.num_plans) << replay.first_difference;
  }
}

// One sequence the workers refuse ends alone, INVALID_ARGUMENT's way with their reason (#54): the others in its
// step, and those after, get exactly the tokens they get without it; the workers hear it ended.
TEST_P(EngineLoopTest, ASequenceTheWorkersRefuseEndsAloneWithItsReason) {
  std::vector<RequestSpec> requests;
  for (int i = 0; i < 6; ++i) requests.push_back(Request(3 + 4 * i, 10));
  std::vector<std::vector<int32_t>> alone;
  {
    prometheus::Registry registry;
    FakeWorkers workers;
    EngineLoop loop(Config(GetParam()), ControllerOptions{}, workers, registry, RecoveryOptions{});
    for (const RequestSpec& r : requests) alone.push_back(Drain(*Submit(loop, r).sink).first);
  }
  prometheus::Registry registry;
  FakeWorkers workers;
  RequestSpec bad = Request(5, 10);
  bad.prompt.front() = 99;
  workers.refuse_first_token = 99;
  EngineLoop loop(Config(GetParam()), ControllerOptions{}, workers, registry, RecoveryOptions{});
  std::vector<std::shared_ptr<QueueSink>> sinks;
  for (size_t i = 0; i < requests.size(); ++i) {
    sinks.push_back(Submit(loop, requests[i]).sink);
    if (i == 2) sinks.push_back(Submit(loop, bad).sink);
  }
  for (size_t i = 0, k = 0; i < sinks.size(); ++i) {
    if (i == 3) {
      auto end = Next(*sinks[i], std::chrono::milliseconds(5000));  // its first scheduling comes first
      while (end && end->finish == FinishKind::kNone && end->new_tokens.empty()) {
        end = Next(*sinks[i], std::chrono::milliseconds(5000));
      }
      ASSERT_TRUE(end.has_value());
      EXPECT_EQ(end->finish, FinishKind::kRefused);
      EXPECT_TRUE(end->new_tokens.empty());
      EXPECT_EQ(end->error, "sequence 4: injected refusal");  // seq ids count from 1: the fourth submitted
      continue;
    }
    const auto [tokens, finish] = Drain(*sinks[i]);
    EXPECT_EQ(finish, FinishKind::kLength) << "request " << k;
    EXPECT_EQ(tokens, alone[k]) << "request " << k;
    ++k;
  }
  EXPECT_EQ(loop.num_live(), 0);
  // The next plan after the refusal told the workers it ended (the others ran on for many steps after it).
  EXPECT_EQ(workers.refused_forgotten.load(), 1);
}

// Load, use, unload and reload while requests run: a request accepted under an adapter finishes
// with the weights it started with, one naming it after the unload is refused NOT_FOUND, a reload
// serves the new weights under the same name, and the workers drop the old ones after their last
// request ended.
TEST_P(EngineLoopTest, AdaptersLoadUnloadAndReloadUnderLoadWithoutMixingWeights) {
  SchedulerConfig config = Config(GetParam());
  config.max_loras = 2;
  config.lora_modules = {"start"};
  const RequestSpec long_one = Request(6, 120);
  auto under = [](RequestSpec r, const std::string& name) {
    r.lora_name = name;
    return r;
  };
  auto alone = [&](const std::string& path) {  // what the request gets under `path`'s weights, alone
    prometheus::Registry registry;
    FakeWorkers workers;
    EngineLoop loop(config, ControllerOptions{}, workers, registry, RecoveryOptions{});
    EXPECT_EQ(loop.LoadLora("x", path).code, LoraChange::Code::kOk);
    return Drain(*Submit(loop, under(long_one, "x")).sink).first;
  };
  const std::vector<int32_t> under_p1 = alone("/adapters/p1"), under_p2 = alone("/adapters/p2");
  ASSERT_NE(under_p1, under_p2) << "the fake's weights must show in its tokens";

  prometheus::Registry registry;
  FakeWorkers workers;
  workers.adapters["start"] = "/adapters/start";  // its --lora-modules
  EngineLoop loop(config, ControllerOptions{}, workers, registry, RecoveryOptions{});
  EXPECT_EQ(loop.LoraNames(), (std::vector<std::string>{"start"}));
  const LoraChange bad = loop.LoadLora("y", "/adapters/missing");
  EXPECT_EQ(bad.code, LoraChange::Code::kInvalidArgument);
  EXPECT_EQ(bad.message, "lora_path /adapters/missing is missing");
  EXPECT_EQ(bad.names, (std::vector<std::string>{"start"})) << "nothing loaded half-way";
  const LoraChange loaded = loop.LoadLora("x", "/adapters/p1");
  EXPECT_EQ(loaded.code, LoraChange::Code::kOk);
  EXPECT_EQ(loaded.names, (std::vector<std::string>{"start", "x"}));
  EXPECT_EQ(loop.LoadLora("x", "/adapters/p2").code, LoraChange::Code::kAlreadyExists);
  const std::string old_key = workers.loads.back();

  Sub base = Submit(loop, long_one);
  Sub first = Submit(loop, under(long_one, "x"));
  const LoraChange unloaded = loop.UnloadLora("x");  // applied after the submits: `first` is live
  EXPECT_EQ(unloaded.code, LoraChange::Code::kOk);
  EXPECT_EQ(unloaded.names, (std::vector<std::string>{"start"}));
  EXPECT_TRUE(workers.Holds(old_key)) << "dropped under a running request";
  Sub refused = Submit(loop, under(long_one, "x"));
  EXPECT_EQ(loop.UnloadLora("x").code, LoraChange::Code::kNotFound);
  EXPECT_EQ(loop.LoadLora("x", "/adapters/p2").code, LoraChange::Code::kOk);  // the reload
  const std::string new_key = workers.loads.back();
  EXPECT_NE(new_key, old_key) << "a reload's key is its own";
  Sub second = Submit(loop, under(long_one, "x"));
  Sub start = Submit(loop, under(long_one, "start"));

  const auto [refused_tokens, refused_finish] = Drain(*refused.sink);
  EXPECT_EQ(refused_finish, FinishKind::kNotFound);
  EXPECT_TRUE(refused_tokens.empty());
  EXPECT_EQ(Drain(*first.sink), std::make_pair(under_p1, FinishKind::kLength)) << "the old weights to its end";
  EXPECT_EQ(Drain(*second.sink), std::make_pair(under_p2, FinishKind::kLength)) << "the reload's weights";
  EXPECT_EQ(Drain(*base.sink).second, FinishKind::kLength);
  EXPECT_EQ(Drain(*start.sink).second, FinishKind::kLength);
  EXPECT_FALSE(workers.Holds(old_key)) << "the old weights outlived their last request";
  EXPECT_TRUE(workers.Holds(new_key));
  EXPECT_EQ(loop.num_live(), 0);
}

// A restarted worker holds only its --lora-modules: the loop loads the run-time adapters again
// before the requests it kept resume, so they finish as without the loss.
TEST(EngineLoop, ARestartedWorkerGetsTheRunTimeAdaptersAgain) {
  SchedulerConfig config = Config(1);
  config.max_loras = 1;
  RequestSpec r = Request(6, 40);
  r.lora_name = "x";
  std::vector<int32_t> expected;
  {
    prometheus::Registry registry;
    FakeWorkers workers;
    EngineLoop loop(config, ControllerOptions{}, workers, registry, RecoveryOptions{});
    ASSERT_EQ(loop.LoadLora("x", "/adapters/p1").code, LoraChange::Code::kOk);
    expected = Drain(*Submit(loop, r).sink).first;
  }
  prometheus::Registry registry;
  FakeWorkers workers;
  workers.lose_step = 5;
  RecoveryOptions recovery;
  recovery.probe_interval = std::chrono::milliseconds(5);
  EngineLoop loop(config, ControllerOptions{}, workers, registry, recovery);
  ASSERT_EQ(loop.LoadLora("x", "/adapters/p1").code, LoraChange::Code::kOk);
  EXPECT_EQ(Drain(*Submit(loop, r).sink), std::make_pair(expected, FinishKind::kLength));
  EXPECT_EQ(workers.loads.size(), 2u) << "loaded again once, after the restart";
}

INSTANTIATE_TEST_SUITE_P(StepsInFlight, EngineLoopTest, ::testing::Values(1, 2));

// Not back within the recovery timeout: every live request ends kUnavailable, new ones are refused
// so at once, and once the workers are back the replica serves again.
TEST(EngineLoop, AWorkerNotBackInTimeEndsRequestsUnavailableAndTheReplicaServesOnceItIs) {
  prometheus::Registry registry;
  FakeWorkers workers;
  workers.lose_step = 3;
  workers.back = false;
  RecoveryOptions recovery;
  recovery.recovery_timeout = std::chrono::milliseconds(300);
  ControllerOptions cap;
  cap.max_num_seqs = 8;
  EngineLoop loop(Config(), cap, workers, registry, recovery);
  std::vector<std::shared_ptr<QueueSink>> channels;
  for (int i = 0; i < 3; ++i) channels.push_back(Submit(loop, Request(4 + i, 30)).sink);
  const auto start = Clock::now();
  for (auto& ch : channels) EXPECT_EQ(Drain(*ch).second, FinishKind::kUnavailable);
  EXPECT_GE(Clock::now() - start, std::chrono::milliseconds(300));
  EXPECT_EQ(Drain(*Submit(loop, Request(5, 6)).sink).second, FinishKind::kUnavailable);  // refused at once
  workers.back = true;
  for (int i = 0; i < 500 && loop.State().workers_lost; ++i) std::this_thread::sleep_for(std::chrono::milliseconds(10));
  ASSERT_FALSE(loop.State().workers_lost);
  EXPECT_EQ(Drain(*Submit(loop, Request(5, 6)).sink).second, FinishKind::kLength);
  EXPECT_EQ(loop.num_live(), 0);
}

// The recovery timeout wakes the loop itself: the requests end at it, not at the first probe after
// it. Probes 30 s apart here: before, they ended 30 s after the loss (the CI run of stop 71 saw
// test_e2e_stack_faults' requests end 1.1 s past a 3 s timeout, probes being 250 ms apart plus
// the probe's own 250 ms).
TEST(EngineLoop, TheRecoveryTimeoutEndsRequestsAtItNotAtTheNextProbe) {
  prometheus::Registry registry;
  FakeWorkers workers;
  workers.lose_step = 3;
  workers.back = false;
  RecoveryOptions recovery;
  recovery.recovery_timeout = std::chrono::milliseconds(300);
  recovery.probe_interval = std::chrono::seconds(30);
  ControllerOptions cap;
  cap.max_num_seqs = 8;
  EngineLoop loop(Config(), cap, workers, registry, recovery);
  std::vector<std::shared_ptr<QueueSink>> channels;
  for (int i = 0; i < 2; ++i) channels.push_back(Submit(loop, Request(4 + i, 30)).sink);
  const auto start = Clock::now();
  for (auto& ch : channels) EXPECT_EQ(Drain(*ch).second, FinishKind::kUnavailable);
  EXPECT_LT(Clock::now() - start, std::chrono::seconds(10)) << "ended at a probe, not at the timeout";
}

// A worker that dies while the replica is idle is noticed then (health and metrics say so), not at
// the next request; once it is back the replica serves.
TEST(EngineLoop, AWorkerLostWhileIdleIsNoticedWithoutARequest) {
  prometheus::Registry registry;
  FakeWorkers workers;
  RecoveryOptions recovery;
  recovery.idle_check_interval = std::chrono::milliseconds(20);
  ControllerOptions cap;
  cap.max_num_seqs = 8;
  EngineLoop loop(Config(), cap, workers, registry, recovery);
  EXPECT_EQ(Drain(*Submit(loop, Request(5, 6)).sink).second, FinishKind::kLength);
  workers.back = false;
  workers.gone_while_idle = true;
  for (int i = 0; i < 500 && !loop.State().workers_lost; ++i) std::this_thread::sleep_for(std::chrono::milliseconds(10));
  ASSERT_TRUE(loop.State().workers_lost);
  EXPECT_GT(workers.idle_checks.load(), 0);
  workers.back = true;
  for (int i = 0; i < 500 && loop.State().workers_lost; ++i) std::this_thread::sleep_for(std::chrono::milliseconds(10));
  ASSERT_FALSE(loop.State().workers_lost);
  EXPECT_EQ(Drain(*Submit(loop, Request(5, 6)).sink).second, FinishKind::kLength);
  EXPECT_EQ(loop.num_live(), 0);
}

// The first event says when the sequence was first scheduled; a request still waiting at its
// queue deadline ends DEADLINE_EXCEEDED.
TEST(EngineLoop, TheFirstEventSaysWhenItStartedAndAQueueDeadlineEndsAWaitingRequest) {
  prometheus::Registry registry;
  FakeWorkers workers;
  EngineLoop loop(Config(), workers, registry);
  const RequestSpec spec = Request(5, 6);
  auto [id, ch] = Submit(loop, spec);
  auto first = Next(*ch, std::chrono::milliseconds(5000));
  ASSERT_TRUE(first.has_value());
  ASSERT_TRUE(first->first_scheduled.has_value());
  EXPECT_GE(*first->first_scheduled, spec.arrival);
  RequestSpec late = Request(5, 6);
  late.queue_deadline = Clock::now();
  auto [tokens, finish] = Drain(*Submit(loop, late).sink);
  EXPECT_EQ(finish, FinishKind::kQueueTimeout);
  EXPECT_TRUE(tokens.empty());
  EXPECT_EQ(Drain(*ch).second, FinishKind::kLength);
}

TEST(EngineLoop, TooLongIsRejectedAtSubmit) {
  prometheus::Registry registry;
  FakeWorkers workers;
  EngineLoop loop(Config(), workers, registry);
  try {
    Submit(loop, Request(200, 100));
    FAIL() << "expected invalid_argument";
  } catch (const std::invalid_argument& e) {
    EXPECT_NE(std::string(e.what()).find("max_model_len = 256"), std::string::npos) << e.what();
  }
}

}  // namespace
}  // namespace ferry::scheduler
