// Tensor parallelism's split of one model: which heads, MLP columns and vocabulary rows each
// rank holds. The same for every architecture served and for both engines (the CPU engine over
// Gloo, the GPU engine over NCCL), so a rank of either computes the same slice.
#pragma once

#include <cstdint>

#include "worker/arch/model_config.h"

namespace ferry::worker {

// This rank's slice of the heads, the MLP and the vocabulary (all of them when unsharded).
struct ShardPlan {
  int32_t rank = 0;
  int32_t size = 1;
  int32_t q_head_begin = 0, num_q_heads = 0;    // query heads [begin, begin + num)
  int32_t kv_head_begin = 0, num_kv_heads = 0;  // KV heads; replicated when fewer than ranks
  int64_t inter_begin = 0, inter_size = 0;      // intermediate columns
  int64_t vocab_begin = 0, vocab_rows = 0;      // LM head rows; vocab_rows * size >= vocab
};
// Throws std::runtime_error when the model cannot be split that way.
ShardPlan PlanShard(const ModelConfig& config, int32_t rank, int32_t size);

}  // namespace ferry::worker
