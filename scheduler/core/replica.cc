#include "scheduler/core/replica.h"

#include <algorithm>
#include <deque>
#include <stdexcept>
#include <string>
#include <utility>

namespace ferry::scheduler {

using Kind = ReplicaInput::Kind;

std::vector<LaneTtft> LaneTargets(std::vector<LaneTtft> stated, const std::vector<std::string>& slo_lanes,
                                  double slo_ttft_ms) {
  for (const std::string& lane : slo_lanes) {
    const bool listed =
        std::any_of(stated.begin(), stated.end(), [&](const LaneTtft& t) { return t.lane == lane; });
    if (!listed) stated.push_back({lane, slo_ttft_ms});
  }
  return stated;
}

ControllerOptions ForQueue(ControllerOptions c, const SchedulerConfig& config) {
  const auto has_target = [&](const std::string& lane) {
    return config.default_ttft_ms > 0 || std::any_of(config.lane_ttft.begin(), config.lane_ttft.end(),
                                                     [&](const LaneTtft& t) { return t.lane == lane; });
  };
  const std::vector<std::string>& slo_lanes = c.slo.lanes;
  const bool every_slo_lane_has_one = slo_lanes.empty() ? config.default_ttft_ms > 0
                                                        : std::all_of(slo_lanes.begin(), slo_lanes.end(), has_target);
  c.goodput.late_last = config.serve_late_last && every_slo_lane_has_one;
  c.goodput.other_ttft_target_s = OtherLanesTtftTarget(config.lane_ttft, slo_lanes);
  return c;
}

Replica::Replica(const SchedulerConfig& config, ControllerOptions controller)
    : core_(config), controller_(ForQueue(std::move(controller), config)) {}

void Replica::Add(RequestSpec spec) {
  const auto& slo_lanes = controller_.options().slo.lanes;
  const bool is_slo_lane =
      slo_lanes.empty() || std::find(slo_lanes.begin(), slo_lanes.end(), spec.lane) != slo_lanes.end();
  if (record_ == nullptr) {
    core_.Add(std::move(spec));
  } else {
    core_.Add(spec);
    record_->push_back({.kind = Kind::kAdd, .spec = std::move(spec)});
  }
  ++arrivals_since_step_;
  slo_arrivals_since_step_ += is_slo_lane;
}

void Replica::Cancel(uint64_t seq_id) {
  if (record_ != nullptr) record_->push_back({.kind = Kind::kCancel, .seq_id = seq_id});
  core_.Cancel(seq_id);
}

void Replica::SetCap(int32_t cap, double now_s, bool hold) {
  if (record_ != nullptr) record_->push_back({.kind = Kind::kSetCap, .cap = cap, .hold = hold, .now_s = now_s});
  controller_.Set(cap, now_s, hold);
}

int32_t Replica::Plan(TimePoint now, double now_s, StepPlan& plan) {
  const int32_t cap = NextCap(now, now_s);
  core_.SetPrefillSecondsPerToken(controller_.PrefillSecondsPerToken());
  core_.Plan(Budget{cap, core_.config().max_num_batched_tokens}, now, plan);
  if (record_ != nullptr) record_->push_back({.kind = Kind::kPlan, .cap = cap, .plan = plan, .now = now, .now_s = now_s});
  return cap;
}

void Replica::Commit(const StepPlan& plan, const std::vector<SampledToken>& sampled,
                     const std::vector<PromptLogprobs>& prompt_logprobs, std::vector<SeqEvent>& events) {
  if (record_ != nullptr) {
    record_->push_back({.kind = Kind::kCommit, .sampled = sampled, .prompt_logprobs = prompt_logprobs});
  }
  core_.Commit(plan, sampled, prompt_logprobs, events);
}

int32_t Replica::NextCap(TimePoint now, double now_s) {
  StepObservation& obs = observation_;
  obs = StepObservation{};
  obs.now_s = now_s;
  obs.num_running = core_.num_running();
  obs.num_waiting = core_.num_waiting();
  if (controller_.ReadsQueueAt(now_s)) {  // a scan of the queue only goodput reads, when it adjusts
    const auto waiting = core_.NumWaitingIn(controller_.options().slo.lanes, now);
    obs.num_waiting_slo = waiting.on_time;
    obs.num_waiting_slo_late = waiting.late;
  }
  obs.num_arrivals = std::exchange(arrivals_since_step_, 0);
  obs.num_arrivals_slo = std::exchange(slo_arrivals_since_step_, 0);
  const double total = core_.num_total_blocks();
  obs.kv_usage = total > 0 ? (total - core_.num_free_blocks()) / total : 0.0;
  obs.kv_capacity_tokens = static_cast<int64_t>(total) * core_.config().block_size;
  obs.max_num_batched_tokens = core_.config().max_num_batched_tokens;
  obs.resumes_from_cache = core_.config().enable_prefix_caching;
  // Each step is observed once.
  obs.last_step_s = std::exchange(last_step_s_, 0);
  obs.last_step_tokens = std::exchange(last_step_tokens_, 0);
  obs.last_step_seqs = std::exchange(last_step_seqs_, 0);
  // Only preemptions for lack of KV blocks say the batch is too large; those that make room for a
  // higher-priority request (counted apart) do not, and must not shrink the cap.
  const uint64_t kv_preemptions = core_.num_preemptions() - core_.num_priority_preemptions();
  obs.num_preemptions = static_cast<int32_t>(kv_preemptions - kv_preemptions_seen_);
  kv_preemptions_seen_ = kv_preemptions;
  return controller_.Step(obs);
}

void Replica::StepRan(double seconds, int32_t tokens, int32_t seqs) {
  if (record_ != nullptr) {
    record_->push_back({.kind = Kind::kStepRan, .step_s = seconds, .tokens = tokens, .seqs = seqs});
  }
  last_step_s_ = seconds;
  last_step_tokens_ = tokens;
  last_step_seqs_ = seqs;
}

void Replica::Ended(const SeqEvent& last, double now_s, double ttft_s, double decode_s, int32_t num_cached_tokens) {
  if (record_ != nullptr) {
    record_->push_back({.kind = Kind::kEnded, .now_s = now_s, .last = last, .ttft_s = ttft_s, .decode_s = decode_s,
                        .num_cached_tokens = num_cached_tokens});
  }
  RequestCompletion done;
  done.now_s = now_s;
  done.ttft_s = ttft_s;
  done.tpot_s = last.num_generated > 1 ? decode_s / (last.num_generated - 1) : 0.0;
  done.lane = last.lane;
  done.num_tokens = last.num_prompt_tokens + last.num_generated;
  done.num_output_tokens = last.num_generated;
  done.num_cached_tokens = num_cached_tokens;
  controller_.OnCompletion(done);
}

std::vector<SeqEvent> Replica::AbortAll(FinishKind kind) {
  if (record_ != nullptr) record_->push_back({.kind = Kind::kAbortAll, .finish = kind});
  return core_.AbortAll(kind);
}

int32_t Replica::RequeueAll() {
  if (record_ != nullptr) record_->push_back({.kind = Kind::kRequeueAll});
  return core_.RequeueAll();
}

void Replica::ExpireDeadlines(TimePoint now) {
  if (record_ != nullptr) record_->push_back({.kind = Kind::kExpire, .now = now});
  core_.ExpireDeadlines(now);
}

namespace {

template <class T>
std::string ListDifference(const char* what, const std::vector<T>& a, const std::vector<T>& b) {
  if (a == b) return "";
  return std::string(what) + " differ (" + std::to_string(a.size()) + " vs " + std::to_string(b.size()) + " entries)";
}

}  // namespace

std::string PlanDifference(const StepPlan& a, const StepPlan& b) {
  if (a.step_id != b.step_id) return "step_id " + std::to_string(a.step_id) + " vs " + std::to_string(b.step_id);
  std::vector<uint64_t> ids_a, ids_b;
  std::vector<int32_t> shape_a, shape_b;
  for (const ScheduledSequence& s : a.scheduled) {
    ids_a.push_back(s.seq_id);
    shape_a.insert(shape_a.end(), {s.num_tokens, s.num_lookahead_tokens});
    shape_a.insert(shape_a.end(), s.new_block_ids.begin(), s.new_block_ids.end());
    shape_a.push_back(-1);
  }
  for (const ScheduledSequence& s : b.scheduled) {
    ids_b.push_back(s.seq_id);
    shape_b.insert(shape_b.end(), {s.num_tokens, s.num_lookahead_tokens});
    shape_b.insert(shape_b.end(), s.new_block_ids.begin(), s.new_block_ids.end());
    shape_b.push_back(-1);
  }
  std::vector<uint64_t> new_a, new_b;
  for (const NewSequence& n : a.new_sequences) new_a.push_back(n.seq_id);
  for (const NewSequence& n : b.new_sequences) new_b.push_back(n.seq_id);
  for (const std::string& d : {ListDifference("scheduled ids", ids_a, ids_b),
                               ListDifference("token counts, lookahead or block ids", shape_a, shape_b),
                               ListDifference("new sequences", new_a, new_b),
                               ListDifference("finished ids", a.finished_ids, b.finished_ids),
                               ListDifference("preempted ids", a.preempted_ids, b.preempted_ids)}) {
    if (!d.empty()) return "step " + std::to_string(a.step_id) + ": " + d;
  }
  return "";
}

ReplayResult Replay(Replica& replica, const std::vector<ReplicaInput>& inputs) {
  ReplayResult result;
  std::deque<StepPlan> in_flight;  // the non-empty plans awaiting their Commit, oldest first
  std::vector<SeqEvent> events;
  for (const ReplicaInput& in : inputs) {
    switch (in.kind) {
      case Kind::kAdd: replica.Add(in.spec); break;
      case Kind::kCancel: replica.Cancel(in.seq_id); break;
      case Kind::kSetCap: replica.SetCap(in.cap, in.now_s, in.hold); break;
      case Kind::kPlan: {
        StepPlan plan;
        const int32_t cap = replica.Plan(in.now, in.now_s, plan);
        ++result.num_plans;
        std::string difference = cap != in.cap ? "cap " + std::to_string(cap) + " vs " + std::to_string(in.cap)
                                               : PlanDifference(plan, in.plan);
        if (!difference.empty()) {  // the record's later inputs (samples) fit its plans, not these
          result.first_difference = "plan " + std::to_string(result.num_plans) + ": " + difference;
          return result;
        }
        ++result.num_same;
        if (!plan.empty()) in_flight.push_back(std::move(plan));
        break;
      }
      case Kind::kCommit:
        if (in_flight.empty()) throw std::logic_error("Replay: a Commit with no plan in flight");
        replica.Commit(in_flight.front(), in.sampled, in.prompt_logprobs, events);
        in_flight.pop_front();
        break;
      case Kind::kStepRan: replica.StepRan(in.step_s, in.tokens, in.seqs); break;
      case Kind::kEnded: replica.Ended(in.last, in.now_s, in.ttft_s, in.decode_s, in.num_cached_tokens); break;
      case Kind::kAbortAll:
        replica.AbortAll(in.finish);
        in_flight.clear();
        break;
      case Kind::kRequeueAll:
        replica.RequeueAll();
        in_flight.clear();
        break;
      case Kind::kExpire: replica.ExpireDeadlines(in.now); break;
    }
    replica.TakeEvents();  // as a driver does; they decide nothing
  }
  return result;
}

}  // namespace ferry::scheduler
