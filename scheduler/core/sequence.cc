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
  }
  return "unknown";
}

void WaitingQueue::PopFront() {
  auto it = by_priority_.begin();
  it->second.pop_front();
  if (it->second.empty()) by_priority_.erase(it);
  --size_;
}

void WaitingQueue::PushByArrival(Sequence* seq) {
  auto& queue = by_priority_[seq->spec.priority];
  // Requests usually arrive in order, so this scans from the back and stops at once.
  auto pos = queue.end();
  while (pos != queue.begin() && (*std::prev(pos))->spec.arrival > seq->spec.arrival) --pos;
  queue.insert(pos, seq);
  ++size_;
}

void WaitingQueue::PushFront(Sequence* seq) {
  by_priority_[seq->spec.priority].push_front(seq);
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
  --size_;
  return true;
}

}  // namespace ferry::scheduler
