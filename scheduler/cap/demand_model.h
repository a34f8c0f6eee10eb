// What the model modes (goodput, load-level) measure and hand to the goodput planner (goodput_planner.h):
// the window of completions (reply lengths, TTFT and TPOT, the KV a sequence holds), the SLO lanes'
// arrivals, and the planner's inputs and workspace (the step-time fit is the controller's StepCost), kept from plan to plan so that an
// adjustment allocates nothing (issue #53). Each model mode owns one; the static mode has none. Pure, like
// the rest of the controller.
#pragma once

#include <cstdint>
#include <optional>
#include <vector>

#include "scheduler/cap/cap_mode.h"
#include "scheduler/cap/goodput_planner.h"

namespace ferry::scheduler {

class DemandModel {
 public:
  explicit DemandModel(const ControllerOptions& options);  // options as the controller scaled them

  void OnCompletion(const RequestCompletion& done);
  // Every observation: the SLO lanes' arrivals, the step, the preemptions; drops what left the windows.
  void Observe(const StepObservation& obs);
  // The adjust interval has passed since the latest adjustment (or admin Set).
  bool Due(double now_s) const { return now_s - last_adjust_s_ >= options_.goodput.adjust_interval_s; }
  void Adjusted(double now_s) { last_adjust_s_ = now_s; }
  // An admin set the cap: the interval restarts, and the reported percentiles described the cap it replaced.
  void OnSet(double now_s);
  // Completions in the window (every lane).
  size_t num_completions() const { return outputs_.size(); }
  // Fills inputs() for the planner from the window and `obs`; false when there is nothing to plan with
  // (too few completions, no step yet, or no demand).
  bool ModelInputs(const StepObservation& obs, const ControllerView& view);
  PlannerInputs& inputs() { return inputs_; }
  // The planner's choice for inputs() (with the previous plan's regime and drain) from `current_cap`.
  const PlannerChoice& Plan(int32_t current_cap);
  PlanRegime regime() const { return regime_; }
  // The percentiles, the plans made and the regime, into `status`.
  void Report(ControllerStatus& status) const;

 private:
  // The highest cap the KV pool allows (SloOptions::kv_raise_limit).
  int32_t KvRaiseLimit(const StepObservation& obs) const;
  // Nearest-rank percentile of the window's values (0 when empty), sorted in scratch_.
  double PercentileOf(const Ring<TimedValue>& d, double pct);
  bool CountsLane(const std::string& lane) const;
  void Expire(double now_s);

  const ControllerOptions options_;  // as the controller scaled them
  double last_adjust_s_ = -1e300;
  Ring<TimedValue> slo_arrivals_;  // (time, count) of the SLO lanes
  Ring<TimedValue> outputs_;       // (completion time, output tokens), every lane
  Ring<TimedValue> slo_outputs_;   // (completion time, output tokens), SLO lanes
  Ring<TimedValue> prompts_;       // (completion time, prompt tokens computed at admission), every lane
  Ring<TimedValue> ttft_;          // (completion time, ttft), SLO lanes
  Ring<TimedValue> tpot_;
  // KV held by a running sequence (OnCompletion), every lane: (completion time, weight * held tokens) and
  // (completion time, weight).
  Ring<TimedValue> held_weighted_;
  Ring<TimedValue> held_weights_;
  int32_t preemptions_since_adjust_ = 0;
  bool draining_ = false;             // the latest plan drained (PlannerInputs::draining)
  PlanRegime regime_ = PlanRegime::kGoodput;  // the latest plan's
  double ttft_p_s_ = 0;
  double tpot_p_s_ = 0;
  uint64_t num_plans_ = 0;  // PlanCap calls since construction
  PlannerInputs inputs_;
  PlanWorkspace plan_;
  std::vector<double> scratch_;
};

}  // namespace ferry::scheduler
