// Speculative decoding's "draft_model" method: a small model sharing the target's vocabulary
// proposes its greedy continuation. It keeps its own paged KV cache, addressed by the target's
// block ids (same block size and count), so it needs no block table of its own: a sequence's
// draft K/V sits in the same blocks at the same positions as the target's.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "worker/model/cpu_model.h"

namespace ferry::worker {

class DraftProposer {
 public:
  // One sequence's proposal: k drafts, written to drafts[first, first + k).
  struct Request {
    const std::vector<int32_t>* tokens = nullptr;       // every known token
    const std::vector<int32_t>* block_table = nullptr;  // covers positions < tokens.size() + k - 1
    int32_t* draft_computed = nullptr;  // positions whose draft K/V is valid; advanced to tokens.size()
    int32_t k = 0;
    size_t first = 0;
  };

  // Loads the draft checkpoint (unsharded on every tensor-parallel rank: each proposes the same).
  // Throws std::runtime_error naming the directory when its vocabulary differs from `vocab_size` or
  // it holds fewer positions than `max_model_len`.
  DraftProposer(const std::string& dir, const ModelOptions& options, int32_t num_blocks, int32_t block_size,
                int32_t vocab_size, int32_t max_model_len);

  // Catches each sequence's draft K/V up with its known tokens (one batched pass), then proposes
  // k tokens, each the argmax after the ones before (a batched pass per draft position). Greedy
  // drafts are a point mass, which the runner's verification assumes.
  void Propose(const std::vector<Request>& requests, std::vector<int32_t>& drafts);

  // After verification: the draft K/V stays valid up to the last accepted draft it computed.
  static int32_t ComputedAfter(int32_t known, int32_t k, int32_t accepted) {
    return known + std::min(accepted, k - 1);
  }

 private:
  std::unique_ptr<CpuModel> model_;
  std::unique_ptr<KvCache> cache_;
  int32_t block_size_;
  ForwardBatch batch_;
};

}  // namespace ferry::worker
