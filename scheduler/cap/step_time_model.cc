#include "scheduler/cap/step_time_model.h"

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
    m.s11 += d1 * d1, m.s22 += d2 * d2, m.s12 += d1 * d2, m.s1y += d1 * dy, m.s2y += d2 * dy, m.syy += dy * dy;
  }
  return m;
}

double StepTimeModel::TokensPerSeq() const {
  double seqs = 0, tokens = 0;
  for (size_t i = 0; i < size_; ++i) seqs += at(i).seqs, tokens += at(i).tokens;
  return seqs > 0 ? tokens / seqs : 0.0;
}

namespace {

// Solves the k x k system a x = b (k <= 3) by Gaussian elimination with
// partial pivoting; false when a pivot is negligible against the diagonal
// (the chosen regressors are collinear).
bool SolveSmall(int k, double a[3][3], double b[3], double x[3]) {
  double scale = 0;
  for (int i = 0; i < k; ++i) scale = std::max(scale, std::abs(a[i][i]));
  if (scale <= 0) return false;
  for (int col = 0; col < k; ++col) {
    int pivot = col;
    for (int r = col + 1; r < k; ++r)
      if (std::abs(a[r][col]) > std::abs(a[pivot][col])) pivot = r;
    if (std::abs(a[pivot][col]) <= 1e-9 * scale) return false;
    std::swap(a[col], a[pivot]);
    std::swap(b[col], b[pivot]);
    for (int r = col + 1; r < k; ++r) {
      const double f = a[r][col] / a[col][col];
      for (int c = col; c < k; ++c) a[r][c] -= f * a[col][c];
      b[r] -= f * b[col];
    }
  }
  for (int r = k - 1; r >= 0; --r) {
    double v = b[r];
    for (int c = r + 1; c < k; ++c) v -= a[r][c] * x[c];
    x[r] = v / a[r][r];
  }
  return true;
}

}  // namespace

std::optional<StepFit> StepTimeModel::Fit(size_t min_steps) const {
  if (size_ < std::max<size_t>(min_steps, 3)) return std::nullopt;
  const Moments m = CentredMoments();
  if (m.s11 < static_cast<double>(size_) * 0.25) return std::nullopt;  // the sequence count must vary
  // Subsets in order of preference on a tie (collinear seqs and tokens in a
  // pure decode window: the slope goes to the sequences).
  static constexpr int kSubsets[] = {0b111, 0b011, 0b101, 0b110, 0b010, 0b100, 0b001};
  return BestFit(m, kSubsets, sizeof(kSubsets) / sizeof(kSubsets[0]));
}

std::optional<StepFit> StepTimeModel::FitAtOneBatchSize(size_t min_steps) const {
  if (size_ < std::max<size_t>(min_steps, 3)) return std::nullopt;
  const Moments m = CentredMoments();
  // The tokens must vary (prefill chunks among decodes): they alone separate
  // a step's constant from its per-token cost.
  if (m.s22 < static_cast<double>(size_) * 0.25) return std::nullopt;
  static constexpr int kSubsets[] = {0b101, 0b100, 0b001};  // no seqs term: it does not vary
  return BestFit(m, kSubsets, sizeof(kSubsets) / sizeof(kSubsets[0]));
}

std::optional<StepFit> StepTimeModel::BestFit(const Moments& m, const int* subsets, size_t num_subsets) const {
  // Least squares with every coefficient >= 0 (a step cannot take less time
  // for more work): the optimum has some coefficients at 0 and the others at
  // the unconstrained fit on those regressors alone, so try every subset of
  // {fixed, seqs, tokens} and keep the feasible one with the least squared
  // error. Raw (uncentred) normal equations, columns 1, seqs, tokens; a fit
  // without the constant runs through the origin rather than having a
  // negative constant cut to 0 after the fact, which would bias every
  // prediction upward by the cut.
  const double n = static_cast<double>(size_);
  const double gram[3][3] = {{n, n * m.m1, n * m.m2},
                             {n * m.m1, m.s11 + n * m.m1 * m.m1, m.s12 + n * m.m1 * m.m2},
                             {n * m.m2, m.s12 + n * m.m1 * m.m2, m.s22 + n * m.m2 * m.m2}};
  const double cross[3] = {n * m.my, m.s1y + n * m.m1 * m.my, m.s2y + n * m.m2 * m.my};
  const double total = m.syy + n * m.my * m.my;  // sum of squared durations
  std::optional<StepFit> best;
  double best_sse = 0;
  for (size_t s = 0; s < num_subsets; ++s) {
    const int subset = subsets[s];
    int idx[3], k = 0;
    for (int j = 0; j < 3; ++j)
      if (subset & (1 << j)) idx[k++] = j;
    double a[3][3], b[3], x[3] = {0, 0, 0};
    for (int r = 0; r < k; ++r) {
      for (int c = 0; c < k; ++c) a[r][c] = gram[idx[r]][idx[c]];
      b[r] = cross[idx[r]];
    }
    if (!SolveSmall(k, a, b, x)) continue;
    double coef[3] = {0, 0, 0};
    bool feasible = true;
    for (int r = 0; r < k; ++r) coef[idx[r]] = x[r], feasible &= x[r] >= 0;
    if (!feasible) continue;
    // At the restricted optimum the squared error is total - coef . cross.
    const double sse = total - (coef[0] * cross[0] + coef[1] * cross[1] + coef[2] * cross[2]);
    // A later subset must be better by more than rounding (relative to the
    // total, which the subtraction above cancels against) to win a tie.
    if (best && sse > best_sse - 1e-10 * total) continue;
    best = StepFit{coef[0], coef[1], coef[2]};
    best_sse = sse;
  }
  if (!best) return std::nullopt;
  const double predicted = best->Seconds(m.m1, m.m2);
  if (!std::isfinite(predicted) || predicted <= 0 || std::abs(predicted - m.my) > 0.5 * m.my) return std::nullopt;
  return best;
}

}  // namespace ferry::scheduler
