// The LoRA adapters the gateway routes requests under (GenerateRequest.lora_name, an OpenAI
// `model`): the replicas' at start (SchedulerInfo.lora_names), then as the admin API loads and
// unloads them (lora_admin.h). Thread-safe: every request reads it, the admin calls write it.
#pragma once

#include <mutex>
#include <set>
#include <shared_mutex>
#include <string>
#include <vector>

namespace ferry::gateway {

class LoraCatalog {
 public:
  explicit LoraCatalog(const std::vector<std::string>& names = {}) : names_(names.begin(), names.end()) {}

  bool Has(const std::string& name) const {
    std::shared_lock lock(mu_);
    return names_.count(name) != 0;
  }
  bool empty() const {
    std::shared_lock lock(mu_);
    return names_.empty();
  }
  std::vector<std::string> Names() const {  // sorted
    std::shared_lock lock(mu_);
    return {names_.begin(), names_.end()};
  }
  void Add(const std::string& name) {
    std::unique_lock lock(mu_);
    names_.insert(name);
  }
  void Remove(const std::string& name) {
    std::unique_lock lock(mu_);
    names_.erase(name);
  }

 private:
  mutable std::shared_mutex mu_;
  std::set<std::string> names_;
};

}  // namespace ferry::gateway
