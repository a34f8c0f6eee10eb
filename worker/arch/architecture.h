// The architectures Ferry serves, keyed by config.json's `architectures` (or its `model_type`).
// Each is one file in this folder: a reader that takes what the architecture adds to the common
// config fields, refuses what it does not implement, and sets the traits in which its forward
// pass differs (ModelConfig::qkv_bias, qk_norm, rope_scaling); registry.cc lists them.
// README.md shows what adding one takes.
#pragma once

#include <string>
#include <vector>

#include "worker/arch/config_fields.h"
#include "worker/arch/model_config.h"

namespace ferry::worker::arch {

struct Architecture {
  const char* name;        // config.json's architectures[0], e.g. "LlamaForCausalLM"
  const char* model_type;  // its model_type, e.g. "llama"
  // Called after the common fields are read into `config`.
  void (*read)(const ConfigFields& fields, ModelConfig& config);
};

// Every architecture served, in registry.cc's order.
const std::vector<Architecture>& Architectures();
// The entry for `name` (architectures[0]; empty: match by model_type), or nullptr.
const Architecture* FindArchitecture(const std::string& name, const std::string& model_type);
// "Qwen2ForCausalLM, LlamaForCausalLM, ...": for a refusal.
std::string ServedArchitectures();

}  // namespace ferry::worker::arch
