// The tensor-parallel shard plan (shard_plan.h).
#include <algorithm>
#include <stdexcept>
#include <string>

#include "worker/arch/shard_plan.h"

namespace ferry::worker {
namespace {

[[noreturn]] void Unsplittable(const ModelConfig& c, int32_t size, const std::string& what) {
  throw std::runtime_error(c.name + ": cannot split across " + std::to_string(size) +
                           " tensor-parallel ranks: " + what);
}

}  // namespace

ShardPlan PlanShard(const ModelConfig& c, int32_t rank, int32_t size) {
  if (size < 1 || rank < 0 || rank >= size) {
    throw std::runtime_error("bad tensor-parallel rank " + std::to_string(rank) + " of " +
                             std::to_string(size));
  }
  const int32_t heads = c.num_attention_heads, kv_heads = c.num_key_value_heads;
  if (heads % size != 0) Unsplittable(c, size, std::to_string(heads) + " attention heads");
  if (c.intermediate_size % size != 0) {
    Unsplittable(c, size, "intermediate_size " + std::to_string(c.intermediate_size));
  }
  if (kv_heads >= size ? kv_heads % size != 0 : size % kv_heads != 0) {
    Unsplittable(c, size, std::to_string(kv_heads) + " KV heads");
  }
  ShardPlan p;
  p.rank = rank;
  p.size = size;
  p.num_q_heads = heads / size;
  p.q_head_begin = rank * p.num_q_heads;
  // Fewer KV heads than ranks: each rank keeps the one KV head its query heads read
  // (query head h reads KV head h / (heads / kv_heads)), replicated across ranks.
  p.num_kv_heads = std::max(1, kv_heads / size);
  p.kv_head_begin = p.q_head_begin / (heads / kv_heads);
  p.inter_size = c.intermediate_size / size;
  p.inter_begin = rank * p.inter_size;
  // Vocabulary padded up to a multiple of size; the padding rows are zero and dropped again.
  p.vocab_rows = (int64_t{c.vocab_size} + size - 1) / size;
  p.vocab_begin = rank * p.vocab_rows;
  return p;
}

}  // namespace ferry::worker
