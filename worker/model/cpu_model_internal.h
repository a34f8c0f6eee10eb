// CpuModel's per-layer weights and activation workspace, shared by cpu_model.cc (forward)
// and cpu_weights.cc (loading). Not for other users.
#pragma once

#include <optional>
#include <vector>

#include "kernels/cpu/lora.h"
#include "worker/model/linear.h"
#include "worker/model/cpu_model.h"

namespace ferry::worker {

// One decoder layer as this rank holds it (see ShardPlan). Fused projections: qkv produces
// [q | k | v] per row, gate_up produces [gate | up] per row.
struct CpuModel::Layer {
  std::vector<float> input_norm;  // [hidden]
  std::vector<float> post_norm;   // [hidden]
  std::vector<float> q_norm;      // [head_dim], qk_norm only
  std::vector<float> k_norm;      // [head_dim], qk_norm only
  std::optional<Linear> qkv;      // [(q_heads + 2 * kv_heads) * d, hidden], biased when qkv_bias
  std::optional<Linear> o_proj;   // [hidden, q_heads * d]
  std::optional<Linear> gate_up;  // [2 * inter, hidden]
  std::optional<Linear> down;     // [hidden, inter]
};

// Activation buffers reused across steps; they only grow, so steady decoding allocates
// nothing. Sizes are per this rank's shard.
struct CpuModel::Workspace {
  std::vector<float> x;        // [num_tokens, hidden] residual stream
  std::vector<float> h;        // [num_tokens, hidden] normed input of a block
  std::vector<float> partial;  // [num_tokens, hidden] a row-parallel projection before all-reduce
  std::vector<float> rope;     // [num_tokens, head_dim] cos | sin per token
  std::vector<float> qkv;      // [num_tokens, (q_heads + 2 * kv_heads) * d]
  std::vector<float> attn;     // [num_tokens, q_heads * d]
  std::vector<float> gate_up;  // [num_tokens, 2 * inter]
  std::vector<float> act;      // [num_tokens, inter]
  std::vector<float> last;     // [num_logits_rows, hidden]
  std::vector<float> local_logits;  // [num_logits_rows, vocab_rows] this rank's vocab slice
  std::vector<float> gathered;      // [size, num_logits_rows, vocab_rows]
  std::vector<float> logits;        // [num_logits_rows, vocab]
  // The step's token rows of each adapter in the batch (GroupLoraRows); `used` of them valid.
  struct LoraGroup {
    const LoraAdapter* adapter = nullptr;
    std::vector<int32_t> rows;
  };
  std::vector<LoraGroup> lora_groups;
  size_t lora_groups_used = 0;
  std::vector<kernels::cpu::LoraSegment> lora_segments;  // one projection's, ApplyLora's scratch
};

}  // namespace ferry::worker
