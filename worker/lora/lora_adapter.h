// A LoRA adapter in PEFT's layout (adapter_config.json + adapter_model.safetensors), read for one
// base model and one tensor-parallel rank: each targeted projection's A [rank, in] and B
// [out, rank], sharded as the base layer is (column-parallel q/k/v/gate/up: B's rows; row-parallel
// o/down: A's columns, the partial sums joining the base layer's all-reduce). Engine-neutral:
// the CPU engine applies it with kernels/cpu/lora.h; nothing here computes.
#pragma once

#include <array>
#include <cstdint>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include <nlohmann/json.hpp>

#include "worker/arch/model_config.h"
#include "worker/arch/shard_plan.h"

namespace ferry::worker {

// The projections an adapter may target (PEFT's target_modules names).
enum class LoraTarget : int32_t { kQ, kK, kV, kO, kGate, kUp, kDown };
inline constexpr int32_t kNumLoraTargets = 7;
const char* LoraTargetName(LoraTarget target);  // "q_proj", ...
// The projection's weight shape in the base model, {out, in} (Hugging Face's [out_features, in_features]).
std::pair<int64_t, int64_t> LoraTargetShape(LoraTarget target, const ModelConfig& base);

// adapter_config.json, as far as it changes the output.
struct LoraAdapterConfig {
  int32_t rank = 0;               // r
  double alpha = 0;               // lora_alpha
  bool use_rslora = false;        // scale alpha / sqrt(r) instead of alpha / r
  std::array<bool, kNumLoraTargets> targets{};  // target_modules
  std::string base_model;         // base_model_name_or_path (informational)
  double scale() const;
};

// Reads the JSON of an adapter_config.json. Every field that would change the output and is not
// implemented (DoRA, bias, modules_to_save, rank or alpha patterns, layers_to_transform, targets
// outside the seven projections, a regex target_modules, fan_in_fan_out, another peft_type) is
// refused: std::invalid_argument naming `where`, the field and its value.
LoraAdapterConfig ParseLoraAdapterConfig(const nlohmann::json& json, const std::string& where);

// One projection's update on this rank.
// The weights in fp32 (a, b_t) or bf16 (a_bf16, b_t_bf16; LoraLimits::bf16_weights), one pair set.
struct LoraModule {
  std::vector<float> a;    // [rank, in]: lora_A, its input columns this rank's (row-parallel)
  std::vector<float> b_t;  // [rank, out]: lora_B transposed, its output rows this rank's (column-parallel)
  std::vector<uint16_t> a_bf16;    // [rank, in]
  std::vector<uint16_t> b_t_bf16;  // [rank, out]
  int64_t in = 0;
  int64_t out = 0;
};

struct LoraAdapter {
  std::string name;
  std::string path;
  LoraAdapterConfig config;
  float scale = 1.f;
  // [num_hidden_layers][kNumLoraTargets]: empty where not targeted.
  std::vector<std::array<std::optional<LoraModule>, kNumLoraTargets>> layers;
  int64_t bytes() const;  // what its weights take on this rank
};

struct LoraLimits {
  int32_t max_lora_rank = 16;  // vLLM's --max-lora-rank
  // Keep A and B in bf16 (the bf16 engine's choice: half the bytes a step reads per adapter, and
  // exact for an adapter saved in bf16), else fp32 (the parity tests' exact path).
  bool bf16_weights = false;
};

// Loads the adapter at `dir` for `base` (its config and this rank's shard). Every tensor must be
// a lora_A or lora_B of a targeted projection of an existing layer with the shape the base layer
// implies, every targeted projection of every layer present, the rank within `limits`. Throws
// std::invalid_argument naming the file, the field or tensor, the value and the limit; nothing is
// kept of an adapter that fails.
LoraAdapter LoadLoraAdapter(const std::string& name, const std::string& dir, const ModelConfig& base,
                            const ShardPlan& shard, const LoraLimits& limits);

}  // namespace ferry::worker
