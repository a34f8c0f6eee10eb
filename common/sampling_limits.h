// Limits of the sampling contract (proto/ferry/v1/sampling.proto) that more than one hop enforces,
// each defined once (issue #54: kMaxLogprobs was defined twice and the scheduler wrote 20 by hand,
// kMinTemperature three times). Header-only: the GPU engine's standalone build uses it too.
#pragma once

#include <cstdint>

namespace ferry {

// SamplingParams.logprobs and .prompt_logprobs: the most alternatives per position, as OpenAI's and
// vLLM's limit (the gateway refuses more, the scheduler before queueing, the worker before a step).
inline constexpr int32_t kMaxLogprobs = 20;
// A temperature below this samples greedily (argmax): dividing the logits by it would overflow.
inline constexpr float kMinTemperature = 1e-5f;

}  // namespace ferry
