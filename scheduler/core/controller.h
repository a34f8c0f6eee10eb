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
// Modes:
//   static      cap = max_num_seqs (or the last Set()).
//   load-level  named levels, each with a cap; the level is the one the
//               goodput model below predicts serves best.
//   slo         targets a percentile of TTFT and TPOT over a sliding window;
//               raises the cap while the targets hold and work waits behind a
//               full cap (never past the cap whose predicted step time meets
//               the TPOT target, nor past what the KV pool holds), cuts it
//               when TPOT or KV pressure says the batch is too large. While
//               the queue builds (its oldest request has waited half the
//               TTFT target) raises spend the headroom up to the TPOT target.
//               When the cap that meets the TPOT target does not keep up with
//               the arrivals (TTFT missed in the queue behind it), keeping up
//               comes first. After a change only completions that follow it
//               count. See controller.cc for the rules.
//   goodput     model-based (goodput_planner.h): fits step time to the
//               batch online from the steps it observes, measures the
//               demand per lane class, output lengths and the TPOT spread,
//               and sets the cap that maximises expected goodput: the SLO
//               lanes' requests that meet the targets plus the other lanes'
//               throughput. No preset: the same on the CPU engine, a GPU or
//               the sim backend.
#pragma once

#include <cstdint>
#include <deque>
#include <optional>
#include <string>
#include <vector>

#include "scheduler/core/goodput_planner.h"
#include "scheduler/core/step_time_model.h"

namespace ferry::scheduler {

enum class ControllerMode { kStatic, kLoadLevel, kSlo, kGoodput };

const char* ControllerModeName(ControllerMode mode);
// "static", "load-level", "slo", "goodput"; throws std::invalid_argument otherwise.
ControllerMode ParseControllerMode(const std::string& name);

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

struct SloOptions {
  double ttft_target_s = 1.0;
  double tpot_target_s = 0.050;
  double percentile = 95.0;
  double window_s = 20.0;          // completions and steps older than this are dropped
  int32_t min_samples = 20;        // completions needed before the TTFT/TPOT percentiles count
  // A request's TPOT is the mean of the steps it ran in, so the mean duration
  // of the latest steps predicts the TPOT of the batch now running, long
  // before its requests complete. About the steps of one chat reply: a
  // shorter window chases the prefill burst that every raise admits.
  int32_t step_window = 256;
  // Raises aim the predicted mean step time at this share of the TPOT target
  // (and the TPOT percentile at half the gap): the percentile of per-request
  // TPOT sits above the mean step time, and the gap between raising and
  // cutting keeps the cap from flapping.
  double raise_headroom = 0.85;
  // While a request of the counted lanes has waited longer than
  // queue_wait_share of the TTFT target (StepObservation::oldest_wait_s),
  // raises aim at queue_headroom of the TPOT target instead: a queue that
  // builds costs TTFT misses soon, the headroom only margin.
  double queue_wait_share = 0.5;
  double queue_headroom = 0.95;
  double adjust_interval_s = 0.5;  // at most one change per interval
  double decrease_factor = 0.75;   // multiplicative decrease
  int32_t increase_step = 0;       // additive increase; 0: max(1, cap / 8)
  // Without prefix caching a preemption recomputes the victim's context, so
  // the pool is kept below full: usage above kv_high_usage, or a preemption,
  // cuts the cap; raises stop while usage is at kv_raise_limit, and at the
  // sequences that share of the pool holds at the mean final context of
  // recent completions (every lane). With it (resumes_from_cache) a resume
  // mostly hits the cache: only preemptions cut, and raises stop at the
  // sequences the whole pool holds at the KV the running ones hold now
  // (prefix-shared blocks counted once, decodes part-way through).
  double kv_high_usage = 0.92;
  double kv_raise_limit = 0.85;
  // Only completions of these lanes count toward the targets (empty: all).
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
  double other_rate_window_s = 30.0;
  double tie_share = 0.02;         // PlannerInputs::tie_share
  double horizon_s = 5.0;          // PlannerInputs::horizon_s: how far ahead the rates are taken to hold
  int32_t min_completions = 20;    // before the first choice (output lengths)
};

struct ControllerOptions {
  ControllerMode mode = ControllerMode::kStatic;
  int32_t min_num_seqs = 1;
  int32_t max_num_seqs = 64;
  int32_t initial_num_seqs = 0;  // slo mode's starting cap; 0: max_num_seqs / 4
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
  // Waiting requests of the SLO lanes; negative: not counted.
  int32_t num_waiting_slo = -1;
  int32_t num_preemptions = 0;     // preemptions since the previous observation
  int64_t kv_capacity_tokens = 0;  // KV pool size in tokens (0: unknown)
  int32_t max_num_batched_tokens = 0;  // the step's token budget (0: unknown)
  // How long the oldest waiting request with no token yet, of the lanes the
  // SLO counts (SloOptions::lanes), has waited: a TTFT being spent now, which
  // completions report only after the request ends. 0 when none waits;
  // negative when unknown (slo then reads the queue from completions alone).
  double oldest_wait_s = -1;
  // Prefix caching is on: a preempted sequence's full blocks stay in the
  // cache, so it resumes mostly from them instead of recomputing its context.
  // slo then fills the pool (see kv_high_usage and kv_raise_limit).
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
};

struct CapChange {
  double time_s = 0;
  int32_t from = 0;
  int32_t to = 0;
  std::string level;   // load-level: the new level; slo: "raise"/"cut"; admin: "admin"
  std::string reason;  // human-readable, with the numbers that triggered it
};

// The controller's state for metrics and the admin RPC.
struct ControllerStatus {
  ControllerMode mode = ControllerMode::kStatic;
  int32_t num_seqs = 0;
  std::string level;
  double ttft_p_s = 0;  // windowed percentile (slo mode; 0 without samples)
  double tpot_p_s = 0;
  double arrival_rate_per_s = 0;
  uint64_t num_changes = 0;
};

class Controller {
 public:
  // Throws std::invalid_argument on min < 1, max < min, levels unsorted by
  // cap or empty, or a non-positive SLO target.
  explicit Controller(ControllerOptions options);

  // Records a finished request (slo mode uses it; others ignore it).
  void OnCompletion(const RequestCompletion& done);
  // Returns the cap for the next Plan. Observations must come in time order.
  int32_t Step(const StepObservation& obs);
  // Admin override: the cap becomes `num_seqs` clamped to [min, max], and in
  // static mode stays there; adaptive modes continue from it.
  void Set(int32_t num_seqs, double now_s);

  int32_t num_seqs() const { return num_seqs_; }
  // goodput mode: the next Step at `now_s` may change the cap, so it reads
  // StepObservation::num_waiting_slo (a scan of the queue the caller can
  // skip on the other steps).
  bool ReadsQueueAt(double now_s) const {
    return UsesModel() && now_s - last_adjust_s_ >= options_.goodput.adjust_interval_s;
  }
  ControllerStatus status() const;
  // Every change since construction, oldest first.
  const std::vector<CapChange>& changes() const { return changes_; }
  // The changes not yet taken (for log lines); clears that list.
  std::vector<CapChange> TakeChanges();
  const ControllerOptions& options() const { return options_; }

 private:
  struct TimedValue {
    double time_s;
    double value;
  };
  void Change(double now_s, int32_t to, std::string level, std::string reason);
  void StepLoadLevel(const StepObservation& obs);
  void StepSlo(const StepObservation& obs);
  void StepGoodput(const StepObservation& obs);
  // What the goodput model plans with, from the window; empty until enough
  // completions and steps have been seen (controller_model.cc).
  std::optional<PlannerInputs> ModelInputs(const StepObservation& obs);
  bool UsesModel() const {
    return options_.mode == ControllerMode::kGoodput || options_.mode == ControllerMode::kLoadLevel;
  }
  // The batch an adjustment judges: its seats, the mean of its steps, and the
  // fitted cost of one more sequence (taken once per adjustment).
  struct Batch {
    int32_t running = 1;
    double step_mean_s = 0;
    std::optional<double> per_seq_s;
  };
  void MaybeRaise(const StepObservation& obs, const Batch& batch);
  // The highest cap a raise may reach: what the KV pool holds and what keeps
  // the predicted step time within the TPOT target (with raise_headroom, or
  // queue_headroom while the queue builds).
  int32_t RaiseLimit(const StepObservation& obs, const Batch& batch) const;
  // Requests of the counted lanes wait longer than queue_wait_share of the
  // TTFT target (or, without oldest_wait_s, completions miss it).
  bool IsQueueBuilding(const StepObservation& obs) const;
  // The part of RaiseLimit that the KV pool sets.
  int32_t KvRaiseLimit(const StepObservation& obs) const;
  // Requests miss the TTFT target while work waits behind a full cap: the
  // TTFT percentile of completions, or the oldest waiting request, is over it.
  bool IsBacklogged(const StepObservation& obs) const;
  void RaiseForBacklog(const StepObservation& obs, const Batch& batch);
  // One seat above the cap a backlog raise left, scaled down with the
  // arrival rate since (0: none): TPOT cuts stop there.
  int32_t KeepUpFloor(double now_s) const;
  double ArrivalRate(double now_s) const;
  // Nearest-rank percentile of the window's values (0 when empty).
  static double PercentileOf(const std::deque<TimedValue>& d, double pct);
  // Arrivals in `d` over the last `window_s` (over the time observed, at least 1 s, until then).
  double RateOver(const std::deque<TimedValue>& d, double now_s, double window_s) const;
  void Expire(double now_s);
  // Seats at which the predicted mean step time reaches `target_s`, when the
  // batch's steps now take `now_s` (fractional, at most max_num_seqs).
  double SeatsFor(const Batch& batch, double target_s, double now_s) const;
  // The completions and steps so far describe the cap before a change: stop
  // judging the new cap by them (the step-time fit keeps them: it needs
  // steps of many batch sizes).
  void ForgetPastCap();
  bool CountsLane(const std::string& lane) const;

  ControllerOptions options_;
  int32_t num_seqs_ = 0;
  size_t level_ = 0;
  double last_adjust_s_ = -1e300;
  std::deque<TimedValue> arrivals_;  // (time, count)
  std::deque<TimedValue> slo_arrivals_;  // (time, count) of the SLO lanes (goodput mode)
  std::deque<TimedValue> outputs_;   // (completion time, output tokens), every lane (goodput mode)
  std::optional<StepFit> last_fit_;  // goodput mode: the latest fit (a full cap stops the batch varying)
  std::deque<TimedValue> slo_outputs_;  // (completion time, output tokens), SLO lanes (goodput mode)
  bool seen_step_ = false;
  double time_unit_s_ = 1;           // model modes: slo.ttft_target_s / kReferenceTtftS (options scaled by it)
  double first_step_s_ = 0;          // time of the first Step
  double last_step_s_ = 0;           // time of the latest Step
  std::deque<TimedValue> ttft_;      // (completion time, ttft)
  std::deque<TimedValue> tpot_;
  StepTimeModel steps_;              // the fit spans cap changes: it needs their variety
  int32_t steps_since_change_ = 0;
  static constexpr int32_t kMinStepsToJudge = 16;
  // KV held by a running sequence (OnCompletion), every lane: (completion
  // time, weight * held tokens) and (completion time, weight).
  std::deque<TimedValue> held_weighted_;
  std::deque<TimedValue> held_weights_;
  int32_t preemptions_since_adjust_ = 0;
  int32_t keep_up_seats_ = 0;
  bool in_backlog_ = false;  // the latest adjustment was a backlog raise
  double keep_up_rate_ = 0;
  double ttft_p_s_ = 0;
  double tpot_p_s_ = 0;
  std::vector<CapChange> changes_;
  size_t num_taken_ = 0;
};

}  // namespace ferry::scheduler
