// Paged attention and KV cache writes, compiled once per ISA (FERRY_ISA_NS; see impl.h).
// Exact two-pass softmax per query: scores for every visible key, then the weighted sum of
// values. A task holds `rows` = group heads x query tokens; each key and value row is
// converted to fp32 once and used by every row that sees it.
#include <omp.h>

#include <cmath>
#include <cstring>

#include "kernels/cpu/impl.h"
#include "kernels/cpu/vec.h"

#ifndef FERRY_ISA_NS
#error "compile with -DFERRY_ISA_NS=avx2 or avx512"
#endif

namespace ferry::kernels::cpu::FERRY_ISA_NS {
namespace {

// Copies one cache row (fp32 or bf16) into dst as fp32, zero-padded to `padded` floats.
inline void LoadRow(const void* cache, KvDtype dtype, int64_t element, int32_t dim,
                    int64_t padded, float* dst) {  // dst [padded]
  int64_t i = 0;
  if (dtype == KvDtype::kFloat32) {
    const float* src = static_cast<const float*>(cache) + element;
    for (; i + kLanes <= dim; i += kLanes) Store(dst + i, Load(src + i));
    for (; i < dim; ++i) dst[i] = src[i];
  } else {
    const uint16_t* src = static_cast<const uint16_t*>(cache) + element;
    for (; i + kLanes <= dim; i += kLanes) Store(dst + i, LoadBf16(src + i));
    for (; i < dim; ++i) {
      const uint32_t bits = uint32_t{src[i]} << 16;
      std::memcpy(dst + i, &bits, 4);
    }
  }
  for (; i < padded; ++i) dst[i] = 0.f;
}

inline float Dot(const float* a, const float* b, int64_t padded) {  // a, b [padded]
  V16 acc = Load(a) * Load(b);
  for (int64_t i = kLanes; i < padded; i += kLanes) acc += Load(a + i) * Load(b + i);
  return ReduceAdd(acc);
}

struct TaskView {
  const PagedAttentionParams* p;
  const int32_t* block_table;  // [max_blocks_per_seq]
  int64_t first_token;         // batch row of the task's first query
  int32_t first_pos;           // position of the task's first query
  int32_t group;               // query heads per KV head
  int64_t rows;                // group * num_queries; row r = query (r / group), head r % group
  int64_t keys;                // scores row stride (keys visible to the last query, padded)
  int64_t dim;                 // head_dim padded to lanes

  // Cache element index of (pos, kv_head).
  int64_t Element(int32_t pos, int32_t kv_head) const {
    const KvCacheShape& c = p->cache;
    const int64_t slot = int64_t{block_table[pos / c.block_size]} * c.block_size +
                         pos % c.block_size;
    return (slot * c.num_kv_heads + kv_head) * c.head_dim;
  }
  // First row that sees key position j (causal).
  int64_t FirstRow(int32_t j) const { return j <= first_pos ? 0 : (j - first_pos) * group; }
};

void Scores(const TaskView& t, int32_t kv_head, int32_t num_keys, const float* q,  // [rows, dim]
            float* row_buf, float* scores) {  // row_buf [dim], scores [rows, keys]
  const PagedAttentionParams& p = *t.p;
  for (int32_t j = 0; j < num_keys; ++j) {
    LoadRow(p.k_cache, p.cache.dtype, t.Element(j, kv_head), p.cache.head_dim, t.dim, row_buf);
    for (int64_t r = t.FirstRow(j); r < t.rows; ++r) {
      scores[r * t.keys + j] = Dot(q + r * t.dim, row_buf, t.dim) * p.scale;
    }
  }
}

// Softmax numerators in place (zero past each row's last visible key); returns 1 / sum.
float SoftmaxRow(float* scores, int32_t visible, int64_t padded) {  // scores [padded]
  V16 vmax = Splat(-INFINITY);
  int64_t j = 0;
  for (; j + kLanes <= visible; j += kLanes) {
    const V16 s = Load(scores + j);
    vmax = s > vmax ? s : vmax;
  }
  float max_score = ReduceMax(vmax);
  for (int64_t i = j; i < visible; ++i) max_score = scores[i] > max_score ? scores[i] : max_score;
  I16 lane;
  for (int i = 0; i < kLanes; ++i) lane[i] = i;
  V16 sum = Splat(0.f);
  for (j = 0; j < padded; j += kLanes) {
    const V16 e = Exp(Load(scores + j) - max_score);
    const V16 kept = (lane + static_cast<int32_t>(j)) < visible ? e : Splat(0.f);
    Store(scores + j, kept);
    sum += kept;
  }
  return 1.f / ReduceAdd(sum);
}

void RunTask(const PagedAttentionParams& p, const AttentionTask& task, float* scratch) {
  TaskView t;
  t.p = &p;
  t.block_table = p.block_tables + int64_t{task.seq} * p.max_blocks_per_seq;
  t.first_token = int64_t{p.query_start[task.seq]} + task.query_begin;
  t.first_pos = p.context_lens[task.seq] + task.query_begin;
  t.group = p.num_heads / p.cache.num_kv_heads;
  t.rows = int64_t{t.group} * task.num_queries;
  const int32_t num_keys = t.first_pos + task.num_queries;  // visible to the last query
  t.keys = RoundUpLanes(num_keys);
  t.dim = RoundUpLanes(p.cache.head_dim);
  const int32_t d = p.cache.head_dim;
  float* scores = scratch;                 // [rows, keys]
  float* q = scores + t.rows * t.keys;     // [rows, dim]
  float* acc = q + t.rows * t.dim;         // [rows, dim]
  float* row_buf = acc + t.rows * t.dim;   // [dim]
  float* inv_sum = row_buf + t.dim;        // [rows]
  for (int64_t r = 0; r < t.rows; ++r) {
    const int64_t head = int64_t{task.kv_head} * t.group + r % t.group;
    const float* src = p.q + (t.first_token + r / t.group) * p.q_stride + head * d;
    std::memcpy(q + r * t.dim, src, d * sizeof(float));
    std::memset(q + r * t.dim + d, 0, (t.dim - d) * sizeof(float));
  }
  Scores(t, task.kv_head, num_keys, q, row_buf, scores);
  for (int64_t r = 0; r < t.rows; ++r) {
    const int32_t visible = t.first_pos + static_cast<int32_t>(r / t.group) + 1;
    inv_sum[r] = SoftmaxRow(scores + r * t.keys, visible, t.keys);
  }
  std::memset(acc, 0, t.rows * t.dim * sizeof(float));
  for (int32_t j = 0; j < num_keys; ++j) {
    LoadRow(p.v_cache, p.cache.dtype, t.Element(j, task.kv_head), d, t.dim, row_buf);
    for (int64_t r = t.FirstRow(j); r < t.rows; ++r) {
      const V16 w = Splat(scores[r * t.keys + j]);
      float* a = acc + r * t.dim;
      for (int64_t i = 0; i < t.dim; i += kLanes) Store(a + i, Load(a + i) + w * Load(row_buf + i));
    }
  }
  for (int64_t r = 0; r < t.rows; ++r) {
    const int64_t head = int64_t{task.kv_head} * t.group + r % t.group;
    float* dst = p.out + (t.first_token + r / t.group) * p.out_stride + head * d;
    for (int32_t i = 0; i < d; ++i) dst[i] = acc[r * t.dim + i] * inv_sum[r];
  }
}

}  // namespace

void WriteKvCache(const KvCacheShape& shape, const float* k, const float* v, int64_t src_stride,
                  const int32_t* slot_mapping, int64_t num_tokens, void* k_cache,
                  void* v_cache) {
  const int64_t row = int64_t{shape.num_kv_heads} * shape.head_dim;
  for (int64_t t = 0; t < num_tokens; ++t) {
    const int64_t slot = slot_mapping[t];
    if (slot < 0) continue;
    const float* k_src = k + t * src_stride;
    const float* v_src = v + t * src_stride;
    if (shape.dtype == KvDtype::kFloat32) {
      std::memcpy(static_cast<float*>(k_cache) + slot * row, k_src, row * sizeof(float));
      std::memcpy(static_cast<float*>(v_cache) + slot * row, v_src, row * sizeof(float));
    } else {
      ConvertToBf16(k_src, static_cast<uint16_t*>(k_cache) + slot * row, row);
      ConvertToBf16(v_src, static_cast<uint16_t*>(v_cache) + slot * row, row);
    }
  }
}

void PagedAttention(const PagedAttentionParams& p, const AttentionTask* tasks, int64_t num_tasks,
                    float* scratch, int64_t scratch_per_thread, bool parallel) {
  // Dynamic: a long prefill's later chunks see far more keys than its first ones.
#pragma omp parallel if (parallel)
  {
    float* mine = scratch + omp_get_thread_num() * scratch_per_thread;
#pragma omp for schedule(dynamic, 1)
    for (int64_t i = 0; i < num_tasks; ++i) RunTask(p, tasks[i], mine);
  }
}

}  // namespace ferry::kernels::cpu::FERRY_ISA_NS
