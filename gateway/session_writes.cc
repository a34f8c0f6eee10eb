#include "gateway/session_writes.h"

#include <unordered_set>

namespace ferry::gateway {

ferry::v1::SessionRequests TakeSessionWrite(ferry::v1::SessionRequests* pending, size_t max_bytes) {
  ferry::v1::SessionRequests out;
  out.Swap(pending);
  if (out.ByteSizeLong() <= max_bytes) return out;
  size_t bytes = 0;
  int keep = 0;
  for (; keep < out.submits_size(); ++keep) {
    const size_t size = out.submits(keep).ByteSizeLong();
    if (keep > 0 && bytes + size > max_bytes) break;
    bytes += size;
  }
  std::unordered_set<uint64_t> deferred;
  for (int i = keep; i < out.submits_size(); ++i) {
    deferred.insert(out.submits(i).stream_id());
    pending->add_submits()->Swap(out.mutable_submits(i));
  }
  out.mutable_submits()->DeleteSubrange(keep, out.submits_size() - keep);
  if (!deferred.empty()) {
    auto* cancels = out.mutable_cancels();
    int kept = 0;
    for (int i = 0; i < cancels->size(); ++i) {
      const uint64_t id = cancels->Get(i);
      if (deferred.count(id) > 0) {
        pending->add_cancels(id);
      } else {
        cancels->Set(kept++, id);
      }
    }
    cancels->Truncate(kept);
  }
  return out;
}

}  // namespace ferry::gateway
