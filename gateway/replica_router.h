// Chooses the scheduler replica for each request: among healthy replicas, the one with the
// fewest outstanding tokens, preferring the replica that recently served the same prompt
// prefix (its KV blocks may still be cached) unless that one is much busier. A request under a
// LoRA adapter goes to a replica that serves it (as its last health check said; every replica
// while none is known to, and a replica not checked yet only then), preferring one running it now (its weights are in the workers' memory:
// vLLM's lora_requests_info, as the Kubernetes inference gateway reads it) unless that one is much
// busier. Replicas whose
// health check fails three times in a row leave the rotation until it passes again; with none
// in rotation, requests still go to the least loaded replica (a check can be wrong). No gRPC:
// the check itself is a probe the scheduler client gives (grpc_scheduler_client.h).
//
// Membership changes while requests run (replica discovery, gateway/replica_discovery.h): Add
// appends a replica (or lists again one that was removed, at its old index) and Remove unlists one.
// An unlisted replica is never chosen nor checked; requests already on it finish there (its
// scheduler drains them when it is stopped). Indices are stable: a replica keeps its slot for the
// router's life (at most kMaxReplicas addresses in all).
#pragma once

#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <functional>
#include <list>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <unordered_map>
#include <vector>

#include <google/protobuf/repeated_field.h>

namespace ferry::gateway {

class ReplicaRouter {
 public:
  struct Replica {
    std::string address;
    std::atomic<int64_t> outstanding_tokens{0};
    std::atomic<bool> healthy{true};
    std::atomic<bool> listed{true};  // false once removed: never chosen, never checked
    int32_t failed_checks = 0;  // consecutive failed health checks (the health thread's alone)
  };
  // A replica's LoRA adapters at its last health check, each sorted.
  struct Adapters {
    std::vector<std::string> served;
    std::vector<std::string> running;
  };
  static constexpr size_t kMaxReplicas = 1024;

  // Replica i is at addresses[i] (for logs); probe(i) asks it whether it is healthy now.
  ReplicaRouter(std::vector<std::string> addresses, std::function<bool(size_t)> probe);
  ~ReplicaRouter();

  // Lists `address` (healthy until checked): its index, old or new (with `reuse` false always a new
  // one: --scheduler flags may name one replica twice, as two). Throws std::length_error past
  // kMaxReplicas replicas.
  size_t Add(const std::string& address, bool reuse = true);
  // Unlists `address`; false when it is not listed.
  bool Remove(const std::string& address);
  // Replicas ever added (listed or not): valid indices are below it.
  size_t size() const { return count_.load(std::memory_order_acquire); }
  // A healthy listed replica not in `exclude`, or nullopt when none is left.
  // adapter: the request's LoRA adapter (empty: the base model).
  std::optional<size_t> Choose(uint64_t prefix_key, const std::vector<size_t>& exclude, const std::string& adapter = "");
  // What replica i's health check found of its adapters (SchedulerState.lora_names and
  // running_lora_adapters). Any thread.
  void SetAdapters(size_t i, Adapters adapters);
  Replica& replica(size_t i) { return *slots_[i]; }
  // Records that replica i served prefix_key (for affinity).
  void Served(size_t i, uint64_t prefix_key);
  // Takes replica i out of rotation until its health check passes again.
  void MarkUnhealthy(size_t i);
  // Polls every replica's GetState every interval to keep `healthy` current.
  void StartHealthChecks(std::chrono::milliseconds interval);
  bool AnyHealthy() const;
  // One round of health checks (what the health thread runs every interval; tests call it).
  void CheckOnce();

 private:
  void HealthLoop(std::chrono::milliseconds interval);

  // How a replica fits a request's adapter: -1 not known (no health check yet), 0 known not to
  // serve it, 1 serves it, 2 runs it now.
  int AdapterFit(size_t i, const std::string& adapter) const;

  // Written once each, below count_ (published with release): readers need no lock.
  std::unique_ptr<std::unique_ptr<Replica>[]> slots_{new std::unique_ptr<Replica>[kMaxReplicas]};
  std::atomic<size_t> count_{0};
  std::mutex membership_mu_;  // Add and Remove
  const std::function<bool(size_t)> probe_;
  std::mutex affinity_mu_;
  std::list<uint64_t> affinity_lru_;  // most recent first; guarded by affinity_mu_
  std::unordered_map<uint64_t, std::pair<size_t, std::list<uint64_t>::iterator>> affinity_;
  mutable std::mutex adapters_mu_;
  std::vector<std::shared_ptr<const Adapters>> adapters_;  // by replica index; null: not known yet
  std::mutex health_mu_;
  std::condition_variable health_cv_;
  bool stopping_ = false;
  std::thread health_thread_;
};

// Key of a prompt's leading tokens (up to 256), for prefix affinity.
uint64_t PrefixKey(const google::protobuf::RepeatedField<int32_t>& prompt);

}  // namespace ferry::gateway
