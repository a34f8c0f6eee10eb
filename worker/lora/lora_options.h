// The LoRA flags an engine takes (vLLM's names). Plain data, so the runner contract
// (worker/engine/model_runner.h) carries it without depending on the adapters' reader.
#pragma once

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

namespace ferry::worker {

struct LoraOptions {
  bool enable = false;         // --enable-lora
  int32_t max_loras = 1;       // --max-loras: distinct adapters in one step
  int32_t max_lora_rank = 16;  // --max-lora-rank
  int32_t max_cpu_loras = 0;   // --max-cpu-loras: adapters kept in memory; 0: max_loras
  std::vector<std::pair<std::string, std::string>> modules;  // --lora-modules NAME=PATH, read at start
};

}  // namespace ferry::worker
