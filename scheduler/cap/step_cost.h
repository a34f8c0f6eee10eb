// What the engine's steps cost, measured once for the controller and every reader of it: the window of
// steps (StepTimeModel) and the fit planned with, kept when the batch stops varying. The controller owns
// one and feeds it every step in every mode; the model modes plan with it (DemandModel), and the queue
// order reads a prompt token's cost from it (QueueOrder::SetPrefillSecondsPerToken). Pure: times are
// passed in.
#pragma once

#include <cstdint>
#include <optional>

#include "scheduler/cap/step_time_model.h"

namespace ferry::scheduler {

class StepCost {
 public:
  // A step of `duration_s` that computed `tokens` tokens for `seqs` sequences, ended at now_s.
  void Add(double now_s, double duration_s, int32_t seqs, int32_t tokens) { steps_.Add(now_s, duration_s, seqs, tokens); }
  void Expire(double from_s) { steps_.Expire(from_s); }
  size_t size() const { return steps_.size(); }
  // Tokens per sequence-step over the window (StepTimeModel::TokensPerSeq).
  double TokensPerSeq() const { return steps_.TokensPerSeq(); }

  // The fit to plan with now, over the window's steps (updates latest()); empty before a step with tokens.
  // The batch must have varied for a whole fit (it does on its own as requests come and go below the
  // cap). A cap that stays full stops it varying: the latest fit stands in. Until the first such fit,
  // the fit at one batch size (a seat costs its tokens only; optimistic); before that, the tokens' share
  // of the mean step. Step time in proportion to the tokens, that last guess, is a trap if kept: it
  // makes a step's fixed part grow with the batch, so no cap completes more than another, a small one
  // wins on TPOT, and the batch never varies enough for a fit (tuning seed 115: cap 1 for a minute of
  // rising load, 0.30 of the best static cap).
  std::optional<StepFit> FitOfTheWindow();
  // The fit the latest FitOfTheWindow() kept (not the tokens' share); empty before one.
  const std::optional<StepFit>& latest() const { return last_fit_; }

 private:
  StepTimeModel steps_;               // the fit spans cap changes: it needs their variety
  std::optional<StepFit> last_fit_;   // the latest fit (a full cap stops the batch varying)
  bool fit_has_seqs_ = false;         // last_fit_ came from Fit() (a batch that varied), not FitAtOneBatchSize()
};

}  // namespace ferry::scheduler
