// The adapters one engine serves: every registered name with its directory (--lora-modules at
// start, LoadLora at run time), and an LRU cache of those read into memory, at most
// max_cpu_loras (vLLM's --max-cpu-loras). A sequence holds its adapter through the shared_ptr
// Acquire returns, so an eviction or an unload never frees weights a running sequence reads;
// an evicted adapter is read again from its directory at its next use. Thread-safe: Load and
// Unload come on gRPC threads (Worker.LoadLoraAdapter) while the step thread Acquires; a Load
// reads its adapter outside the lock, so steps go on meanwhile.
#pragma once

#include <cstdint>
#include <functional>
#include <list>
#include <map>
#include <memory>
#include <mutex>
#include <stdexcept>
#include <string>
#include <vector>

#include "worker/lora/lora_adapter.h"
#include "worker/lora/lora_options.h"

namespace ferry::worker {

// Throws std::invalid_argument naming the flag and value when the options are inconsistent.
void ValidateLoraOptions(const LoraOptions& options);

// A Load of a name registered from another directory (Worker.LoadLoraAdapter: ALREADY_EXISTS).
class LoraNameTaken : public std::invalid_argument {
 public:
  using std::invalid_argument::invalid_argument;
};

class LoraRegistry {
 public:
  // Registers and reads every module of `options` (a bad one throws, naming it). bf16_weights:
  // LoraLimits::bf16_weights for every adapter.
  LoraRegistry(const ModelConfig& base, const ShardPlan& shard, const LoraOptions& options, bool bf16_weights = false);

  const LoraOptions& options() const { return options_; }
  // Reads the adapter at `path` and registers it as `name`; false (nothing read) when `name` is
  // registered from `path` already. Throws std::invalid_argument (a bad adapter:
  // LoadLoraAdapter's message) and LoraNameTaken (registered from another path) with nothing
  // registered.
  bool Load(const std::string& name, const std::string& path);
  // Forgets `name` (sequences running under it keep their copy until they end). Throws
  // std::invalid_argument when no adapter has that name.
  void Unload(const std::string& name);
  bool Has(const std::string& name) const;
  std::vector<std::string> Names() const;
  // The adapter's weights, read again from its directory if evicted; the most recently used.
  // Throws std::invalid_argument for an unknown name or a directory no longer readable.
  std::shared_ptr<const LoraAdapter> Acquire(const std::string& name);
  int32_t num_in_memory() const;
  int64_t num_reads() const;  // adapters read from disk so far

 private:
  std::shared_ptr<const LoraAdapter> Read(const std::string& name, const std::string& path) const;
  void Remember(std::shared_ptr<const LoraAdapter> adapter);

  const ModelConfig base_;
  const ShardPlan shard_;
  const LoraOptions options_;
  const bool bf16_weights_;
  mutable std::mutex mu_;  // guards the three below
  std::map<std::string, std::string> paths_;                 // registered: name -> directory
  std::list<std::shared_ptr<const LoraAdapter>> cache_;      // in memory, most recent first
  int64_t num_reads_ = 0;
};

struct StepSpec;  // worker/engine/model_runner.h

// The adapters a step's new sequences run under (null: the base model), in new_sequences order,
// acquired from `registry` (null: an engine without adapters, whose step validation refused any
// lora_name), once the step is known to run at most --max-loras distinct adapters: those and the
// adapters of its other scheduled sequences (`running(seq_id)`, null for none). Both engines' rule.
// Throws std::invalid_argument naming the sequence (an adapter not loaded) or the flag.
std::vector<std::shared_ptr<const LoraAdapter>> AcquireStepAdapters(
    LoraRegistry* registry, const StepSpec& step, const std::function<const LoraAdapter*(uint64_t)>& running);

}  // namespace ferry::worker
