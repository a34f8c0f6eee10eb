// Chooses the scheduler replica for each request: among healthy replicas, the one with the
// fewest outstanding tokens, preferring the replica that recently served the same prompt
// prefix (its KV blocks may still be cached) unless that one is much busier. Replicas whose
// health check fails three times in a row leave the rotation until it passes again; with none
// in rotation, requests still go to the least loaded replica (a check can be wrong). No gRPC:
// the check itself is a probe the scheduler client gives (grpc_scheduler_client.h).
#pragma once

#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <functional>
#include <list>
#include <memory>
#include <mutex>
#include <optional>
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
    int32_t failed_checks = 0;  // consecutive failed health checks (the health thread's alone)
  };

  // Replica i is at addresses[i] (for logs); probe(i) asks it whether it is healthy now.
  ReplicaRouter(std::vector<std::string> addresses, std::function<bool(size_t)> probe);
  ~ReplicaRouter();

  // A healthy replica not in `exclude`, or nullopt when none is left.
  std::optional<size_t> Choose(uint64_t prefix_key, const std::vector<size_t>& exclude);
  Replica& replica(size_t i) { return *replicas_[i]; }
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

  std::vector<std::unique_ptr<Replica>> replicas_;
  const std::function<bool(size_t)> probe_;
  std::mutex affinity_mu_;
  std::list<uint64_t> affinity_lru_;  // most recent first; guarded by affinity_mu_
  std::unordered_map<uint64_t, std::pair<size_t, std::list<uint64_t>::iterator>> affinity_;
  std::mutex health_mu_;
  std::condition_variable health_cv_;
  bool stopping_ = false;
  std::thread health_thread_;
};

// Key of a prompt's leading tokens (up to 256), for prefix affinity.
uint64_t PrefixKey(const google::protobuf::RepeatedField<int32_t>& prompt);

}  // namespace ferry::gateway
