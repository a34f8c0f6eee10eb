// goodput: the cap with the most expected goodput (goodput_planner.h), from the model of demand and step
// time the mode measures (demand_model.h); every adjust interval once a few completions are in, and a cold
// start bounded by the decode step's cost before that.
#include <cstdio>

#include "scheduler/cap/demand_model.h"
#include "scheduler/cap/modes/modes.h"

namespace ferry::scheduler {
namespace {

class Goodput final : public CapMode {
 public:
  explicit Goodput(const ControllerOptions& options) : options_(options), model_(options) {}

  // Without targets the cap starts where it stays, at the bound (kNoTargets); with them a quarter of it
  // until the model has data.
  int32_t InitialCap() const override {
    return options_.initial_num_seqs > 0 ? options_.initial_num_seqs
           : options_.slo.targets_stated ? options_.max_num_seqs / 4
                                         : options_.max_num_seqs;
  }
  void OnCompletion(const RequestCompletion& done) override { model_.OnCompletion(done); }
  void Observe(const StepObservation& obs, const ControllerView&) override { model_.Observe(obs); }
  void OnSet(double now_s) override { model_.OnSet(now_s); }
  bool ReadsQueueAt(double now_s) const override { return model_.Due(now_s); }
  void Report(ControllerStatus& status) const override { model_.Report(status); }

  void Decide(const StepObservation& obs, const ControllerView& view, CapSetter& cap) override {
    if (!model_.Due(obs.now_s)) return;
    if (static_cast<int32_t>(model_.num_completions()) < options_.goodput.min_completions) {
      return ColdStartBound(obs, view, cap);
    }
    if (!model_.ModelInputs(obs, view)) return;
    model_.Adjusted(obs.now_s);
    const int32_t now_cap = view.num_seqs;
    const PlannerChoice& choice = model_.Plan(now_cap);
    // A raise of a sixteenth of the cap or less is noise in the window's
    // estimates (it flaps at a TPOT bound that falls between two caps); cuts
    // are always taken.
    if (choice.cap == now_cap || (choice.cap > now_cap && choice.cap - now_cap <= now_cap / 16)) return;
    cap.Change(obs.now_s, choice.cap, choice.cap > now_cap ? "raise" : "cut", choice.reason);
  }

 private:
  void ColdStartBound(const StepObservation& obs, const ControllerView& view, CapSetter& setter);

  const ControllerOptions options_;
  DemandModel model_;
};

// Before the model's first choice (GoodputOptions::min_completions) the
// cap is a blind quarter of the bound: no reply length is known, so no
// completion rate or goodput. One thing is known from the first steps: what
// a decode step costs. A cap whose pure-decode step already misses the TPOT
// target fails every request it admits, whatever the lengths, so the start
// is cut to the largest cap whose decode step meets it (by the fit so far,
// optimistic until the batch has varied). On the CPU engine at 50 ms that
// is 4-6 sequences, not 16: with long RAG prompts a cold start at 16 failed
// every TPOT for the first 170 s of a 1,500 s trace (cpu-0.5b tuning seed
// 61). On a GPU a decode step at a quarter of the bound meets the target,
// and nothing changes.
void Goodput::ColdStartBound(const StepObservation& obs, const ControllerView& view, CapSetter& setter) {
  if (!options_.slo.targets_stated || options_.slo.tpot_target_s <= 0) return;
  const std::optional<StepFit> fitted = view.step_cost.FitOfTheWindow();
  if (!fitted) return;
  const StepFit& fit = *fitted;
  if (fit.fixed_s <= 0 && fit.per_seq_s <= 0) return;  // the tokens' share: no step cost per sequence known yet
  model_.Adjusted(obs.now_s);
  const int32_t num_seqs = view.num_seqs;
  int32_t cap = num_seqs;
  while (cap > options_.min_num_seqs && fit.Seconds(cap, cap) > options_.slo.tpot_target_s) --cap;
  if (cap >= num_seqs) return;  // only cuts: the fit is refined as steps come
  char buf[200];
  std::snprintf(buf, sizeof(buf),
                "[goodput] cold start: a decode step of %d sequences takes %.2f ms by the fit so far (%.3f ms + "
                "%.1f us/seq + %.2f us/token), over the %.2f ms TPOT",
                num_seqs, 1e3 * fit.Seconds(num_seqs, num_seqs), 1e3 * fit.fixed_s, 1e6 * fit.per_seq_s,
                1e6 * fit.per_token_s, 1e3 * options_.slo.tpot_target_s);
  setter.Change(obs.now_s, cap, "cut", buf);
}

}  // namespace

std::unique_ptr<CapMode> MakeGoodput(const ControllerOptions& options) { return std::make_unique<Goodput>(options); }

}  // namespace ferry::scheduler
