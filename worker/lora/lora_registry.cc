#include "worker/lora/lora_registry.h"

#include <stdexcept>
#include <unordered_set>

#include "common/lora_name.h"
#include "worker/engine/model_runner.h"

namespace ferry::worker {

void ValidateLoraOptions(const LoraOptions& o) {
  auto refuse = [](const std::string& what) { throw std::invalid_argument(what); };
  if (!o.enable) {
    if (!o.modules.empty()) refuse("--lora-modules needs --enable-lora");
    return;
  }
  if (o.max_loras < 1) refuse("--max-loras = " + std::to_string(o.max_loras) + ", want >= 1");
  if (o.max_lora_rank < 1 || o.max_lora_rank > 512) {
    refuse("--max-lora-rank = " + std::to_string(o.max_lora_rank) + ", want 1..512");
  }
  for (const auto& [name, path] : o.modules) {
    if (const std::string error = LoraNameError(name); !error.empty()) refuse("--lora-modules: " + error);
  }
  if (o.max_cpu_loras != 0 && o.max_cpu_loras < o.max_loras) {
    refuse("--max-cpu-loras = " + std::to_string(o.max_cpu_loras) + " is below --max-loras " +
           std::to_string(o.max_loras) + " (0: --max-loras)");
  }
}

LoraRegistry::LoraRegistry(const ModelConfig& base, const ShardPlan& shard, const LoraOptions& options,
                           bool bf16_weights)
    : base_(base), shard_(shard), options_(options), bf16_weights_(bf16_weights) {
  ValidateLoraOptions(options_);
  for (const auto& [name, path] : options_.modules) Load(name, path);
}

std::shared_ptr<const LoraAdapter> LoraRegistry::Read(const std::string& name, const std::string& path) const {
  return std::make_shared<const LoraAdapter>(
      LoadLoraAdapter(name, path, base_, shard_, LoraLimits{options_.max_lora_rank, bf16_weights_}));
}

void LoraRegistry::Remember(std::shared_ptr<const LoraAdapter> adapter) {
  cache_.push_front(std::move(adapter));
  const size_t keep = static_cast<size_t>(options_.max_cpu_loras > 0 ? options_.max_cpu_loras : options_.max_loras);
  while (cache_.size() > keep) cache_.pop_back();  // a running sequence still holds its own copy
}

bool LoraRegistry::Load(const std::string& name, const std::string& path) {
  if (!options_.enable) throw std::invalid_argument("LoRA adapters are off: start with --enable-lora");
  if (name.empty()) throw std::invalid_argument("lora_name is empty");
  const auto taken = [&] {
    return LoraNameTaken("lora_name \"" + name + "\" is already loaded (from " + paths_.at(name) +
                         "): unload it first");
  };
  {
    std::lock_guard lock(mu_);
    if (const auto it = paths_.find(name); it != paths_.end()) {
      if (it->second == path) return false;
      throw taken();
    }
  }
  std::shared_ptr<const LoraAdapter> adapter = Read(name, path);  // throws with nothing registered
  std::lock_guard lock(mu_);
  if (const auto it = paths_.find(name); it != paths_.end()) {  // a concurrent Load of the same name
    if (it->second == path) return false;
    throw taken();
  }
  ++num_reads_;
  paths_[name] = path;
  Remember(std::move(adapter));
  return true;
}

void LoraRegistry::Unload(const std::string& name) {
  std::lock_guard lock(mu_);
  if (!paths_.count(name)) throw std::invalid_argument("lora_name \"" + name + "\" is not loaded");
  paths_.erase(name);
  cache_.remove_if([&](const std::shared_ptr<const LoraAdapter>& a) { return a->name == name; });
}

bool LoraRegistry::Has(const std::string& name) const {
  std::lock_guard lock(mu_);
  return paths_.count(name) != 0;
}

int32_t LoraRegistry::num_in_memory() const {
  std::lock_guard lock(mu_);
  return static_cast<int32_t>(cache_.size());
}

int64_t LoraRegistry::num_reads() const {
  std::lock_guard lock(mu_);
  return num_reads_;
}

std::vector<std::string> LoraRegistry::Names() const {
  std::lock_guard lock(mu_);
  std::vector<std::string> out;
  for (const auto& [name, path] : paths_) out.push_back(name);
  return out;
}

std::shared_ptr<const LoraAdapter> LoraRegistry::Acquire(const std::string& name) {
  std::lock_guard lock(mu_);
  const auto known = paths_.find(name);
  if (known == paths_.end()) throw std::invalid_argument("lora_name \"" + name + "\" is not loaded");
  for (auto it = cache_.begin(); it != cache_.end(); ++it) {
    if ((*it)->name == name) {
      cache_.splice(cache_.begin(), cache_, it);
      return cache_.front();
    }
  }
  // Evicted: read again, under the lock (a Load or Unload of the same name waits for it).
  std::shared_ptr<const LoraAdapter> adapter = Read(name, known->second);
  ++num_reads_;
  Remember(adapter);
  return adapter;
}

std::vector<std::shared_ptr<const LoraAdapter>> AcquireStepAdapters(
    LoraRegistry* registry, const StepSpec& step, const std::function<const LoraAdapter*(uint64_t)>& running) {
  std::vector<std::shared_ptr<const LoraAdapter>> out;
  bool any = false;
  for (const NewSequenceSpec& n : step.new_sequences) any = any || !n.lora_name.empty();
  if (!any || registry == nullptr) return out;
  for (const NewSequenceSpec& n : step.new_sequences) {
    if (n.lora_name.empty()) {
      out.emplace_back();
      continue;
    }
    try {
      out.push_back(registry->Acquire(n.lora_name));
    } catch (const std::invalid_argument& e) {
      throw std::invalid_argument("sequence " + std::to_string(n.seq_id) + ": " + e.what());
    }
  }
  // Distinct adapters among the sequences the step runs: those it starts and those it continues.
  std::unordered_set<const LoraAdapter*> distinct;
  for (const auto& a : out) {
    if (a) distinct.insert(a.get());
  }
  for (const ScheduledSpec& s : step.scheduled) {
    bool is_new = false;
    for (const NewSequenceSpec& n : step.new_sequences) is_new = is_new || n.seq_id == s.seq_id;
    if (const LoraAdapter* a = is_new ? nullptr : running(s.seq_id)) distinct.insert(a);
  }
  if (static_cast<int32_t>(distinct.size()) > registry->options().max_loras) {
    throw std::invalid_argument("the step runs " + std::to_string(distinct.size()) +
                                " distinct LoRA adapters, above --max-loras " +
                                std::to_string(registry->options().max_loras));
  }
  return out;
}

}  // namespace ferry::worker
