// What the recent engine steps say about step time, for the slo controller:
// the mean of the latest steps (which per-request TPOT follows) and the
// marginal cost of one more running sequence, fitted by least squares
//   step_s ~ a + b * seqs + c * tokens
// over a sliding window. One more decoding sequence adds a seat and a token
// to every step, so it costs b + c. Pure: times are passed in.
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
  // Seconds one more running sequence adds to a step (b + c above; the slope
  // on sequences alone when tokens move with them). Empty with fewer than
  // `min_steps` steps, when the sequence count hardly varies (standard
  // deviation under half a sequence), or when the fit is not positive.
  std::optional<double> MarginalSeqCost(size_t min_steps = 64) const;
  // The whole fit, for predicting other batch shapes: least squares with
  // every coefficient non-negative (a negative one, from collinear seqs and
  // tokens or noise, is held at 0 and the rest refitted; the constant too,
  // so such a fit runs through the origin). Empty like MarginalSeqCost, or
  // when the fit does not predict the window's mean step within 50%.
  std::optional<StepFit> Fit(size_t min_steps = 64) const;
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
