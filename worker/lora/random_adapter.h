// Random LoRA adapters in PEFT's exact layout (adapter_config.json + adapter_model.safetensors),
// for tests and benchmarks without a download; ferry-make-model --lora writes them. Seeded:
// the same (base, spec) gives the same bytes. Scaled so the update moves each projection's
// output by about a third of its size: the adapters change greedy tokens, activations stay bounded.
#pragma once

#include <array>
#include <cstdint>
#include <string>

#include "worker/arch/model_config.h"
#include "worker/lora/lora_adapter.h"

namespace ferry::worker {

struct RandomAdapterSpec {
  int32_t rank = 16;
  double alpha = 32;
  bool use_rslora = false;
  std::array<bool, kNumLoraTargets> targets{true, true, true, true, true, true, true};  // all seven
  uint64_t seed = 1;
  std::string dtype = "bfloat16";  // on disk: "float32" | "bfloat16" | "float16"
  std::string base_model;          // base_model_name_or_path (informational)
};

// Writes the adapter for `base` into `dir` (created). Throws std::runtime_error / invalid_argument.
void WriteRandomLoraAdapter(const ModelConfig& base, const RandomAdapterSpec& spec, const std::string& dir);

}  // namespace ferry::worker
