#include "gateway/lora_admin.h"

#include <fmt/format.h>
#include <spdlog/spdlog.h>

#include "common/lora_name.h"

namespace ferry::gateway {

std::vector<size_t> LoraAdmin::ListedReplicas() {
  std::vector<size_t> out;
  ReplicaRouter& router = client_->router();
  for (size_t i = 0; i < router.size(); ++i) {
    if (router.replica(i).listed.load()) out.push_back(i);
  }
  return out;
}

Status LoraAdmin::Load(const std::string& name, const std::string& path) {
  if (const std::string error = LoraNameError(name); !error.empty()) return {StatusCode::kInvalidArgument, error};
  if (path.empty()) return {StatusCode::kInvalidArgument, "lora_path is empty"};
  std::lock_guard lock(mu_);
  if (catalog_->Has(name)) {
    return {StatusCode::kAlreadyExists, fmt::format("lora_name \"{}\" is already loaded: unload it first", name)};
  }
  const std::vector<size_t> replicas = ListedReplicas();
  if (replicas.empty()) return {StatusCode::kUnavailable, "no scheduler replica is listed"};
  for (size_t k = 0; k < replicas.size(); ++k) {
    const Status status = client_->LoadLora(replicas[k], name, path);
    if (status.ok()) continue;
    for (size_t done = 0; done < k; ++done) {  // all or none
      if (const Status undo = client_->UnloadLora(replicas[done], name); !undo.ok()) {
        spdlog::warn("LoRA adapter {}: replica {} did not unload it after a failed load: {}", name,
                     client_->router().replica(replicas[done]).address, undo.error_message());
      }
    }
    return status;
  }
  catalog_->Add(name);
  runtime_[name] = path;
  spdlog::info("LoRA adapter {} loaded from {} on {} replicas", name, path, replicas.size());
  return {};
}

Status LoraAdmin::Unload(const std::string& name) {
  std::lock_guard lock(mu_);
  if (!catalog_->Has(name)) return {StatusCode::kNotFound, fmt::format("lora_name \"{}\" is not loaded", name)};
  catalog_->Remove(name);  // refused from here on
  runtime_.erase(name);
  std::string failed;
  for (const size_t i : ListedReplicas()) {
    const Status status = client_->UnloadLora(i, name);
    if (!status.ok() && status.error_code() != StatusCode::kNotFound) {
      failed += fmt::format("{}{}: {}", failed.empty() ? "" : "; ", client_->router().replica(i).address,
                            status.error_message());
    }
  }
  if (!failed.empty()) {  // the gateway routes nothing under it; a replica that still holds it frees it on restart
    spdlog::warn("LoRA adapter {} unloaded here, but not on every replica: {}", name, failed);
    return {StatusCode::kUnavailable, fmt::format("lora_name \"{}\" is no longer served, but {}", name, failed)};
  }
  spdlog::info("LoRA adapter {} unloaded", name);
  return {};
}

void LoraAdmin::SyncReplica(const std::string& address) {
  std::lock_guard lock(mu_);
  if (runtime_.empty()) return;
  ReplicaRouter& router = client_->router();
  for (size_t i = 0; i < router.size(); ++i) {
    if (router.replica(i).address != address || !router.replica(i).listed.load()) continue;
    for (const auto& [name, path] : runtime_) {
      const Status status = client_->LoadLora(i, name, path);
      if (!status.ok() && status.error_code() != StatusCode::kAlreadyExists) {
        spdlog::warn("LoRA adapter {} could not be loaded on the new replica {}: {}", name, address,
                     status.error_message());
      }
    }
    spdlog::info("new replica {}: {} run-time LoRA adapter(s) loaded", address, runtime_.size());
  }
}

}  // namespace ferry::gateway
