// The ISA-specialised kernel bodies. impl_elementwise.cc and impl_attention.cc are compiled
// once per ISA with FERRY_ISA_NS set to avx2 or avx512 (see CMakeLists.txt); the public entry
// points dispatch on ActiveIsa(). Arguments are already validated and resolved by them.
#pragma once

#include <cstdint>

#include "kernels/cpu/cpu_kernels.h"
#include "kernels/cpu/paged_attention.h"

namespace ferry::kernels::cpu {

// One unit of attention work: `num_queries` consecutive query tokens of one sequence against
// one KV head, for every query head of that head's group.
struct AttentionTask {
  int32_t seq = 0;
  int32_t kv_head = 0;
  int32_t query_begin = 0;  // first query token, relative to the sequence's query_start
  int32_t num_queries = 0;
};

// Floats of per-thread scratch a task needs.
int64_t AttentionScratchFloats(const PagedAttentionParams& p, const AttentionTask& task);

#define FERRY_DECLARE_CPU_IMPL(ns)                                                            \
  namespace ns {                                                                              \
  void RmsNorm(const float* x, const float* weight, float* out, int64_t num_tokens,           \
               int64_t hidden, float eps);                                                    \
  void SiluAndMul(const float* gate_up, float* out, int64_t num_tokens, int64_t intermediate); \
  void ApplyRotaryTable(const RotaryParams& p, const float* table, float* q, float* k);        \
  void ConvertToBf16(const float* x, uint16_t* out, int64_t n);                               \
  void WriteKvCache(const KvCacheShape& shape, const float* k, const float* v,                \
                    int64_t src_stride, const int32_t* slot_mapping, int64_t num_tokens,      \
                    void* k_cache, void* v_cache);                                            \
  void PagedAttention(const PagedAttentionParams& p, const AttentionTask* tasks,              \
                      int64_t num_tasks, float* scratch, int64_t scratch_per_thread,          \
                      bool parallel);                                                         \
  }

FERRY_DECLARE_CPU_IMPL(avx2)
FERRY_DECLARE_CPU_IMPL(avx512)
#undef FERRY_DECLARE_CPU_IMPL

}  // namespace ferry::kernels::cpu
