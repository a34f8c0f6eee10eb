// Finds the scheduler replicas while the gateway serves: the --scheduler flags (always listed),
// the lines of a watched file (--scheduler-file: one host:port each; # comments) and the addresses
// a DNS name resolves to (--scheduler-dns NAME:PORT: a headless Service's records, one per ready
// pod). Every --discovery-interval-s the sources are read again and the scheduler client is given
// their union when it changed: a new replica is routed to within an interval (and its first health
// check), a vanished one is unlisted and drained (the requests on it finish, none is sent to it).
// A source that cannot be read (the file missing, DNS failing) leaves the replicas as they are,
// with a warning; a name with no records is an empty set (a Service with no ready pod).
#pragma once

#include <chrono>
#include <condition_variable>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "gateway/grpc_scheduler_client.h"

namespace ferry::gateway {

struct DiscoverySources {
  std::vector<std::string> static_addresses;  // --scheduler
  std::string file;                           // --scheduler-file
  std::string dns;                            // --scheduler-dns NAME:PORT
  bool dynamic() const { return !file.empty() || !dns.empty(); }
};

// The addresses the sources give now (sorted, without duplicates), or nullopt with `error` set
// when a dynamic source could not be read.
std::optional<std::vector<std::string>> Discover(const DiscoverySources& sources, std::string* error);

// Host:port lines of a scheduler file: blanks and # comments skipped, whitespace trimmed. Throws
// std::invalid_argument naming the line of an entry that is not host:port.
std::vector<std::string> ParseSchedulerFile(const std::string& text, const std::string& path);

class ReplicaDiscovery {
 public:
  // Polls the sources every `interval` on a thread of its own, giving `client` their union when it
  // changes. `current` is what the client was made with.
  // on_added (optional): called on the polling thread with each address newly given to the client,
  // after it is (LoraAdmin::SyncReplica).
  ReplicaDiscovery(DiscoverySources sources, std::shared_ptr<DynamicSchedulerClient> client,
                   std::vector<std::string> current, std::chrono::milliseconds interval,
                   std::function<void(const std::string&)> on_added = nullptr);
  ~ReplicaDiscovery();
  ReplicaDiscovery(const ReplicaDiscovery&) = delete;
  ReplicaDiscovery& operator=(const ReplicaDiscovery&) = delete;

  // One round (the thread's; tests call it).
  void PollOnce();

 private:
  const DiscoverySources sources_;
  const std::shared_ptr<DynamicSchedulerClient> client_;
  const std::function<void(const std::string&)> on_added_;
  std::vector<std::string> current_;
  std::string last_error_;  // logged once per distinct error
  std::mutex mu_;
  std::condition_variable cv_;
  bool stopping_ = false;
  std::thread thread_;
};

}  // namespace ferry::gateway
