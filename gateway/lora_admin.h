// The admin API's LoRA calls on domain types, shared by the HTTP (POST /v1/load_lora_adapter,
// /v1/unload_lora_adapter) and gRPC (ferry.v1.LoraAdapters) fronts: a load goes to every listed
// replica (all or none keep it: the ones that loaded it unload it again when another refuses) and
// then into the catalog; an unload leaves the catalog first (new requests are refused 404 at once)
// and then every replica, where the requests already accepted under it finish with it. One call at
// a time: two loads of one name never race across replicas. Who may call is the front's check
// (Authenticator::IsAdmin).
#pragma once

#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "gateway/lora_catalog.h"
#include "gateway/scheduler_client.h"
#include "gateway/status.h"

namespace ferry::gateway {

class LoraAdmin {
 public:
  LoraAdmin(std::shared_ptr<LoraCatalog> catalog, std::shared_ptr<SchedulerClient> client)
      : catalog_(std::move(catalog)), client_(std::move(client)) {}

  // INVALID_ARGUMENT (the name, an empty path, what a replica found wrong with the adapter),
  // ALREADY_EXISTS (served: unload it first), UNAVAILABLE (no replica, or one could not be reached).
  Status Load(const std::string& name, const std::string& path);
  // NOT_FOUND when the name is not served.
  Status Unload(const std::string& name);
  // A replica listed after the loads (replica discovery): every adapter loaded at run time is loaded
  // there too (the router sends it none of their requests until its health check reports them).
  // Failures are logged: the replica then serves the others.
  void SyncReplica(const std::string& address);
  std::vector<std::string> Names() const { return catalog_->Names(); }

 private:
  std::vector<size_t> ListedReplicas();

  const std::shared_ptr<LoraCatalog> catalog_;
  const std::shared_ptr<SchedulerClient> client_;
  std::mutex mu_;  // one call at a time
  std::map<std::string, std::string> runtime_;  // adapters loaded here at run time: name -> path
};

}  // namespace ferry::gateway
