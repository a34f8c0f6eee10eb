// LoRA's low-rank update for a set of token rows of one adapter: the shrink (x A^T, to rank r)
// then the expand (times B^T, back to the layer's width), added to the base layer's output.
// Punica and S-LoRA's split: the base GEMM runs once for the whole batch, then each adapter's
// update runs on its own rows, four rows at a time so each weight read serves four rows. A row's
// result never depends on which other rows share the call (the same operations in the same
// order for every row, whatever its block), so a sequence's output does not depend on its batch.
#pragma once

#include <cstdint>

namespace ferry::kernels::cpu {

// Weights in fp32 or bf16 (one pair set): the update is computed in fp32 either way.
struct LoraWeights {
  const float* a = nullptr;           // [rank, k]: lora_A as stored (out = rank, in = k)
  const float* b_t = nullptr;         // [rank, n]: lora_B transposed (lora_B is [n, rank])
  const uint16_t* a_bf16 = nullptr;   // the same in bf16, when a is null
  const uint16_t* b_t_bf16 = nullptr;
  int32_t rank = 0;
  int64_t k = 0;  // input width
  int64_t n = 0;  // output width
  float scale = 1.f;  // lora_alpha / rank, or / sqrt(rank) under rsLoRA
};

// One adapter's rows of a step (Punica's segment).
struct LoraSegment {
  LoraWeights weights;
  const int32_t* rows = nullptr;  // token rows of x and out, each in at most one segment
  int64_t num_rows = 0;
};

// For each segment and each r in its rows: out[r * out_stride + j] += scale * sum_i B[j, i]
// (A x[r])_i for j < n, where x[r] = x + r * x_stride holds k floats. The segments' blocks of
// rows run on the OpenMP threads together (a step's adapters hold a few rows each). Every rank in
// 1..kMaxLoraRank, else std::invalid_argument before anything is written.
void LoraShrinkExpand(const LoraSegment* segments, int64_t num_segments, const float* x, int64_t x_stride,
                      float* out, int64_t out_stride);
// One segment.
void LoraShrinkExpand(const LoraWeights& w, const float* x, int64_t x_stride, float* out, int64_t out_stride,
                      const int32_t* rows, int64_t num_rows);

inline constexpr int32_t kMaxLoraRank = 512;

}  // namespace ferry::kernels::cpu
