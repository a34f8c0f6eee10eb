// load-level: named levels, each a cap (LoadLevelOptions); the level is the one the goodput planner,
// offered the levels' caps only, predicts serves best, from the same model of demand and step time as the
// goodput mode (demand_model.h).
#include <algorithm>

#include "scheduler/cap/demand_model.h"
#include "scheduler/cap/modes/modes.h"

namespace ferry::scheduler {
namespace {

class LoadLevelMode final : public CapMode {
 public:
  explicit LoadLevelMode(const ControllerOptions& options) : options_(options), model_(options) {
    // The level nearest a quarter of the bound (goodput's start) until the model has data.
    const auto& levels = options_.load.levels;
    for (level_ = 0; level_ + 1 < levels.size() && levels[level_ + 1].num_seqs <= options_.max_num_seqs / 4;) ++level_;
    if (!options_.slo.targets_stated) level_ = levels.size() - 1;  // kNoTargets: the top level
  }

  int32_t InitialCap() const override { return options_.load.levels[level_].num_seqs; }
  void OnCompletion(const RequestCompletion& done) override { model_.OnCompletion(done); }
  void Observe(const StepObservation& obs, const ControllerView&) override { model_.Observe(obs); }
  void OnSet(double now_s) override { model_.OnSet(now_s); }
  bool ReadsQueueAt(double now_s) const override { return model_.Due(now_s); }
  void Report(ControllerStatus& status) const override {
    model_.Report(status);
    status.level = options_.load.levels[level_].name;
  }

  void Decide(const StepObservation& obs, const ControllerView& view, CapSetter& cap) override {
    if (!model_.Due(obs.now_s)) return;
    if (!model_.ModelInputs(obs, view)) return;
    PlannerInputs& in = model_.inputs();
    model_.Adjusted(obs.now_s);
    const auto& levels = options_.load.levels;
    for (const LoadLevel& l : levels) in.candidates.push_back(l.num_seqs);
    // The pool may bound every level above the smallest: that one stays a choice.
    in.max_num_seqs = std::max(in.max_num_seqs, std::min(levels.front().num_seqs, options_.max_num_seqs));
    in.min_num_seqs = std::min(in.min_num_seqs, levels.front().num_seqs);
    const PlannerChoice& choice = model_.Plan(view.num_seqs);
    size_t target = 0;
    while (target + 1 < levels.size() && levels[target].num_seqs != choice.cap) ++target;
    if (target == level_) return;
    level_ = target;
    cap.Change(obs.now_s, std::clamp(levels[target].num_seqs, options_.min_num_seqs, options_.max_num_seqs),
               levels[target].name, choice.reason);
  }

 private:
  const ControllerOptions options_;
  DemandModel model_;
  size_t level_ = 0;  // into options_.load.levels
};

}  // namespace

std::unique_ptr<CapMode> MakeLoadLevel(const ControllerOptions& options) {
  return std::make_unique<LoadLevelMode>(options);
}

}  // namespace ferry::scheduler
