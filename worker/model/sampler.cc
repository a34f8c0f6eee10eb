#include "worker/model/sampler.h"

#include <algorithm>
#include <cmath>

namespace ferry::worker {
namespace {

uint64_t SplitMix64(uint64_t x) {
  x += 0x9e3779b97f4a7c15ull;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
  return x ^ (x >> 31);
}

// Below this temperature sampling is treated as greedy (dividing would overflow).
constexpr float kMinTemperature = 1e-5f;

// Most likely first; lowest id first among equals, so the order is total and deterministic.
bool MoreLikely(const std::pair<float, int32_t>& a, const std::pair<float, int32_t>& b) {
  return a.first > b.first || (a.first == b.first && a.second < b.second);
}

}  // namespace

double CounterUniform(uint64_t seed, uint64_t counter) {
  // Two rounds so (seed, counter) and (seed + 1, counter - 1)-like pairs do not collide.
  const uint64_t bits = SplitMix64(SplitMix64(seed) ^ counter);
  return static_cast<double>(bits >> 11) * 0x1.0p-53;  // 53 random bits -> [0, 1)
}

int32_t Argmax(const float* logits, int32_t vocab) {
  int32_t best = 0;
  for (int32_t i = 1; i < vocab; ++i) {
    if (logits[i] > logits[best]) best = i;  // strict: the first maximum wins
  }
  return best;
}

int32_t Sampler::Sample(const float* logits, int32_t vocab, const SamplingOptions& options,
                        int32_t sample_index) {
  if (options.temperature < kMinTemperature) return Argmax(logits, vocab);
  const float inv_t = 1.f / options.temperature;
  candidates_.resize(vocab);
  for (int32_t i = 0; i < vocab; ++i) candidates_[i] = {logits[i] * inv_t, i};
  const bool use_top_k = options.top_k > 0 && options.top_k < vocab;
  const bool use_top_p = options.top_p < 1.f;
  size_t keep = candidates_.size();
  if (use_top_k) {
    keep = static_cast<size_t>(options.top_k);
    std::partial_sort(candidates_.begin(), candidates_.begin() + keep, candidates_.end(),
                      MoreLikely);
  } else if (use_top_p) {
    std::sort(candidates_.begin(), candidates_.end(), MoreLikely);
  }
  // Softmax over the kept candidates in double; the max is the first one when sorted.
  float max_logit = candidates_[0].first;
  for (size_t i = 1; i < keep; ++i) max_logit = std::max(max_logit, candidates_[i].first);
  probs_.resize(keep);
  double total = 0;
  for (size_t i = 0; i < keep; ++i) {
    probs_[i] = std::exp(static_cast<double>(candidates_[i].first) - max_logit);
    total += probs_[i];
  }
  if (use_top_p) {  // candidates are sorted here
    const double target = static_cast<double>(options.top_p) * total;
    double mass = 0;
    size_t n = 0;
    while (n < keep && mass < target) mass += probs_[n++];
    keep = std::max<size_t>(n, 1);
    total = mass > 0 ? mass : probs_[0];
  }
  const double u = CounterUniform(options.seed, static_cast<uint64_t>(sample_index)) * total;
  double acc = 0;
  for (size_t i = 0; i < keep; ++i) {
    acc += probs_[i];
    if (u < acc) return candidates_[i].second;
  }
  return candidates_[keep - 1].second;  // u landed on the rounding slack at the top
}

}  // namespace ferry::worker
