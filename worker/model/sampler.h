// Token sampling from one row of logits. Deterministic given (logits, options, sample index):
// the random draw is a pure function of (seed, index), so a sequence samples the same tokens
// whatever else shares its batch and after preemption and recompute.
#pragma once

#include <cstdint>
#include <utility>
#include <vector>

#include "worker/model/model_runner.h"

namespace ferry::worker {

// Uniform in [0, 1) from a counter-based generator: splitmix64 over the pair. No state.
double CounterUniform(uint64_t seed, uint64_t counter);

class Sampler {
 public:
  // temperature 0 (or below 1e-5): argmax, lowest id on ties. Otherwise logits / temperature,
  // keep the top_k most likely (when top_k > 0), then the smallest most-likely set whose
  // probability mass reaches top_p, renormalise and draw with CounterUniform(seed, index).
  int32_t Sample(const float* logits,  // [vocab]
                 int32_t vocab, const SamplingOptions& options, int32_t sample_index);

 private:
  std::vector<std::pair<float, int32_t>> candidates_;  // (scaled logit, id), reused
  std::vector<double> probs_;                          // reused
};

// argmax with the lowest id winning ties.
int32_t Argmax(const float* logits, int32_t vocab);  // logits: [vocab]

}  // namespace ferry::worker
