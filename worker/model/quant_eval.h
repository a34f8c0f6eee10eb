// How close a quantized model's logits are to a reference's on the same checkpoint: the accuracy
// check of --quantization (int8_accuracy_test, and ferry-quant-eval on a full-size checkpoint).
#pragma once

#include <cstdint>
#include <vector>

#include "worker/model/cpu_model.h"

namespace ferry::worker {

struct LogitAgreement {
  int32_t positions = 0;    // prompt positions compared, over all prompts
  double min_cosine = 1.0;  // cosine similarity of the two logit vectors, worst position
  double mean_cosine = 0.0;
  int32_t top1_agree = 0;   // positions whose argmax is the same token
};

// `num_prompts` prompts of `length` token ids below `vocab`, from a fixed seed: ids spread over
// the vocabulary, with a repeated stretch in each (copying, as summaries and edits have).
std::vector<std::vector<int32_t>> FixedPromptSet(int32_t vocab, int32_t num_prompts, int32_t length,
                                                 uint64_t seed);

// Runs every prompt through both models (one sequence per Forward, every position's logits) and
// compares them position by position.
LogitAgreement CompareLogits(CpuModel& reference, CpuModel& candidate,
                             const std::vector<std::vector<int32_t>>& prompts);

}  // namespace ferry::worker
