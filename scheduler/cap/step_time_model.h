// What the recent engine steps say about step time, for the goodput
// controller: the mean of the latest steps and a least-squares fit
//   step_s ~ a + b * seqs + c * tokens
// over a sliding window, which predicts other batch shapes (one more decoding
// sequence adds a seat and a token to every step: b + c). Pure: times are
// passed in.
#pragma once

#include <cstddef>
#include <cstdint>
#include <optional>
#include <vector>

namespace ferry::scheduler {

// step_s ~ fixed_s + per_seq_s * seqs + per_token_s * tokens.
struct StepFit {
  double fixed_s = 0;
  double per_seq_s = 0;
  double per_token_s = 0;
  double Seconds(double seqs, double tokens) const { return fixed_s + per_seq_s * seqs + per_token_s * tokens; }
};

class StepTimeModel {
 public:
  // A step of `duration_s` that computed `tokens` tokens for `seqs` sequences.
  void Add(double now_s, double duration_s, int32_t seqs, int32_t tokens);
  // Drops steps that ended before `from_s`.
  void Expire(double from_s);
  size_t size() const { return size_; }

  // Mean duration of the latest `n` steps (0 without steps).
  double RecentMean(size_t n) const;
  // Mean tokens of the latest `n` steps (0 without steps).
  double RecentTokensMean(size_t n) const;
  // The whole fit, for predicting other batch shapes: least squares with
  // every coefficient non-negative (a negative one, from collinear seqs and
  // tokens or noise, is held at 0 and the rest refitted; the constant too,
  // so such a fit runs through the origin). Empty with fewer than
  // `min_steps` steps, when the sequence count hardly varies (standard
  // deviation under half a sequence), or when the fit does not predict the
  // window's mean step within 50%.
  std::optional<StepFit> Fit(size_t min_steps = 64) const;
  // For a window where the batch size hardly varies (a cap of one, or a
  // light load): step_s ~ fixed_s + per_token_s * tokens, per_seq_s = 0, from
  // the tokens that vary between prefill and decode steps. The constant holds
  // the seats' cost at this batch, so more seats are predicted to cost only
  // their tokens: an optimistic guess, which lets a cap grow until the batch
  // varies and Fit() can measure what a seat costs. Empty with fewer than
  // `min_steps` steps, when the tokens hardly vary, or like Fit() when the
  // fit misses the window's mean.
  std::optional<StepFit> FitAtOneBatchSize(size_t min_steps = 64) const;
  // Tokens computed per sequence-step over the window (1 for pure decode;
  // prefill chunks raise it): sum of tokens / sum of seqs. 0 without steps.
  double TokensPerSeq() const;

 private:
  struct Step {
    double time_s;
    double duration_s;
    double seqs;
    double tokens;
  };
  // Means and centred second moments of seqs (1), tokens (2) and duration (y).
  struct Moments {
    double m1 = 0, m2 = 0, my = 0;
    double s11 = 0, s22 = 0, s12 = 0, s1y = 0, s2y = 0, syy = 0;
  };
  Moments CentredMoments() const;
  // Non-negative least squares (see Fit) over the regressor subsets given,
  // bits 0/1/2 for the constant, seqs and tokens, in order of preference.
  std::optional<StepFit> BestFit(const Moments& m, const int* subsets, size_t num_subsets) const;
  double RecentMeanOf(size_t n, double Step::*field) const;
  // The i-th step of the window, oldest first.
  const Step& at(size_t i) const { return ring_[(head_ + i) & (ring_.size() - 1)]; }

  // The window, a ring (its size a power of two) that keeps its storage: a step added allocates
  // nothing once the window has reached its length (#26; a deque allocated every 16 steps).
  std::vector<Step> ring_;
  size_t head_ = 0;
  size_t size_ = 0;
};

}  // namespace ferry::scheduler
