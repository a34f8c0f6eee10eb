#include "scheduler/core/step_time_model.h"

#include <algorithm>
#include <cmath>

namespace ferry::scheduler {

void StepTimeModel::Add(double now_s, double duration_s, int32_t seqs, int32_t tokens) {
  if (size_ == ring_.size()) {  // full: twice the room, oldest first from slot 0
    std::vector<Step> bigger(std::max<size_t>(16, 2 * ring_.size()));
    for (size_t i = 0; i < size_; ++i) bigger[i] = at(i);
    ring_.swap(bigger);
    head_ = 0;
  }
  ring_[(head_ + size_) & (ring_.size() - 1)] =
      Step{now_s, duration_s, static_cast<double>(seqs), static_cast<double>(tokens)};
  ++size_;
}

void StepTimeModel::Expire(double from_s) {
  while (size_ > 0 && at(0).time_s < from_s) {
    head_ = (head_ + 1) & (ring_.size() - 1);
    --size_;
  }
}

double StepTimeModel::RecentMeanOf(size_t n, double Step::*field) const {
  n = std::min(n, size_);
  if (n == 0) return 0.0;
  double sum = 0;
  for (size_t i = size_ - n; i < size_; ++i) sum += at(i).*field;
  return sum / static_cast<double>(n);
}

double StepTimeModel::RecentMean(size_t n) const { return RecentMeanOf(n, &Step::duration_s); }

double StepTimeModel::RecentTokensMean(size_t n) const { return RecentMeanOf(n, &Step::tokens); }

StepTimeModel::Moments StepTimeModel::CentredMoments() const {
  // Centred normal equations of y = a + b x1 + c x2 (x1 seqs, x2 tokens).
  Moments m;
  const double n = static_cast<double>(size_);
  for (size_t i = 0; i < size_; ++i) m.m1 += at(i).seqs, m.m2 += at(i).tokens, m.my += at(i).duration_s;
  m.m1 /= n, m.m2 /= n, m.my /= n;
  for (size_t i = 0; i < size_; ++i) {
    const double d1 = at(i).seqs - m.m1, d2 = at(i).tokens - m.m2, dy = at(i).duration_s - m.my;
    m.s11 += d1 * d1, m.s22 += d2 * d2, m.s12 += d1 * d2, m.s1y += d1 * dy, m.s2y += d2 * dy;
  }
  return m;
}

std::optional<double> StepTimeModel::MarginalSeqCost(size_t min_steps) const {
  if (size_ < std::max<size_t>(min_steps, 3)) return std::nullopt;
  const Moments m = CentredMoments();
  // The sequence count must vary (a standard deviation of half a sequence).
  if (m.s11 < static_cast<double>(size_) * 0.25) return std::nullopt;
  const double det = m.s11 * m.s22 - m.s12 * m.s12;
  double cost = 0;
  if (det <= 1e-6 * m.s11 * m.s22) {
    // Tokens move with sequences (a window of pure decode steps has tokens ==
    // seqs): the slope on sequences alone is already b + c.
    cost = m.s1y / m.s11;
  } else {
    const double b = (m.s1y * m.s22 - m.s2y * m.s12) / det;
    const double c = (m.s2y * m.s11 - m.s1y * m.s12) / det;
    cost = b + c;
  }
  if (!std::isfinite(cost) || cost <= 0) return std::nullopt;
  return cost;
}

double StepTimeModel::TokensPerSeq() const {
  double seqs = 0, tokens = 0;
  for (size_t i = 0; i < size_; ++i) seqs += at(i).seqs, tokens += at(i).tokens;
  return seqs > 0 ? tokens / seqs : 0.0;
}

std::optional<StepFit> StepTimeModel::Fit(size_t min_steps) const {
  if (size_ < std::max<size_t>(min_steps, 3)) return std::nullopt;
  const Moments m = CentredMoments();
  if (m.s11 < static_cast<double>(size_) * 0.25) return std::nullopt;  // the sequence count must vary
  const double det = m.s11 * m.s22 - m.s12 * m.s12;
  const bool separable = det > 1e-6 * m.s11 * m.s22;
  double b = separable ? (m.s1y * m.s22 - m.s2y * m.s12) / det : 0;
  double c = separable ? (m.s2y * m.s11 - m.s1y * m.s12) / det : 0;
  // Collinear, or a negative slope: one regressor alone (the one that
  // explains the steps with a non-negative slope; sequences first).
  if (!separable || b < 0 || c < 0) {
    b = m.s1y > 0 ? m.s1y / m.s11 : 0;
    c = m.s1y <= 0 && m.s22 > 0 && m.s2y > 0 ? m.s2y / m.s22 : 0;
  }
  StepFit fit;
  fit.per_seq_s = b;
  fit.per_token_s = c;
  fit.fixed_s = std::max(0.0, m.my - b * m.m1 - c * m.m2);
  const double predicted = fit.Seconds(m.m1, m.m2);
  if (!std::isfinite(predicted) || predicted <= 0 || std::abs(predicted - m.my) > 0.5 * m.my) return std::nullopt;
  return fit;
}

}  // namespace ferry::scheduler
