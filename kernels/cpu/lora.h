// LoRA's low-rank update for a set of token rows of one adapter: the shrink (x A^T, to rank r)
// then the expand (times B^T, back to the layer's width), added to the base layer's output.
// Punica and S-LoRA's split: the base GEMM runs once for the whole batch, then each adapter's
// update runs on its own rows. A row's result never depends on which other rows share the call
// (one fixed order per element), so a sequence's output does not depend on its batch.
#pragma once

#include <cstdint>

namespace ferry::kernels::cpu {

struct LoraWeights {
  const float* a = nullptr;    // [rank, k]: lora_A as stored (out = rank, in = k)
  const float* b_t = nullptr;  // [rank, n]: lora_B transposed (lora_B is [n, rank])
  int32_t rank = 0;
  int64_t k = 0;  // input width
  int64_t n = 0;  // output width
  float scale = 1.f;  // lora_alpha / rank, or / sqrt(rank) under rsLoRA
};

// For each r in rows[0..num_rows): out[r * out_stride + j] += scale * sum_i B[j, i] (A x[r])_i
// for j < n, where x[r] = x + r * x_stride holds k floats. rank <= kMaxLoraRank.
void LoraShrinkExpand(const LoraWeights& w, const float* x, int64_t x_stride, float* out, int64_t out_stride,
                      const int32_t* rows, int64_t num_rows);

inline constexpr int32_t kMaxLoraRank = 512;

}  // namespace ferry::kernels::cpu
