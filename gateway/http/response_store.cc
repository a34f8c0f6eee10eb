#include "gateway/http/response_store.h"

namespace ferry::gateway::http {

namespace {

size_t HistoryBytes(const std::vector<ChatMessage>& history) {
  size_t bytes = 0;
  for (const ChatMessage& m : history) {
    bytes += m.role.size() + m.content.size();
    bytes += m.tool_call_id.size();
    for (const ChatToolCall& c : m.tool_calls) bytes += c.id.size() + c.name.size() + c.arguments.dump().size();
  }
  return bytes;
}

}  // namespace

ResponseStore::ResponseStore(Options options) : options_(options) {}

void ResponseStore::Put(const std::string& id, const std::string& tenant, Entry entry, Clock::time_point now) {
  const size_t bytes = entry.response.dump().size() + HistoryBytes(entry.history);
  std::lock_guard lock(mu_);
  ExpireLocked(now);
  if (auto it = by_id_.find(id); it != by_id_.end()) EraseLocked(it);
  if (bytes > options_.max_bytes) return;  // larger than the whole store: never kept
  by_id_[id] = Stored{tenant, std::move(entry), bytes, now};
  order_.emplace_back(now, id);
  bytes_ += bytes;
  while (by_id_.size() > options_.max_entries || bytes_ > options_.max_bytes) {
    const auto [at, oldest] = order_.front();
    order_.pop_front();
    if (auto it = by_id_.find(oldest); it != by_id_.end() && it->second.at == at) EraseLocked(it);
  }
}

std::optional<ResponseStore::Entry> ResponseStore::Get(const std::string& id, const std::string& tenant,
                                                       Clock::time_point now) {
  std::lock_guard lock(mu_);
  ExpireLocked(now);
  auto it = by_id_.find(id);
  if (it == by_id_.end() || it->second.tenant != tenant) return std::nullopt;
  return it->second.entry;
}

bool ResponseStore::Delete(const std::string& id, const std::string& tenant, Clock::time_point now) {
  std::lock_guard lock(mu_);
  ExpireLocked(now);
  auto it = by_id_.find(id);
  if (it == by_id_.end() || it->second.tenant != tenant) return false;
  EraseLocked(it);
  return true;
}

size_t ResponseStore::size() {
  std::lock_guard lock(mu_);
  return by_id_.size();
}

void ResponseStore::ExpireLocked(Clock::time_point now) {
  while (!order_.empty() && now - order_.front().first >= options_.retention) {
    const auto [at, id] = order_.front();
    order_.pop_front();
    if (auto it = by_id_.find(id); it != by_id_.end() && it->second.at == at) EraseLocked(it);
  }
}

void ResponseStore::EraseLocked(std::map<std::string, Stored>::iterator it) {
  bytes_ -= it->second.bytes;
  by_id_.erase(it);
}

}  // namespace ferry::gateway::http
