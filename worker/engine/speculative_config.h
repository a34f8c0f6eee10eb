// vLLM's --speculative-config for the worker: the JSON, its checks, and method names.
#pragma once

#include <string>

#include "worker/engine/model_runner.h"

namespace ferry::worker {

// "" and "none": kNone; "ngram": kNgram; "draft_model": kDraftModel (vLLM's names: SpeculativeMethodName).
// Throws std::invalid_argument naming the value otherwise.
SpeculativeMethod ParseSpeculativeMethod(const std::string& name);

// vLLM's JSON: {"method": "ngram", "num_speculative_tokens": 4, "prompt_lookup_max": 4,
// "prompt_lookup_min": 1}, or {"method": "draft_model", "model": DIR, "num_speculative_tokens": 4}.
// "" gives the default (off). "model" is required with draft_model and refused otherwise. num_speculative_tokens in
// [1, kMaxSpeculativeTokens] is required with a method (vLLM requires it too);
// 1 <= prompt_lookup_min <= prompt_lookup_max <= 64. Throws std::invalid_argument naming the field,
// the value and the limit; an unknown field is refused, never ignored.
SpeculativeConfig ParseSpeculativeConfig(const std::string& json);

}  // namespace ferry::worker
