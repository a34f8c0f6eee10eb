#include "scheduler/cap/step_cost.h"

namespace ferry::scheduler {

std::optional<StepFit> StepCost::FitOfTheWindow() {
  const double step_mean = steps_.RecentMean(steps_.size());
  const double tokens_per_step = steps_.RecentTokensMean(steps_.size());
  if (step_mean <= 0 || tokens_per_step <= 0) return std::nullopt;
  if (std::optional<StepFit> fit = steps_.Fit()) {
    last_fit_ = fit;
    fit_has_seqs_ = true;
  } else if (!fit_has_seqs_) {
    if (std::optional<StepFit> one = steps_.FitAtOneBatchSize()) last_fit_ = one;
  }
  return last_fit_ ? *last_fit_ : StepFit{0, 0, step_mean / tokens_per_step};
}

}  // namespace ferry::scheduler
