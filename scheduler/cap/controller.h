// Adaptive max_num_seqs: picks the seat cap passed in Budget.max_num_seqs
// before every Plan. Pure: no clock reads, threads or I/O; the caller passes
// the time (seconds on any monotonic base) with every observation, so the same
// controller runs in the service (wall time) and in ferry-sim (virtual time).
//
//   controller.OnCompletion(done)        // for each finished request
//   int32_t cap = controller.Step(obs);  // once per engine step, before Plan
//   budget.max_num_seqs = cap;
//   for (auto& c : controller.TakeChanges()) { log / export metrics }
//
// Modes (cap_mode.h; each in modes/, registered in modes/registry.cc):
//   static      cap = max_num_seqs (or the last Set()).
//   load-level  named levels, each with a cap; the level is the one the
//               goodput model below predicts serves best.
//   goodput     model-based (goodput_planner.h, demand_model.h): fits step
//               time to the batch online from the steps it observes, measures
//               the demand per lane class, output lengths and the TPOT spread,
//               and sets the cap that maximises expected goodput: the SLO
//               lanes' requests that meet the targets plus the other lanes'
//               throughput. No preset: the same on the CPU engine, a GPU or
//               the sim backend.
//   slo         the name earlier releases gave their SLO controller, a set of
//               rules that held only on the traces they were tuned on (0.27 of
//               the best static cap on unseen ones, docs/benchmarks/scheduler.md
//               section 6): it now selects goodput, so every mode is safe to pick.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "scheduler/cap/goodput_planner.h"
#include "scheduler/core/ring.h"
#include "scheduler/cap/step_cost.h"
#include "scheduler/cap/step_time_model.h"
#include "scheduler/core/types.h"

namespace ferry::scheduler {

enum class ControllerMode { kStatic, kLoadLevel, kGoodput };

const char* ControllerModeName(ControllerMode mode);
// "static", "load-level", "goodput" ("slo" is goodput); throws std::invalid_argument otherwise.
ControllerMode ParseControllerMode(const std::string& name);

// GoodputOptions::other_ttft_target_s from the scheduler's lane targets: the
// tightest target of a lane outside `slo_lanes`, in seconds; 0 when no such
// lane has one or `slo_lanes` is empty (then every lane is an SLO lane).
double OtherLanesTtftTarget(const std::vector<LaneTtft>& lane_ttft, const std::vector<std::string>& slo_lanes);

// A named cap. load-level moves between levels only, choosing the one the
// goodput model (goodput_planner.h) predicts serves best.
struct LoadLevel {
  std::string name;
  int32_t num_seqs = 16;
};

struct LoadLevelOptions {
  // Ordered smallest cap first. Empty: four per doubling from min_num_seqs
  // (min * 2^(k/4), rounded) and max_num_seqs itself, named by their caps
  // ("seqs-16").
  std::vector<LoadLevel> levels;
  double rate_window_s = 10.0;  // arrival rate (status) = arrivals in this window / its length
};

// The targets the model modes serve, and what they read of the KV pool.
struct SloOptions {
  double ttft_target_s = 1.0;
  double tpot_target_s = 0.050;
  double percentile = 95.0;        // of the windowed TTFT and TPOT that status() reports
  double window_s = 20.0;          // completions and steps older than this are dropped
  int32_t min_samples = 20;        // completions before the percentiles and the KV estimate count
  // Without prefix caching a preemption recomputes the victim's context, so
  // the cap stays within the seats kv_raise_limit of the pool holds at the KV
  // a running sequence holds on average (recent completions, every lane);
  // the rest is room for the batch's spread about that mean. With it
  // (resumes_from_cache) a resume mostly hits the cache, and the cap may
  // reach the seats the whole pool holds at the KV the running sequences
  // hold now (prefix-shared blocks counted once).
  double kv_raise_limit = 0.85;
  // The operator stated the targets (ferry-scheduler: --slo-ttft-ms,
  // --slo-tpot-ms or --slo-lane given). Without, the model modes have
  // nothing to trade throughput for and hold the cap at the largest the KV
  // pool allows, --max-num-seqs at most (PlanRegime::kNoTargets): a default
  // TTFT and TPOT can be out of reach on the engine that runs (50 ms is
  // below the CPU engine's step at 4 sequences), and vLLM and SGLang users
  // expect a fixed cap unless they ask for SLOs (issue #52).
  bool targets_stated = true;
  // Only completions and arrivals of these lanes count toward the targets
  // (empty: all); the other lanes are batch work (GoodputOptions::other_wait_s).
  std::vector<std::string> lanes;
};

// goodput and load-level modes (goodput_planner.h). The TTFT and TPOT
// targets, lanes and KV rules are SloOptions'.
//
// The model modes keep time in units of the TTFT target: every time below,
// and load.rate_window_s and slo.window_s, is in seconds at a target of
// kReferenceTtftS and scales with the target. A replica whose steps and
// targets are all k times longer (a larger model, the CPU engine, a
// time-dilated trace) then makes the same decisions, k times slower; with
// fixed windows it reacted k times too fast for its own time scale
// (docs/benchmarks/scheduler.md section 7b).
inline constexpr double kReferenceTtftS = 1.0;
struct GoodputOptions {
  double rate_window_s = 5.0;      // the SLO lanes' arrival rate over this window
  double adjust_interval_s = 0.5;  // at most one change per interval
  // The other lanes (batch work) tolerate a wait of other_wait_s (keep it
  // under their TTFT SLO): they need the completions that keep their queue,
  // growing at their arrival rate (over other_rate_window_s) for the
  // horizon, servable within that wait:
  //   (queue + rate * horizon) / (horizon + other_wait_s)
  // so a burst of them waits for seats rather than stretching every step.
  double other_wait_s = 20.0;
  // The other lanes' own TTFT target when the scheduler knows it (the
  // tightest of them, in seconds, not scaled with the SLO lanes' target; 0:
  // not known). They then wait up to other_wait_share of it in place of
  // other_wait_s: a batch lane with 30 s of slack that is served within 20 s
  // takes seats, and with them the SLO lanes' TPOT, that it could have left
  // for a trough (h200 without caching at 2.5 ms, tuning seeds 1-200: 178 ->
  // 188 of 200 at >= 0.95 of the best static cap; scheduler.md 7h). The
  // share leaves room for the fluid estimate's error.
  // Set from the replica's queue (ForQueue, scheduler/core/replica.h), not by a driver.
  double other_ttft_target_s = 0;
  double other_wait_share = 0.85;
  double other_rate_window_s = 30.0;
  double tie_share = 0.02;         // PlannerInputs::tie_share
  double reach_share = 0.25;       // PlannerInputs::reach_share
  double horizon_s = 5.0;          // PlannerInputs::horizon_s: how far ahead the rates are taken to hold
  // Completions before the first choice (output lengths). A handful: until
  // then the cap is a blind initial_num_seqs, which costs more than a noisy
  // estimate that the next choices, every adjust_interval_s, refine as the
  // window fills. At 20 the CPU-speed cells spent their first 5-15% at a
  // quarter of the bound, where every TPOT failed (cpu-0.5b tuning seeds
  // 1-16: 77/96 trace-cells at >= 0.95 of the best static cap with 20, 95/96
  // with 3; 1-5 give 94-95/96), and a 64-request run through the real stack
  // decided only at its end (docs/benchmarks/scheduler.md section 8). Three,
  // not one: the TPOT forecast averages over the reply lengths' spread.
  int32_t min_completions = 3;
  // The scheduler serves waiting requests already past their TTFT target after the rest
  // (SchedulerConfig::serve_late_last): PlannerInputs::late_last. Set from the replica's queue
  // (ForQueue, scheduler/core/replica.h), not by a driver.
  bool late_last = false;
};

struct ControllerOptions {
  ControllerMode mode = ControllerMode::kStatic;
  int32_t min_num_seqs = 1;
  int32_t max_num_seqs = 64;
  int32_t initial_num_seqs = 0;  // goodput mode's cap until the model has data; 0: max_num_seqs / 4
  LoadLevelOptions load;
  SloOptions slo;
  GoodputOptions goodput;
};

// What the service saw at one step, taken just before Plan.
struct StepObservation {
  double now_s = 0;
  int32_t num_running = 0;
  int32_t num_waiting = 0;
  double kv_usage = 0;             // used / total KV blocks, [0, 1]
  double last_step_s = 0;          // duration of the previous step (0: none)
  int32_t last_step_tokens = 0;    // tokens computed in the previous step
  int32_t last_step_seqs = 0;      // sequences in the previous step (0: num_running)
  int32_t num_arrivals = 0;        // requests added since the previous observation
  // Of those, the SLO lanes' (SloOptions::lanes); negative: not counted.
  int32_t num_arrivals_slo = -1;
  // Waiting requests of the SLO lanes; negative: not counted. With late_last, only those
  // that can still meet their TTFT target; the late ones are num_waiting_slo_late.
  int32_t num_waiting_slo = -1;
  int32_t num_waiting_slo_late = 0;
  int32_t num_preemptions = 0;     // preemptions since the previous observation
  int64_t kv_capacity_tokens = 0;  // KV pool size in tokens (0: unknown)
  int32_t max_num_batched_tokens = 0;  // the step's token budget (0: unknown)
  // Prefix caching is on: a preempted sequence's full blocks stay in the
  // cache, so it resumes mostly from them instead of recomputing its context.
  // The model modes may then fill the pool (SloOptions::kv_raise_limit).
  bool resumes_from_cache = false;
};

// One finished request.
struct RequestCompletion {
  double now_s = 0;
  double ttft_s = 0;
  double tpot_s = 0;  // (end - first token) / (output tokens - 1); 0 for one token
  std::string lane;
  int32_t num_tokens = 0;  // prompt + generated at the end: the KV it held (0: unknown)
  int32_t num_output_tokens = 0;  // generated (0: unknown)
  // Prompt tokens the prefix cache held at its first scheduling: the prompt
  // computed then is num_tokens - num_output_tokens - this.
  int32_t num_cached_tokens = 0;
};

// Room for a change's reason (PlanCap's is at most 560 bytes): reserved in every kept change and in the
// planner's choice once, so a change allocates nothing.
inline constexpr size_t kCapReasonRoom = 640;

struct CapChange {
  double time_s = 0;
  int32_t from = 0;
  int32_t to = 0;
  std::string level;   // load-level: the new level; goodput: "raise"/"cut"; admin: "admin"
  std::string reason;  // human-readable, with the numbers that triggered it
};

// The controller's state for metrics and the admin RPC.
struct ControllerStatus {
  ControllerMode mode = ControllerMode::kStatic;
  int32_t num_seqs = 0;
  std::string level;
  double ttft_p_s = 0;  // windowed percentile of the SLO lanes' completions (0 without samples)
  double tpot_p_s = 0;
  double arrival_rate_per_s = 0;
  uint64_t num_changes = 0;
  uint64_t num_plans = 0;  // model modes: times the goodput planner ran (each adjust interval with demand)
  bool held = false;  // an admin Set holds the cap (Controller::Set)
  // The model modes' latest regime (goodput_planner.h): "goodput",
  // "unreachable" or "no-targets"; static mode: "static".
  std::string regime;
};

// A value observed at a time: the controller's windows hold these.
struct TimedValue {
  double time_s;
  double value;
};

class CapMode;

class Controller {
 public:
  // Throws std::invalid_argument on min < 1, max < min, levels unsorted by
  // cap or empty, or a non-positive SLO target.
  explicit Controller(ControllerOptions options);
  // With a mode of the caller's in place of options.mode's registered one (a mode before its registration,
  // as controller_test's example); `models_steps` as CapModeEntry::models_steps.
  Controller(ControllerOptions options, std::unique_ptr<CapMode> mode, bool models_steps);
  ~Controller();
  Controller(Controller&&) noexcept;

  // Records a finished request (the model modes use it; static ignores it).
  void OnCompletion(const RequestCompletion& done);
  // Returns the cap for the next Plan. Observations must come in time order.
  int32_t Step(const StepObservation& obs);
  // Admin override: the cap becomes `num_seqs` clamped to [min, max]. With
  // `hold` it stays there until a Set without it (an operator's or a sweep's
  // exact cap; the model modes keep learning meanwhile); without, adaptive
  // modes continue from it. Static mode never moves it either way.
  void Set(int32_t num_seqs, double now_s, bool hold);

  int32_t num_seqs() const { return num_seqs_; }
  // goodput mode: the next Step at `now_s` may change the cap, so it reads
  // StepObservation::num_waiting_slo (a scan of the queue the caller can
  // skip on the other steps).
  bool ReadsQueueAt(double now_s) const;
  ControllerStatus status() const;
  // The latest changes (at most kKeptChanges), oldest first: the record is
  // bounded, as a scheduler runs for months and the model modes change the cap
  // every few seconds under a varying load (issue #53: it grew without end).
  // status().num_changes counts every change since construction.
  static constexpr size_t kKeptChanges = 256;
  const Ring<CapChange>& changes() const { return changes_; }
  // The changes since the previous call (for log lines, metrics and the
  // simulator's record); of more than kKeptChanges between calls, the latest.
  std::vector<CapChange> TakeChanges();
  const ControllerOptions& options() const { return options_; }
  // Seconds a computed prompt token costs by the latest step fit (StepCost), in every mode; 0 before
  // one. The queue order's late-last rule reads it (a request is late once its prefill no longer fits
  // in the time it has left).
  double PrefillSecondsPerToken() const { return step_cost_.latest() ? step_cost_.latest()->per_token_s : 0.0; }

 private:
  class Setter;
  void Change(double now_s, int32_t to, std::string_view level, std::string_view reason);
  double ArrivalRate(double now_s) const;

  ControllerOptions options_;
  bool models_steps_ = false;        // the mode's registration (CapModeEntry::models_steps)
  std::unique_ptr<CapMode> mode_;    // holds its own state
  int32_t num_seqs_ = 0;
  bool held_ = false;                // an admin Set holds the cap: the mode does not move it
  Ring<TimedValue> arrivals_;        // (time, count), every lane, over the longest window a mode reads
  StepCost step_cost_;               // every step, over slo.window_s; the model modes plan with its fit
  double last_fit_s_ = -1e300;       // when a mode without a step model last had the fit refreshed
  bool seen_step_ = false;
  double time_unit_s_ = 1;           // model modes: slo.ttft_target_s / kReferenceTtftS (options scaled by it)
  double first_step_s_ = 0;          // time of the first Step
  double last_step_s_ = 0;           // time of the latest Step
  Ring<CapChange> changes_;  // the latest kKeptChanges, their strings' room reserved once
  uint64_t num_changes_ = 0;       // since construction
  uint64_t num_taken_ = 0;         // of those, returned by TakeChanges
};

}  // namespace ferry::scheduler
