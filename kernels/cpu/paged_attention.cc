#include "kernels/cpu/paged_attention.h"

#include <omp.h>

#include <algorithm>
#include <stdexcept>
#include <string>
#include <vector>

#include "kernels/cpu/impl.h"
#include "kernels/cpu/isa.h"

namespace ferry::kernels::cpu {
namespace {

// Multiply-adds below which a call runs on the calling thread: waking the team (and its
// spin-waiting on a shared machine) would cost more than the work.
constexpr int64_t kMinParallelWork = 1 << 18;
// Query tokens per task: enough to reuse each key several times from L1, few enough that a
// long prefill still splits into many tasks for the dynamic schedule.
constexpr int32_t kQueriesPerTask = 8;

int64_t Lanes16(int64_t n) { return (n + 15) / 16 * 16; }

}  // namespace

int64_t AttentionScratchFloats(const PagedAttentionParams& p, const AttentionTask& task) {
  const int64_t group = p.num_heads / p.cache.num_kv_heads;
  const int64_t rows = group * task.num_queries;
  const int64_t keys = Lanes16(int64_t{p.context_lens[task.seq]} + task.query_begin +
                               task.num_queries);
  const int64_t dim = Lanes16(p.cache.head_dim);
  // scores [keys], q and out [dim], K and V converted to fp32 [keys, dim] each.
  (void)rows;
  return keys + 2 * dim + 2 * keys * dim;
}

void WriteKvCache(const KvCacheShape& shape, const float* k, const float* v,
                  const int32_t* slot_mapping, int64_t num_tokens, void* k_cache, void* v_cache,
                  int64_t src_stride) {
  if (src_stride == 0) src_stride = int64_t{shape.num_kv_heads} * shape.head_dim;
  if (ActiveIsa() == Isa::kAvx512) {
    avx512::WriteKvCache(shape, k, v, src_stride, slot_mapping, num_tokens, k_cache, v_cache);
  } else {
    avx2::WriteKvCache(shape, k, v, src_stride, slot_mapping, num_tokens, k_cache, v_cache);
  }
}

void PagedAttention(const PagedAttentionParams& params) {
  // The row kernels are instantiated for padded head dims up to 256 (impl_attention.cc).
  if (params.cache.head_dim <= 0 || Lanes16(params.cache.head_dim) > 256) {
    throw std::invalid_argument("PagedAttention: head_dim " + std::to_string(params.cache.head_dim) +
                                " is outside [1, 256]");
  }
  PagedAttentionParams p = params;
  const int64_t dense = int64_t{p.num_heads} * p.cache.head_dim;
  if (p.q_stride == 0) p.q_stride = dense;
  if (p.out_stride == 0) p.out_stride = dense;
  // Grow-only per calling thread: no allocation once the largest step has been seen.
  thread_local std::vector<AttentionTask> tasks;
  thread_local std::vector<float> scratch;
  tasks.clear();
  int64_t work = 0, per_thread = 0;
  for (int32_t s = 0; s < p.num_seqs; ++s) {
    const int32_t n = p.query_start[s + 1] - p.query_start[s];
    work += int64_t{n} * (p.context_lens[s] + n) * p.num_heads * p.cache.head_dim;
    for (int32_t begin = 0; begin < n; begin += kQueriesPerTask) {
      for (int32_t h = 0; h < p.cache.num_kv_heads; ++h) {
        tasks.push_back({s, h, begin, std::min(kQueriesPerTask, n - begin)});
        per_thread = std::max(per_thread, AttentionScratchFloats(p, tasks.back()));
      }
    }
  }
  const bool parallel = work >= kMinParallelWork && tasks.size() > 1;
  const int64_t num_threads = parallel ? omp_get_max_threads() : 1;
  per_thread = Lanes16(per_thread);
  if (static_cast<int64_t>(scratch.size()) < per_thread * num_threads) {
    scratch.resize(per_thread * num_threads);
  }
  const auto num_tasks = static_cast<int64_t>(tasks.size());
  if (ActiveIsa() == Isa::kAvx512) {
    avx512::PagedAttention(p, tasks.data(), num_tasks, scratch.data(), per_thread, parallel);
  } else {
    avx2::PagedAttention(p, tasks.data(), num_tasks, scratch.data(), per_thread, parallel);
  }
}

}  // namespace ferry::kernels::cpu
