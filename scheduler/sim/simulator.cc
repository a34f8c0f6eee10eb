#include "scheduler/sim/simulator.h"

#include <algorithm>
#include <chrono>
#include <set>
#include <unordered_map>
#include <utility>

#include "scheduler/core/replica.h"
#include "scheduler/core/scheduler_core.h"

namespace ferry::sim {
namespace {

using scheduler::SchedulerCore;

scheduler::TimePoint ToTimePoint(double t) {
  return scheduler::TimePoint(std::chrono::nanoseconds(static_cast<int64_t>(t * 1e9)));
}

// What the simulated worker knows of a sequence.
struct WorkerSeq {
  int32_t num_known = 0;     // tokens the worker has (prompt + generated)
  int32_t num_computed = 0;  // tokens whose KV it holds
  size_t index = 0;          // into the trace
};

scheduler::RequestSpec MakeSpec(const TraceRequest& r, size_t index, const LaneConfig& lane,
                                double now) {
  scheduler::RequestSpec spec;
  spec.seq_id = index + 1;
  spec.request_id = "sim-" + std::to_string(index);
  spec.prompt.resize(static_cast<size_t>(r.prompt_tokens));
  for (int32_t i = 0; i < r.prompt_tokens; ++i) {
    const bool is_shared = r.prefix_id >= 0 && i < r.prefix_tokens;
    const uint64_t key = is_shared ? static_cast<uint64_t>(r.prefix_id) * 7919u + 1 : index * 104729u + 2;
    spec.prompt[static_cast<size_t>(i)] = 10 + static_cast<int32_t>((key * 31 + static_cast<uint64_t>(i) * 7) % 50000);
  }
  spec.max_tokens = r.output_tokens;
  spec.ignore_eos = true;
  spec.priority = lane.priority;
  spec.lane = r.lane;
  spec.arrival = ToTimePoint(now);
  return spec;
}

// Each lane's TTFT SLO is its requests' first-token target, as ferry-scheduler's --lane-ttft-ms gives it,
// for the lanes the trace uses, as an operator names the lanes it serves (a lane with an SLO but no
// requests would only bind the other lanes' wait: ForQueue). The controller's assumptions about the queue
// follow from this by the live scheduler's rule (Replica's constructor).
scheduler::SchedulerConfig WithLaneTargets(const SimOptions& o, const std::vector<TraceRequest>& trace) {
  std::set<std::string> used;
  for (const TraceRequest& r : trace) used.insert(r.lane);
  scheduler::SchedulerConfig c = o.scheduler;
  for (const LaneConfig& lane : o.lanes) {
    if (used.count(lane.name) > 0) c.lane_ttft.push_back({lane.name, 1e3 * lane.ttft_slo_s});
  }
  return c;
}

class Simulation {
 public:
  Simulation(const std::vector<TraceRequest>& trace, const CostModel& cost, const SimOptions& o)
      : trace_(trace), cost_(cost), options_(o), replica_(WithLaneTargets(o, trace), o.controller) {
    replica_.Record(o.record);
    result_.requests.resize(trace.size());
    for (size_t i = 0; i < trace.size(); ++i) result_.requests[i].request = trace[i];
    const bool closed = o.closed_loop_concurrency > 0;
    for (size_t i = 0; i < trace.size(); ++i) {
      if (!closed || i < static_cast<size_t>(o.closed_loop_concurrency)) {
        pending_.push_back({closed ? 0.0 : trace[i].arrival_s, i});
      }
    }
    next_closed_ = closed ? std::min(trace.size(), static_cast<size_t>(o.closed_loop_concurrency)) : 0;
  }

  SimResult Run() {
    result_.caps.push_back({0, replica_.controller().num_seqs()});
    while (now_ < options_.max_sim_s) {
      AddArrivals();
      if (!replica_.core().has_work()) {
        if (next_pending_ >= pending_.size()) break;
        now_ = pending_[next_pending_].time_s;
        continue;
      }
      if (!RunStep()) {
        if (next_pending_ >= pending_.size()) break;
        now_ = std::max(now_, pending_[next_pending_].time_s);
      }
    }
    result_.sim_s = now_;
    result_.num_steps = replica_.core().num_steps();
    result_.num_preemptions = replica_.core().num_preemptions();
    if (options_.closed_loop_concurrency <= 0) result_.steady_end_s = now_;
    return std::move(result_);
  }

 private:
  struct Pending {
    double time_s;
    size_t index;
  };

  void AddArrivals() {
    while (next_pending_ < pending_.size() && pending_[next_pending_].time_s <= now_) {
      const auto [arrival_s, i] = pending_[next_pending_++];
      const TraceRequest& r = trace_[i];
      const LaneConfig& lane = FindLane(options_.lanes, r.lane);
      replica_.Add(MakeSpec(r, i, lane, arrival_s));
      // The request arrived at arrival_s (during the step that just ended):
      // its TTFT counts from then, not from when the loop noticed it.
      result_.requests[i].arrival_s = arrival_s;
    }
  }

  // One Plan -> cost -> Commit cycle; false if the plan was empty.
  bool RunStep() {
    scheduler::StepPlan plan;
    const int32_t cap = replica_.Plan(ToTimePoint(now_), now_, plan);
    if (cap != result_.caps.back().num_seqs) result_.caps.push_back({now_, cap});
    for (scheduler::CapChange& c : replica_.TakeChanges()) result_.changes.push_back(std::move(c));
    // First schedulings: the prompt tokens the cache held, for the controller (TTFT counts from the
    // first token, and the sim sets no deadlines).
    for (const scheduler::SeqEvent& e : replica_.TakeEvents()) {
      if (e.first_scheduled) result_.requests[e.seq_id - 1].num_cached_tokens = e.num_cached_tokens;
    }
    if (plan.empty()) return false;
    for (uint64_t id : plan.finished_ids) worker_.erase(id);
    for (uint64_t id : plan.preempted_ids) {
      worker_.erase(id);
      ++result_.requests[id - 1].num_preemptions;
    }
    for (const auto& n : plan.new_sequences) {
      // Cached prefix positions are already computed (0 unless prefix caching is on).
      worker_[n.seq_id] = WorkerSeq{static_cast<int32_t>(n.token_ids.size()), n.num_cached_tokens, n.seq_id - 1};
    }
    ferry::StepShape shape;
    std::vector<scheduler::SampledToken> sampled;
    for (const auto& s : plan.scheduled) {
      WorkerSeq& w = worker_.at(s.seq_id);
      w.num_computed += s.num_tokens;
      shape.num_tokens += s.num_tokens;
      shape.num_kv_tokens += w.num_computed;
      if (w.num_computed == w.num_known) {
        sampled.push_back({s.seq_id, 100 + static_cast<int32_t>(s.seq_id % 1000), std::nullopt});
        ++w.num_known;
      }
    }
    shape.num_seqs = static_cast<int32_t>(plan.scheduled.size());
    const double step_s = cost_.StepSeconds(shape);
    replica_.StepRan(step_s, static_cast<int32_t>(shape.num_tokens), shape.num_seqs);
    now_ += step_s;
    result_.busy_s += step_s;
    replica_.Commit(plan, sampled, {}, events_);
    for (const auto& e : events_) Record(e);
    return true;
  }

  void Record(const scheduler::SeqEvent& e) {
    RequestResult& r = result_.requests[e.seq_id - 1];
    const int32_t n = static_cast<int32_t>(e.new_tokens.size());
    if (r.num_output == 0 && n > 0) r.first_token_s = now_;
    r.num_output += n;
    result_.num_output_tokens += n;
    if (next_closed_ < trace_.size() || options_.closed_loop_concurrency <= 0) {
      result_.steady_output_tokens += n;
      result_.steady_end_s = now_;
    }
    if (e.finish == scheduler::FinishKind::kNone) return;
    r.end_s = now_;
    worker_.erase(e.seq_id);
    replica_.Ended(e, now_, r.ttft_s(), r.end_s - r.first_token_s, r.num_cached_tokens);
    if (options_.closed_loop_concurrency > 0 && next_closed_ < trace_.size()) {
      pending_.push_back({now_, next_closed_++});
    }
  }

  const std::vector<TraceRequest>& trace_;
  const CostModel& cost_;
  const SimOptions& options_;
  scheduler::Replica replica_;  // what ferry-scheduler's engine loop drives too
  SimResult result_;
  std::vector<Pending> pending_;  // in time order (closed loop appends at now)
  size_t next_pending_ = 0;
  size_t next_closed_ = 0;
  std::unordered_map<uint64_t, WorkerSeq> worker_;
  double now_ = 0;
  std::vector<scheduler::SeqEvent> events_;  // Commit's, kept for its storage
};

}  // namespace

const LaneConfig& FindLane(const std::vector<LaneConfig>& lanes, const std::string& name) {
  static const LaneConfig kDefault;
  for (const LaneConfig& l : lanes) {
    if (l.name == name) return l;
  }
  for (const LaneConfig& l : lanes) {
    if (l.name == "default") return l;
  }
  return kDefault;
}

scheduler::SchedulerConfig SimSchedulerConfig(const SimOptions& options, const std::vector<TraceRequest>& trace) {
  return WithLaneTargets(options, trace);
}

SimResult RunSimulation(const std::vector<TraceRequest>& trace, const CostModel& cost,
                        const SimOptions& options) {
  return Simulation(trace, cost, options).Run();
}

}  // namespace ferry::sim

