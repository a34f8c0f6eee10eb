// One scheduler replica's decisions, whoever drives them (issue #54): the planner (SchedulerCore), the
// cap controller, and what passes between the two. ferry-scheduler's engine loop and ferry-sim's
// simulation each drive one and supply only what differs between them, the clock and the engine: they
// add and cancel requests, plan each step at a time of theirs, commit what the engine sampled, say what
// each step took and when each request ended. Both build the controller's observations from the same
// events by the same code, so a decision the simulator shows is the one the live scheduler takes
// (before, each assembled the observation field by field, and the copies had drifted).
//
// Every change to the replica goes through it (core() and controller() are for reading), so a record of
// its inputs replayed into another replica gives the same plans and caps, step for step (Replay).
// Pure, like the rest of the core: no clock, thread or I/O; times are passed in.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "scheduler/cap/controller.h"
#include "scheduler/core/scheduler_core.h"

namespace ferry::scheduler {

// One input to a replica, as Record keeps it.
struct ReplicaInput {
  enum class Kind { kAdd, kCancel, kSetCap, kPlan, kCommit, kStepRan, kEnded, kAbortAll, kRequeueAll, kExpire };
  Kind kind = Kind::kAdd;
  RequestSpec spec;                      // kAdd
  uint64_t seq_id = 0;                   // kCancel
  int32_t cap = 0;                       // kSetCap; kPlan: the cap the controller gave
  bool hold = false;                     // kSetCap
  StepPlan plan;                         // kPlan: the plan made
  TimePoint now{};                       // kPlan, kExpire
  double now_s = 0;                      // kSetCap, kPlan, kEnded
  std::vector<SampledToken> sampled;     // kCommit
  std::vector<PromptLogprobs> prompt_logprobs;  // kCommit
  double step_s = 0;                     // kStepRan: the step's duration
  int32_t tokens = 0, seqs = 0;          // kStepRan
  SeqEvent last;                         // kEnded: the request's final event (its account)
  double ttft_s = 0, decode_s = 0;       // kEnded
  int32_t num_cached_tokens = 0;         // kEnded
  FinishKind finish = FinishKind::kNone;  // kAbortAll
};

// The first-token target of each lane as a replica's queue takes them (SchedulerConfig::lane_ttft): `stated`
// (ferry-scheduler's --lane-ttft-ms; ferry-sim's trace lanes), then each of `slo_lanes` not among them at
// slo_ttft_ms, the SLO lanes' target. Only lanes with a target can be late (serve_late_last).
std::vector<LaneTtft> LaneTargets(std::vector<LaneTtft> stated, const std::vector<std::string>& slo_lanes,
                                  double slo_ttft_ms);

// What the goodput planner assumes of the queue it plans for, read from the queue's own configuration, so
// every driver assumes the same (ferry-scheduler and ferry-sim each had a rule of their own, and they differed):
// - goodput.late_last: the SLO lanes' late requests are served after the rest only when config.serve_late_last
//   holds and every SLO lane has a first-token target. With no SLO lane named every lane counts, and only a
//   default target (SchedulerConfig::default_ttft_ms) covers a lane the replica has not heard of: without one,
//   such a lane is first come, first served.
// - goodput.other_ttft_target_s: the tightest target of a lane outside the SLO lanes (OtherLanesTtftTarget).
// The Replica constructor applies it: a driver cannot set either itself.
ControllerOptions ForQueue(ControllerOptions controller, const SchedulerConfig& config);

class Replica {
 public:
  // `controller` as ForQueue(controller, config) makes it.
  Replica(const SchedulerConfig& config, ControllerOptions controller);

  const SchedulerCore& core() const { return core_; }
  const Controller& controller() const { return controller_; }

  // Queues a request (SchedulerCore::Add: std::invalid_argument on a bad one, and nothing recorded or
  // counted) and counts its arrival for the controller (SloOptions::lanes say whose are the SLO lanes').
  void Add(RequestSpec spec);
  void Cancel(uint64_t seq_id);
  // An admin's cap (Controller::Set) at now_s.
  void SetCap(int32_t cap, double now_s, bool hold);
  // Plans the next step at `now` (now_s: the same instant in the controller's seconds) under the cap the
  // controller gives for what happened since the previous plan (the observation); returns that cap.
  // `plan` as SchedulerCore::Plan takes it (its storage reused).
  int32_t Plan(TimePoint now, double now_s, StepPlan& plan);
  // SchedulerCore::Commit of the oldest step in flight, with what the engine sampled.
  void Commit(const StepPlan& plan, const std::vector<SampledToken>& sampled,
              const std::vector<PromptLogprobs>& prompt_logprobs, std::vector<SeqEvent>& events);
  // What the step just committed took (seconds, from when the engine could start it to its samples) and
  // what it computed: the controller's step-time model reads them at the next Plan.
  void StepRan(double seconds, int32_t tokens, int32_t seqs);
  // A request ended with `last` (its final event, with its account) at now_s, `ttft_s` after it arrived
  // and `decode_s` after its first token: a served request (length, eos, stop, timeout) with a token.
  // `num_cached_tokens`: its prompt tokens the prefix cache held at its first scheduling.
  void Ended(const SeqEvent& last, double now_s, double ttft_s, double decode_s, int32_t num_cached_tokens);
  // The engine failed, or was lost (SchedulerCore's AbortAll, RequeueAll, ExpireDeadlines).
  std::vector<SeqEvent> AbortAll(FinishKind kind);
  int32_t RequeueAll();
  void ExpireDeadlines(TimePoint now);
  // Events produced outside Commit (SchedulerCore::TakeEvents); cap changes (Controller::TakeChanges).
  std::vector<SeqEvent> TakeEvents() { return core_.TakeEvents(); }
  std::vector<CapChange> TakeChanges() { return controller_.TakeChanges(); }

  // The observation the latest Plan gave the controller (tests).
  const StepObservation& last_observation() const { return observation_; }
  // From now on every input is appended to `record` (null: none), which must outlive its use here.
  void Record(std::vector<ReplicaInput>* record) { record_ = record; }

 private:
  int32_t NextCap(TimePoint now, double now_s);

  SchedulerCore core_;
  Controller controller_;
  StepObservation observation_;
  int32_t arrivals_since_step_ = 0;
  int32_t slo_arrivals_since_step_ = 0;
  double last_step_s_ = 0;  // 0: no step since the previous observation
  int32_t last_step_tokens_ = 0;
  int32_t last_step_seqs_ = 0;
  uint64_t kv_preemptions_seen_ = 0;  // preemptions for KV pressure the controller was told of
  std::vector<ReplicaInput>* record_ = nullptr;
};

// Where a replay left the record: the first Plan whose cap or plan differs from the recorded one.
struct ReplayResult {
  size_t num_plans = 0;      // Plans replayed
  size_t num_same = 0;       // of those, with the recorded cap and an identical plan
  std::string first_difference;  // empty when every Plan was the recorded one
};
// Feeds `inputs` (another replica's record) to `replica` in order, committing each recorded Commit's samples
// to the oldest of its own plans in flight, and compares each Plan's cap and plan with the recorded ones; stops
// at the first that differs.
ReplayResult Replay(Replica& replica, const std::vector<ReplicaInput>& inputs);
// "" when equal, else what differs first (step id, sequence ids and token counts, block ids, finished and
// preempted ids).
std::string PlanDifference(const StepPlan& a, const StepPlan& b);

}  // namespace ferry::scheduler
