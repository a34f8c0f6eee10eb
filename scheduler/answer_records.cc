#include "scheduler/answer_records.h"

#include <xxhash.h>

#include <google/protobuf/io/coded_stream.h>
#include <google/protobuf/io/zero_copy_stream_impl_lite.h>

namespace ferry::scheduler {

uint64_t SubmitFingerprint(const ferry::v1::SubmitRequest& request) {
  ferry::v1::SubmitRequest copy = request;
  copy.clear_request_id();
  std::string bytes;
  {
    google::protobuf::io::StringOutputStream out(&bytes);
    google::protobuf::io::CodedOutputStream coded(&out);
    coded.SetSerializationDeterministic(true);  // map fields in key order
    copy.SerializeToCodedStream(&coded);
  }
  return XXH3_64bits(bytes.data(), bytes.size());  // the prefix cache's hash (block_manager.cc)
}

std::optional<AnswerRecords::Record> AnswerRecords::Find(const std::string& key, Clock::time_point now) {
  std::lock_guard lock(mu_);
  EvictLocked(now);
  auto it = entries_.find(key);
  if (it == entries_.end()) return std::nullopt;
  return it->second.record;
}

void AnswerRecords::Add(const std::string& key, Record record, Clock::time_point now) {
  size_t bytes = key.size() + sizeof(Entry);
  for (const auto& e : record.events) bytes += e.ByteSizeLong();
  std::lock_guard lock(mu_);
  if (bytes > max_bytes_) return;
  if (auto it = entries_.find(key); it != entries_.end()) {  // a newer run of the key replaces it
    bytes_ -= it->second.bytes;
    entries_.erase(it);
  }
  const uint64_t seq = next_seq_++;
  entries_.emplace(key, Entry{std::move(record), bytes, now, seq});
  order_.emplace_back(key, seq);
  bytes_ += bytes;
  EvictLocked(now);
}

size_t AnswerRecords::bytes() const {
  std::lock_guard lock(mu_);
  return bytes_;
}

void AnswerRecords::EvictLocked(Clock::time_point now) {
  while (!order_.empty()) {
    auto it = entries_.find(order_.front().first);
    if (it == entries_.end() || it->second.seq != order_.front().second) {  // evicted, or added again since
      order_.pop_front();
      continue;
    }
    const bool old = now - it->second.added > retention_;
    if (!old && bytes_ <= max_bytes_) break;
    bytes_ -= it->second.bytes;
    entries_.erase(it);
    order_.pop_front();
  }
}

}  // namespace ferry::scheduler
