// One mode of the cap controller (issue #54; README.md "Modes"). The Controller (controller.h) keeps what
// every mode shares: the cap, an admin's hold, the record of changes and the arrivals it reports a rate of.
// It hands each completion and observation to the mode in force, which holds only its own state. Modes are
// registered by name in one table (modes/registry.cc: CapModes()), which the flags, the docs and the
// controller's names read.
#pragma once

#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "scheduler/cap/controller.h"
#include "scheduler/cap/step_cost.h"

namespace ferry::scheduler {

// What a mode reads of the controller, kept by the controller.
struct ControllerView {
  const ControllerOptions& options;  // as the controller scaled them (GoodputOptions' time unit)
  const Ring<TimedValue>& arrivals;  // every lane's arrivals (time, count), over the longest window a mode reads
  double first_step_s = 0;           // the first observation's time
  double time_unit_s = 1;            // 1, or a model mode's TTFT target / kReferenceTtftS
  int32_t num_seqs = 0;              // the cap in force
  StepCost& step_cost;               // the steps so far (the controller's; FitOfTheWindow updates its fit)

  // The rate of `d`'s values over the last `window_s`; until a whole window has passed, over the time
  // observed (at least one time unit: 1 s, or the model modes' TTFT target), since a rate over the full
  // window would start near zero and climb for its first window_s.
  double RateOver(const Ring<TimedValue>& d, double now_s, double window_s) const;
};

// How a mode changes the cap: to `to` (within the options' bounds) at now_s, with the level's name
// ("raise", "cut", a load level's) and the reason (with the numbers behind it).
class CapSetter {
 public:
  virtual void Change(double now_s, int32_t to, std::string_view level, std::string_view reason) = 0;

 protected:
  ~CapSetter() = default;
};

class CapMode {
 public:
  virtual ~CapMode() = default;
  // The cap before the first step (clamped to [min_num_seqs, max_num_seqs] by the controller).
  virtual int32_t InitialCap() const = 0;
  virtual void OnCompletion(const RequestCompletion&) {}
  // Every observation, also while an admin holds the cap (a mode keeps learning meanwhile).
  virtual void Observe(const StepObservation&, const ControllerView&) {}
  // An observation the mode may act on (no hold): it changes the cap through `cap`, if at all.
  virtual void Decide(const StepObservation&, const ControllerView&, CapSetter&) {}
  // An admin set the cap at now_s (Controller::Set).
  virtual void OnSet(double) {}
  // The next Decide at now_s may change the cap, so it reads StepObservation::num_waiting_slo.
  virtual bool ReadsQueueAt(double) const { return false; }
  // The mode's part of the status: level, regime, percentiles, plans.
  virtual void Report(ControllerStatus& status) const = 0;
};

// A mode's registration.
struct CapModeEntry {
  ControllerMode mode;
  std::string_view name;   // --controller-mode's value
  std::string_view alias;  // another value that selects it ("" for none)
  std::string_view summary;
  // It models steps: keeps its times in units of the TTFT target (GoodputOptions, kReferenceTtftS) and
  // needs each observation's StepObservation::last_step_seqs.
  bool models_steps = false;
  std::unique_ptr<CapMode> (*make)(const ControllerOptions& options) = nullptr;  // options as scaled
};

// Every registered mode.
std::span<const CapModeEntry> CapModes();
// The registration of `mode` (every ControllerMode has one).
const CapModeEntry& CapModeFor(ControllerMode mode);
// --controller-mode's values: every registered name and alias (ferry-scheduler, ferry-sim, ferry-launch).
std::vector<std::string> ControllerModeValues();

}  // namespace ferry::scheduler
