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

double StepTimeModel::RecentMean(size_t n) const {
  n = std::min(n, size_);
  if (n == 0) return 0.0;
  double sum = 0;
  for (size_t i = size_ - n; i < size_; ++i) sum += at(i).duration_s;
  return sum / static_cast<double>(n);
}

double StepTimeModel::RecentTokensMean(size_t n) const {
  n = std::min(n, size_);
  if (n == 0) return 0.0;
  double sum = 0;
  for (size_t i = size_ - n; i < size_; ++i) sum += at(i).tokens;
  return sum / static_cast<double>(n);
}

std::optional<double> StepTimeModel::MarginalSeqCost(size_t min_steps) const {
  if (size_ < std::max<size_t>(min_steps, 3)) return std::nullopt;
  // Centred normal equations of y = a + b x1 + c x2.
  const double n = static_cast<double>(size_);
  double m1 = 0, m2 = 0, my = 0;
  for (size_t i = 0; i < size_; ++i) {
    const Step& s = at(i);
    m1 += s.seqs;
    m2 += s.tokens;
    my += s.duration_s;
  }
  m1 /= n;
  m2 /= n;
  my /= n;
  double s11 = 0, s22 = 0, s12 = 0, s1y = 0, s2y = 0;
  for (size_t i = 0; i < size_; ++i) {
    const Step& s = at(i);
    const double d1 = s.seqs - m1, d2 = s.tokens - m2, dy = s.duration_s - my;
    s11 += d1 * d1;
    s22 += d2 * d2;
    s12 += d1 * d2;
    s1y += d1 * dy;
    s2y += d2 * dy;
  }
  // The sequence count must vary (a standard deviation of half a sequence).
  if (s11 < n * 0.25) return std::nullopt;
  const double det = s11 * s22 - s12 * s12;
  double cost = 0;
  if (det <= 1e-6 * s11 * s22) {
    // Tokens move with sequences (a window of pure decode steps has tokens ==
    // seqs): the slope on sequences alone is already b + c.
    cost = s1y / s11;
  } else {
    const double b = (s1y * s22 - s2y * s12) / det;
    const double c = (s2y * s11 - s1y * s12) / det;
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
  const double n = static_cast<double>(size_);
  double m1 = 0, m2 = 0, my = 0;
  for (size_t i = 0; i < size_; ++i) m1 += at(i).seqs, m2 += at(i).tokens, my += at(i).duration_s;
  m1 /= n, m2 /= n, my /= n;
  double s11 = 0, s22 = 0, s12 = 0, s1y = 0, s2y = 0;
  for (size_t i = 0; i < size_; ++i) {
    const double d1 = at(i).seqs - m1, d2 = at(i).tokens - m2, dy = at(i).duration_s - my;
    s11 += d1 * d1, s22 += d2 * d2, s12 += d1 * d2, s1y += d1 * dy, s2y += d2 * dy;
  }
  if (s11 < n * 0.25) return std::nullopt;  // the sequence count must vary
  StepFit fit;
  const double det = s11 * s22 - s12 * s12;
  double b = 0, c = 0;
  if (det > 1e-6 * s11 * s22) {
    b = (s1y * s22 - s2y * s12) / det;
    c = (s2y * s11 - s1y * s12) / det;
  }
  // Collinear, or a negative slope: one regressor alone (the one that
  // explains the steps with a non-negative slope; sequences first).
  if (!(det > 1e-6 * s11 * s22) || b < 0 || c < 0) {
    b = c = 0;
    if (s1y > 0) {
      b = s1y / s11;
    } else if (s22 > 0 && s2y > 0) {
      c = s2y / s22;
    }
  }
  fit.per_seq_s = b;
  fit.per_token_s = c;
  fit.fixed_s = std::max(0.0, my - b * m1 - c * m2);
  const double predicted = fit.Seconds(m1, m2);
  if (!std::isfinite(predicted) || predicted <= 0 || std::abs(predicted - my) > 0.5 * my) return std::nullopt;
  return fit;
}

}  // namespace ferry::scheduler
