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

// out[k] = sum of the lanes of v[k]: four rounds of pairwise shuffles, so 16 dot products
// cost one reduction instead of sixteen.
inline V16 TransposeSum(const V16* v) {  // v [16]
  V16 s1[8], s2[4], s3[2];
  for (int m = 0; m < 8; ++m) {
    const V16 a = v[2 * m], b = v[2 * m + 1];
    s1[m] = __builtin_shufflevector(a, b, 0, 1, 2, 3, 4, 5, 6, 7, 16, 17, 18, 19, 20, 21, 22, 23) +
            __builtin_shufflevector(a, b, 8, 9, 10, 11, 12, 13, 14, 15, 24, 25, 26, 27, 28, 29, 30, 31);
  }
  for (int m = 0; m < 4; ++m) {
    const V16 a = s1[2 * m], b = s1[2 * m + 1];
    s2[m] = __builtin_shufflevector(a, b, 0, 1, 2, 3, 8, 9, 10, 11, 16, 17, 18, 19, 24, 25, 26, 27) +
            __builtin_shufflevector(a, b, 4, 5, 6, 7, 12, 13, 14, 15, 20, 21, 22, 23, 28, 29, 30, 31);
  }
  for (int m = 0; m < 2; ++m) {
    const V16 a = s2[2 * m], b = s2[2 * m + 1];
    s3[m] = __builtin_shufflevector(a, b, 0, 1, 4, 5, 8, 9, 12, 13, 16, 17, 20, 21, 24, 25, 28, 29) +
            __builtin_shufflevector(a, b, 2, 3, 6, 7, 10, 11, 14, 15, 18, 19, 22, 23, 26, 27, 30, 31);
  }
  return __builtin_shufflevector(s3[0], s3[1], 0, 2, 4, 6, 8, 10, 12, 14, 16, 18, 20, 22, 24, 26, 28, 30) +
         __builtin_shufflevector(s3[0], s3[1], 1, 3, 5, 7, 9, 11, 13, 15, 17, 19, 21, 23, 25, 27, 29, 31);
}

// Scores of one query row against 16 consecutive keys. kVecs = padded head_dim / 16, a
// template parameter so the query and the accumulators stay in registers.
template <int kVecs>
inline V16 Scores16(const float* q, const float* k, int64_t dim) {  // q [dim], k [16, dim]
  V16 qv[kVecs];
  for (int i = 0; i < kVecs; ++i) qv[i] = Load(q + i * kLanes);
  V16 acc[16];
  for (int kk = 0; kk < 16; ++kk) {
    const float* row = k + kk * dim;
    V16 a = qv[0] * Load(row);
    for (int i = 1; i < kVecs; ++i) a += qv[i] * Load(row + i * kLanes);
    acc[kk] = a;
  }
  return TransposeSum(acc);
}

// acc[0..kVecs) = sum over keys j < visible of w[j] * v[j]; the accumulators stay in registers.
template <int kVecs>
inline void WeightedSum(const float* w, const float* v, int32_t visible, int64_t dim,
                        float* out) {  // w [visible], v [keys, dim], out [dim]
  V16 acc[kVecs];
  for (int i = 0; i < kVecs; ++i) acc[i] = Splat(0.f);
  for (int32_t j = 0; j < visible; ++j) {
    const V16 wj = Splat(w[j]);
    const float* row = v + j * dim;
    for (int i = 0; i < kVecs; ++i) acc[i] += wj * Load(row + i * kLanes);
  }
  for (int i = 0; i < kVecs; ++i) Store(out + i * kLanes, acc[i]);
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
  // Keys visible to row r (causal).
  int32_t Visible(int64_t r) const { return first_pos + static_cast<int32_t>(r / group) + 1; }
};

// Converts the task's K and V rows to fp32 once (zero past num_keys): every query row of the
// task reuses them from L1/L2.
void GatherKv(const TaskView& t, int32_t kv_head, int32_t num_keys, float* k,
              float* v) {  // k, v [keys, dim]
  const PagedAttentionParams& p = *t.p;
  for (int32_t j = 0; j < num_keys; ++j) {
    const int64_t element = t.Element(j, kv_head);
    LoadRow(p.k_cache, p.cache.dtype, element, p.cache.head_dim, t.dim, k + j * t.dim);
    LoadRow(p.v_cache, p.cache.dtype, element, p.cache.head_dim, t.dim, v + j * t.dim);
  }
  std::memset(k + num_keys * t.dim, 0, (t.keys - num_keys) * t.dim * sizeof(float));
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

// One query row: scores, softmax, weighted sum of values into out (unnormalised); returns the
// softmax's 1 / sum. Depends only on this row's query and visible keys, so a query's result is
// the same whatever else shares its task or batch.
template <int kVecs>
float AttendRow(const TaskView& t, int32_t visible, const float* q, const float* k, const float* v,
                float* scores, float* out) {  // q [dim], k/v [keys, dim], scores [keys], out [dim]
  const int64_t blocks = RoundUpLanes(visible);
  for (int64_t j = 0; j < blocks; j += kLanes) {
    Store(scores + j, Scores16<kVecs>(q, k + j * t.dim, t.dim) * t.p->scale);
  }
  const float inv_sum = SoftmaxRow(scores, visible, blocks);
  WeightedSum<kVecs>(scores, v, visible, t.dim, out);
  return inv_sum;
}

using AttendRowFn = float (*)(const TaskView&, int32_t, const float*, const float*, const float*,
                              float*, float*);

AttendRowFn PickAttendRow(int64_t dim) {
  switch (dim / kLanes) {
    case 4: return AttendRow<4>;   // head_dim 64 (Qwen2.5-0.5B)
    case 8: return AttendRow<8>;   // head_dim 128
    case 1: return AttendRow<1>;
    case 2: return AttendRow<2>;
    case 3: return AttendRow<3>;
    case 5: return AttendRow<5>;
    case 6: return AttendRow<6>;
    case 7: return AttendRow<7>;
    case 16: return AttendRow<16>;  // head_dim 256
    default: return nullptr;
  }
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
  float* scores = scratch;                 // [keys]
  float* q = scores + t.keys;              // [dim]
  float* out = q + t.dim;                  // [dim]
  float* k = out + t.dim;                  // [keys, dim]
  float* v = k + t.keys * t.dim;           // [keys, dim]
  GatherKv(t, task.kv_head, num_keys, k, v);
  const AttendRowFn attend = PickAttendRow(t.dim);
  for (int64_t r = 0; r < t.rows; ++r) {
    const int64_t head = int64_t{task.kv_head} * t.group + r % t.group;
    const float* src = p.q + (t.first_token + r / t.group) * p.q_stride + head * d;
    std::memcpy(q, src, d * sizeof(float));
    std::memset(q + d, 0, (t.dim - d) * sizeof(float));
    const float inv_sum = attend(t, t.Visible(r), q, k, v, scores, out);
    float* dst = p.out + (t.first_token + r / t.group) * p.out_stride + head * d;
    for (int32_t i = 0; i < d; ++i) dst[i] = out[i] * inv_sum;
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
