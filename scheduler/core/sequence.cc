#include "scheduler/core/sequence.h"

#include <algorithm>

namespace ferry::scheduler {

const char* FinishKindName(FinishKind kind) {
  switch (kind) {
    case FinishKind::kNone: return "none";
    case FinishKind::kLength: return "length";
    case FinishKind::kEos: return "eos";
    case FinishKind::kStopToken: return "stop_token";
    case FinishKind::kAborted: return "aborted";
    case FinishKind::kCancelled: return "cancelled";
    case FinishKind::kDeadlineExceeded: return "deadline_exceeded";
    case FinishKind::kTimeout: return "timeout";
    case FinishKind::kUnavailable: return "unavailable";
    case FinishKind::kQueueTimeout: return "queue_timeout";
    case FinishKind::kRefused: return "refused";
    case FinishKind::kNotFound: return "not_found";
  }
  return "unknown";
}

std::span<const uint64_t> Sequence::BlockHashes(int32_t num_blocks, int32_t block_size) {
  while (static_cast<int32_t>(block_hashes.size()) < num_blocks) {
    const size_t i = block_hashes.size();
    const uint64_t parent = i == 0 ? RootBlockHash(spec.lora_name) : block_hashes.back();
    block_hashes.push_back(HashBlock(
        parent, std::span<const int32_t>(tokens).subspan(i * static_cast<size_t>(block_size),
                                                         static_cast<size_t>(block_size))));
  }
  return std::span<const uint64_t>(block_hashes).first(static_cast<size_t>(num_blocks));
}

void Sequence::ResetProgress() {
  lease.Reset();
  num_computed = 0;
  num_lookahead = 0;
  num_published_blocks = 0;
  last_published = kNoBlock;
  is_publishing_stopped = false;
}

void WaitingQueue::CountLane(const Sequence* seq, int32_t delta) {
  if (seq->lane_index < 0) return;
  const auto i = static_cast<size_t>(seq->lane_index);
  if (lane_counts_.size() <= i) lane_counts_.resize(i + 1, 0);
  lane_counts_[i] += delta;
}

void WaitingQueue::PushByArrival(Sequence* seq) {
  auto& queue = by_priority_[seq->spec.priority];
  // Requests usually arrive in order, so this scans from the back and stops at once.
  auto pos = queue.end();
  while (pos != queue.begin() && (*std::prev(pos))->spec.arrival > seq->spec.arrival) --pos;
  queue.insert(pos, seq);
  CountLane(seq, 1);
  ++size_;
}

void WaitingQueue::PushFront(Sequence* seq) {
  by_priority_[seq->spec.priority].push_front(seq);
  CountLane(seq, 1);
  ++size_;
}

bool WaitingQueue::Remove(const Sequence* seq) {
  auto it = by_priority_.find(seq->spec.priority);
  if (it == by_priority_.end()) return false;
  auto& queue = it->second;
  auto pos = std::find(queue.begin(), queue.end(), seq);
  if (pos == queue.end()) return false;
  queue.erase(pos);
  if (queue.empty()) by_priority_.erase(it);
  CountLane(seq, -1);
  --size_;
  return true;
}

bool WaitingQueue::SeekHead(Cursor& c, TimePoint now, const QueueOrder& order) {
  const std::deque<Sequence*>& q = *c.queue;
  if (!order.can_defer()) return c.next < q.size();
  while (true) {
    while (c.next < q.size() && order.Defers(*q[c.next], now) != c.deferred_pass) ++c.next;
    if (c.next < q.size()) return true;
    if (c.deferred_pass) return false;
    c.deferred_pass = true;
    c.next = 0;
  }
}

Sequence* WaitingQueue::NextInOrder(TimePoint now, const QueueOrder& order) const {
  Cursor* best = nullptr;
  int64_t best_priority = 0;
  for (Cursor& c : cursors_) {
    if (!SeekHead(c, now, order)) continue;
    const Sequence& head = *(*c.queue)[c.next];
    const int64_t p = order.EffectivePriority(head, now);
    const Sequence* best_head = best == nullptr ? nullptr : (*best->queue)[best->next];
    // Deques are visited by base priority, highest first: a tie in effective
    // priority goes to the earlier arrival, then to the higher base priority.
    if (best == nullptr || (best->deferred_pass && !c.deferred_pass) ||
        (best->deferred_pass == c.deferred_pass &&
         (p > best_priority || (p == best_priority && head.spec.arrival < best_head->spec.arrival)))) {
      best = &c;
      best_priority = p;
    }
  }
  return best == nullptr ? nullptr : (*best->queue)[best->next++];
}

}  // namespace ferry::scheduler
