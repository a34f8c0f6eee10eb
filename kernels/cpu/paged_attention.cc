#include "kernels/cpu/paged_attention.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <vector>

#include "kernels/cpu/cpu_kernels.h"

namespace ferry::kernels::cpu {
namespace {

constexpr int64_t kMinParallelWork = 1 << 18;

}  // namespace

void WriteKvCache(const KvCacheShape& shape, const float* k, const float* v,
                  const int32_t* slot_mapping, int64_t num_tokens, float* k_cache,
                  float* v_cache) {
  const int64_t row = int64_t{shape.num_kv_heads} * shape.head_dim;
  for (int64_t t = 0; t < num_tokens; ++t) {
    const int64_t slot = slot_mapping[t];
    if (slot < 0) continue;
    std::memcpy(k_cache + slot * row, k + t * row, row * sizeof(float));
    std::memcpy(v_cache + slot * row, v + t * row, row * sizeof(float));
  }
}

namespace {

// Everything one (sequence, query head) task needs, resolved from the params.
struct HeadTask {
  const float* q;            // [num_queries, q_stride] starting at this head
  float* out;                // same layout as q
  const int32_t* block_table;  // [max_blocks_per_seq]
  int64_t q_stride;          // floats between consecutive query tokens
  int32_t num_queries;
  int32_t context_len;
  int32_t kv_head;
};

// Key (or value) vector of this task's KV head at a sequence position.
inline const float* CacheRow(const float* cache, const PagedAttentionParams& p,
                             const int32_t* block_table, int32_t pos, int32_t kv_head) {
  const KvCacheShape& c = p.cache;
  const int64_t block = block_table[pos / c.block_size];
  const int64_t slot = block * c.block_size + pos % c.block_size;
  return cache + (slot * c.num_kv_heads + kv_head) * c.head_dim;
}

// One query token against keys 0..num_keys-1: two passes (scores, then weighted values) with
// the scores kept in `scores`, which is exact softmax without an online rescale.
void AttendOne(const PagedAttentionParams& p, const HeadTask& task, const float* q_vec,
               int32_t num_keys, float* scores, float* out_vec) {
  const int32_t d = p.cache.head_dim;
  float max_score = -INFINITY;
  for (int32_t j = 0; j < num_keys; ++j) {
    const float* k_vec = CacheRow(p.k_cache, p, task.block_table, j, task.kv_head);
    float dot = 0.f;
    for (int32_t i = 0; i < d; ++i) dot += q_vec[i] * k_vec[i];
    scores[j] = dot * p.scale;
    max_score = std::max(max_score, scores[j]);
  }
  float sum = 0.f;
  for (int32_t j = 0; j < num_keys; ++j) {
    scores[j] = std::exp(scores[j] - max_score);
    sum += scores[j];
  }
  float acc[kMaxHeadDim];
  std::fill(acc, acc + d, 0.f);
  for (int32_t j = 0; j < num_keys; ++j) {
    const float* v_vec = CacheRow(p.v_cache, p, task.block_table, j, task.kv_head);
    const float w = scores[j];
    for (int32_t i = 0; i < d; ++i) acc[i] += w * v_vec[i];
  }
  const float inv_sum = 1.f / sum;
  for (int32_t i = 0; i < d; ++i) out_vec[i] = acc[i] * inv_sum;
}

void RunHeadTask(const PagedAttentionParams& p, const HeadTask& task,
                 std::vector<float>& scores) {
  const int32_t total = task.context_len + task.num_queries;
  if (static_cast<int32_t>(scores.size()) < total) scores.resize(total);
  for (int32_t i = 0; i < task.num_queries; ++i) {
    // Causal: the query at position context_len + i sees keys up to and including itself.
    AttendOne(p, task, task.q + i * task.q_stride, task.context_len + i + 1, scores.data(),
              task.out + i * task.q_stride);
  }
}

}  // namespace

void PagedAttention(const PagedAttentionParams& p) {
  const int32_t group = p.num_heads / p.cache.num_kv_heads;
  const int64_t q_stride = int64_t{p.num_heads} * p.cache.head_dim;
  const int64_t num_tasks = int64_t{p.num_seqs} * p.num_heads;
  // Multiply-adds of the whole call; small steps run on the calling thread, where waking the
  // team (and its spin-waiting on a shared machine) would cost more than the work.
  int64_t work = 0;
  for (int32_t s = 0; s < p.num_seqs; ++s) {
    const int64_t n = p.query_start[s + 1] - p.query_start[s];
    work += n * (p.context_lens[s] + n) * p.num_heads * p.cache.head_dim;
  }
  // Dynamic: a long prefill's heads cost far more than a decode's.
#pragma omp parallel if (work >= kMinParallelWork)
  {
    std::vector<float> scores;  // per-thread, grown to the longest context it meets
#pragma omp for schedule(dynamic, 1)
    for (int64_t task_id = 0; task_id < num_tasks; ++task_id) {
      const int32_t s = static_cast<int32_t>(task_id / p.num_heads);
      const int32_t h = static_cast<int32_t>(task_id % p.num_heads);
      const int32_t begin = p.query_start[s];
      HeadTask task;
      task.q = p.q + begin * q_stride + int64_t{h} * p.cache.head_dim;
      task.out = p.out + begin * q_stride + int64_t{h} * p.cache.head_dim;
      task.block_table = p.block_tables + int64_t{s} * p.max_blocks_per_seq;
      task.q_stride = q_stride;
      task.num_queries = p.query_start[s + 1] - begin;
      task.context_len = p.context_lens[s];
      task.kv_head = h / group;
      RunHeadTask(p, task, scores);
    }
  }
}

}  // namespace ferry::kernels::cpu
