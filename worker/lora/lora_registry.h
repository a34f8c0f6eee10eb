// The adapters one engine serves: every registered name with its directory (--lora-modules at
// start, LoadLora at run time), and an LRU cache of those read into memory, at most
// max_cpu_loras (vLLM's --max-cpu-loras). A sequence holds its adapter through the shared_ptr
// Acquire returns, so an eviction or an unload never frees weights a running sequence reads;
// an evicted adapter is read again from its directory at its next use.
#pragma once

#include <cstdint>
#include <list>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "worker/lora/lora_adapter.h"
#include "worker/lora/lora_options.h"

namespace ferry::worker {

// Throws std::invalid_argument naming the flag and value when the options are inconsistent.
void ValidateLoraOptions(const LoraOptions& options);

class LoraRegistry {
 public:
  // Registers and reads every module of `options` (a bad one throws, naming it). bf16_weights:
  // LoraLimits::bf16_weights for every adapter.
  LoraRegistry(const ModelConfig& base, const ShardPlan& shard, const LoraOptions& options, bool bf16_weights = false);

  const LoraOptions& options() const { return options_; }
  // Reads the adapter at `path` and registers it as `name`. Throws std::invalid_argument (the
  // name taken, a bad adapter: LoadLoraAdapter's message) with nothing registered.
  void Load(const std::string& name, const std::string& path);
  // Forgets `name` (sequences running under it keep their copy until they end). Throws
  // std::invalid_argument when no adapter has that name.
  void Unload(const std::string& name);
  bool Has(const std::string& name) const { return paths_.count(name) != 0; }
  std::vector<std::string> Names() const;
  // The adapter's weights, read again from its directory if evicted; the most recently used.
  // Throws std::invalid_argument for an unknown name or a directory no longer readable.
  std::shared_ptr<const LoraAdapter> Acquire(const std::string& name);
  int32_t num_in_memory() const { return static_cast<int32_t>(cache_.size()); }
  int64_t num_reads() const { return num_reads_; }  // adapters read from disk so far

 private:
  std::shared_ptr<const LoraAdapter> Read(const std::string& name, const std::string& path) const;
  void Remember(std::shared_ptr<const LoraAdapter> adapter);

  const ModelConfig base_;
  const ShardPlan shard_;
  const LoraOptions options_;
  const bool bf16_weights_;
  std::map<std::string, std::string> paths_;                 // registered: name -> directory
  std::list<std::shared_ptr<const LoraAdapter>> cache_;      // in memory, most recent first
  int64_t num_reads_ = 0;
};

}  // namespace ferry::worker
