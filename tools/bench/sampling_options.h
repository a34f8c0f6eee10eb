// The sampling parameters ferry-bench sends with every request: temperature always (0, the
// default, is greedy), the others only when given, so that the server's defaults (a model's
// generation_config.json) apply to what is left out. vLLM's benchmark flags: --temperature,
// --top-p, --top-k, --min-p, plus --repetition-penalty.
#pragma once

#include <cstdint>
#include <optional>

namespace ferry::bench {

struct BenchSampling {
  float temperature = 0;
  std::optional<float> top_p;
  std::optional<int32_t> top_k;
  std::optional<float> min_p;
  std::optional<float> repetition_penalty;
};

}  // namespace ferry::bench
