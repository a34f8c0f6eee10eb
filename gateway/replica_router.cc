#include "gateway/replica_router.h"

#include <algorithm>

#include <stdexcept>

#include <fmt/format.h>
#include <spdlog/spdlog.h>

namespace ferry::gateway {

namespace {
constexpr size_t kAffinityEntries = 4096;
// Affinity wins unless the preferred replica has this many more outstanding tokens than the least
// loaded one: a cached prefix saves its prefill, not more.
constexpr int64_t kAffinitySlackTokens = 4096;
constexpr int32_t kFailedChecksToEject = 3;
}  // namespace

uint64_t PrefixKey(const google::protobuf::RepeatedField<int32_t>& prompt) {
  uint64_t h = 1469598103934665603ull;
  const int n = std::min(prompt.size(), 256);
  for (int i = 0; i < n; ++i) h = (h ^ static_cast<uint32_t>(prompt[i])) * 1099511628211ull;
  return h;
}

ReplicaRouter::ReplicaRouter(std::vector<std::string> addresses, std::function<bool(size_t)> probe)
    : probe_(std::move(probe)) {
  for (const std::string& address : addresses) Add(address, false);
}

size_t ReplicaRouter::Add(const std::string& address, bool reuse) {
  std::lock_guard lock(membership_mu_);
  const size_t n = size();
  for (size_t i = 0; i < n && reuse; ++i) {
    Replica& r = *slots_[i];
    if (r.address != address) continue;
    if (!r.listed.exchange(true)) {
      r.healthy = true;  // checked again from the next round
      spdlog::info("scheduler replica {} listed again", address);
    }
    return i;
  }
  if (n == kMaxReplicas) {
    throw std::length_error(fmt::format("scheduler replica {}: the gateway has had {} replica addresses, its limit",
                                        address, kMaxReplicas));
  }
  slots_[n] = std::make_unique<Replica>();
  slots_[n]->address = address;
  count_.store(n + 1, std::memory_order_release);
  return n;
}

bool ReplicaRouter::Remove(const std::string& address) {
  std::lock_guard lock(membership_mu_);
  for (size_t i = 0; i < size(); ++i) {
    if (slots_[i]->address == address) return slots_[i]->listed.exchange(false);
  }
  return false;
}

ReplicaRouter::~ReplicaRouter() {
  {
    std::lock_guard lock(health_mu_);
    stopping_ = true;
  }
  health_cv_.notify_all();
  if (health_thread_.joinable()) health_thread_.join();
}

void ReplicaRouter::SetAdapters(size_t i, Adapters adapters) {
  auto shared = std::make_shared<const Adapters>(std::move(adapters));
  std::lock_guard lock(adapters_mu_);
  if (adapters_.size() <= i) adapters_.resize(i + 1);
  adapters_[i] = std::move(shared);
}

int ReplicaRouter::AdapterFit(size_t i, const std::string& adapter) const {
  std::shared_ptr<const Adapters> a;
  {
    std::lock_guard lock(adapters_mu_);
    if (i < adapters_.size()) a = adapters_[i];
  }
  if (a == nullptr) return -1;
  if (std::binary_search(a->running.begin(), a->running.end(), adapter)) return 2;
  return std::binary_search(a->served.begin(), a->served.end(), adapter) ? 1 : 0;
}

std::optional<size_t> ReplicaRouter::Choose(uint64_t prefix_key, const std::vector<size_t>& exclude,
                                            const std::string& adapter) {
  const size_t n = size();
  auto excluded = [&](size_t i) { return std::find(exclude.begin(), exclude.end(), i) != exclude.end(); };
  auto healthy = [&](size_t i) { return slots_[i]->listed && slots_[i]->healthy && !excluded(i); };
  auto load = [&](size_t i) { return slots_[i]->outstanding_tokens.load(); };
  // Under an adapter: only the replicas a health check found serving it, healthy or not, unless
  // none is (a name no health check has seen yet, or replicas not checked yet): then every one, and
  // the replica's scheduler answers. A replica not checked yet gets none of an adapter's requests
  // another is known to serve (a new replica may still be loading it).
  std::vector<int> fit(adapter.empty() ? 0 : n, 1);
  bool restricted = false;
  for (size_t i = 0; i < fit.size(); ++i) {
    fit[i] = AdapterFit(i, adapter);
    restricted = restricted || (slots_[i]->listed && fit[i] > 0);
  }
  auto serves = [&](size_t i) { return !restricted || fit[i] > 0; };
  auto allowed = [&](size_t i) { return healthy(i) && serves(i); };
  std::optional<size_t> best, warm;
  for (size_t i = 0; i < n; ++i) {
    if (!allowed(i)) continue;
    if (!best || load(i) < load(*best)) best = i;
    if (!adapter.empty() && fit[i] == 2 && (!warm || load(i) < load(*warm))) warm = i;
  }
  if (!best) {
    // Every replica is out of rotation: try the least loaded one not tried yet anyway (Envoy's
    // panic routing). A health check can be wrong about a slow but working scheduler, and a
    // replica that is really down answers UNAVAILABLE, which is what refusing here would say.
    for (size_t i = 0; i < n; ++i) {
      if (!slots_[i]->listed || excluded(i) || !serves(i)) continue;
      if (!best || load(i) < load(*best)) best = i;
    }
    return best;
  }
  // Its weights already in memory spare the workers a read, as a cached prefix spares a prefill.
  if (warm && load(*warm) <= load(*best) + kAffinitySlackTokens) return warm;
  std::lock_guard lock(affinity_mu_);
  auto it = affinity_.find(prefix_key);
  if (it != affinity_.end() && allowed(it->second.first) &&
      load(it->second.first) <= load(*best) + kAffinitySlackTokens) {
    return it->second.first;
  }
  return best;
}

void ReplicaRouter::Served(size_t i, uint64_t prefix_key) {
  std::lock_guard lock(affinity_mu_);
  if (auto it = affinity_.find(prefix_key); it != affinity_.end()) {
    affinity_lru_.erase(it->second.second);
    affinity_.erase(it);
  }
  affinity_lru_.push_front(prefix_key);
  affinity_[prefix_key] = {i, affinity_lru_.begin()};
  if (affinity_lru_.size() > kAffinityEntries) {
    affinity_.erase(affinity_lru_.back());
    affinity_lru_.pop_back();
  }
}

void ReplicaRouter::MarkUnhealthy(size_t i) {
  if (slots_[i]->healthy.exchange(false)) {
    spdlog::warn("scheduler replica {} out of rotation", slots_[i]->address);
  }
}

bool ReplicaRouter::AnyHealthy() const {
  for (size_t i = 0; i < size(); ++i) {
    if (slots_[i]->listed && slots_[i]->healthy) return true;
  }
  return false;
}

void ReplicaRouter::StartHealthChecks(std::chrono::milliseconds interval) {
  health_thread_ = std::thread([this, interval] { HealthLoop(interval); });
}

void ReplicaRouter::HealthLoop(std::chrono::milliseconds interval) {
  std::unique_lock lock(health_mu_);
  while (!stopping_) {
    lock.unlock();
    CheckOnce();
    lock.lock();
    health_cv_.wait_for(lock, interval, [&] { return stopping_; });
  }
}

void ReplicaRouter::CheckOnce() {
  for (size_t i = 0; i < size(); ++i) {
    Replica* r = slots_[i].get();
    if (!r->listed) continue;
    const bool ok = probe_(i);
    // One slow answer from a busy scheduler is not an outage: out of rotation only after
    // kFailedChecksToEject failures in a row; back at the first success.
    r->failed_checks = ok ? 0 : r->failed_checks + 1;
    const bool healthy = ok || (r->healthy && r->failed_checks < kFailedChecksToEject);
    if (healthy != r->healthy.exchange(healthy)) {
      spdlog::info("scheduler replica {} {}", r->address, healthy ? "back in rotation" : "out of rotation");
    }
  }
}

}  // namespace ferry::gateway
