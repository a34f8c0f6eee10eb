#include "kernels/cpu/lora.h"

#include <algorithm>
#include <bit>
#include <cmath>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

namespace ferry::kernels::cpu {
namespace {

constexpr int kLanes = 64;  // four AVX-512 accumulators: independent add chains
constexpr int kBlock = 4;  // rows sharing each weight read

inline float At(const float* p, int64_t i) { return p[i]; }
inline float At(const uint16_t* p, int64_t i) { return std::bit_cast<float>(static_cast<uint32_t>(p[i]) << 16); }

// sum_i x[i] * a[i]: 64 independent lanes over the 64-aligned part (vectorised), then the
// lanes and the tail in index order.
template <typename W>
float Dot(const float* __restrict x, const W* __restrict a, int64_t k) {
  float lanes[kLanes] = {};
  int64_t i = 0;
  for (; i + kLanes <= k; i += kLanes) {
    for (int l = 0; l < kLanes; ++l) lanes[l] = std::fma(x[i + l], At(a, i + l), lanes[l]);
  }
  float sum = 0.f;
  for (int l = 0; l < kLanes; ++l) sum += lanes[l];
  for (; i < k; ++i) sum = std::fma(x[i], At(a, i), sum);
  return sum;
}

// y[c] += sum_j s[j] * b_t[j, c], over c in chunks of kLanes kept in registers across the rank
// (one load and one store of y), j in index order for every element.
template <typename W>
void Expand(float* __restrict y, const float* s, int32_t rank, const W* __restrict b_t, int64_t n) {
  int64_t c0 = 0;
  for (; c0 + kLanes <= n; c0 += kLanes) {
    float acc[kLanes];
    for (int l = 0; l < kLanes; ++l) acc[l] = y[c0 + l];
    for (int32_t j = 0; j < rank; ++j) {
      const W* bj = b_t + j * n + c0;
      for (int l = 0; l < kLanes; ++l) acc[l] = std::fma(s[j], At(bj, l), acc[l]);
    }
    for (int l = 0; l < kLanes; ++l) y[c0 + l] = acc[l];
  }
  for (int64_t c = c0; c < n; ++c) {
    float acc = y[c];
    for (int32_t j = 0; j < rank; ++j) acc = std::fma(s[j], At(b_t + j * n, c), acc);
    y[c] = acc;
  }
}

// Up to kBlock rows: each rank row of A is read from memory once and from L1 for the block's
// other rows. Every row gets the same Dot and Expand calls in the same order whatever the block,
// so its result does not depend on the rows beside it.
template <typename W>
void Block(const W* a, const W* b_t, const LoraWeights& w, const float* x, int64_t x_stride, float* out,
           int64_t out_stride, const int32_t* rows, int64_t count) {
  float shrunk[kBlock][kMaxLoraRank];
  for (int32_t j = 0; j < w.rank; ++j) {
    for (int64_t r = 0; r < count; ++r) {
      shrunk[r][j] = w.scale * Dot(x + int64_t{rows[r]} * x_stride, a + j * w.k, w.k);
    }
  }
  for (int64_t r = 0; r < count; ++r) Expand(out + int64_t{rows[r]} * out_stride, shrunk[r], w.rank, b_t, w.n);
}

void RunBlock(const LoraWeights& w, const float* x, int64_t x_stride, float* out, int64_t out_stride,
              const int32_t* rows, int64_t count) {
  if (w.a != nullptr) {
    Block(w.a, w.b_t, w, x, x_stride, out, out_stride, rows, count);
  } else {
    Block(w.a_bf16, w.b_t_bf16, w, x, x_stride, out, out_stride, rows, count);
  }
}

}  // namespace

void LoraShrinkExpand(const LoraSegment* segments, int64_t num_segments, const float* x, int64_t x_stride,
                      float* out, int64_t out_stride) {
  // (segment, first row) of every block, and the work in all of them. Kept between calls: a
  // steady decode allocates nothing.
  thread_local std::vector<std::pair<int64_t, int64_t>> calling_thread_blocks;
  std::vector<std::pair<int64_t, int64_t>>& blocks = calling_thread_blocks;  // shared with the team
  blocks.clear();
  int64_t work = 0;
  for (int64_t s = 0; s < num_segments; ++s) {
    const LoraWeights& w = segments[s].weights;
    if (w.rank <= 0 || w.rank > kMaxLoraRank) {
      throw std::invalid_argument("LoraShrinkExpand: rank " + std::to_string(w.rank) + " outside 1.." +
                                  std::to_string(kMaxLoraRank));
    }
    for (int64_t r = 0; r < segments[s].num_rows; r += kBlock) blocks.emplace_back(s, r);
    work += segments[s].num_rows * (w.k + w.n) * w.rank;
  }
  const auto num_blocks = static_cast<int64_t>(blocks.size());
#pragma omp parallel for schedule(dynamic) if (num_blocks > 1 && work > (1 << 16))
  for (int64_t b = 0; b < num_blocks; ++b) {
    const LoraSegment& seg = segments[blocks[b].first];
    const int64_t first = blocks[b].second;
    RunBlock(seg.weights, x, x_stride, out, out_stride, seg.rows + first, std::min<int64_t>(kBlock, seg.num_rows - first));
  }
}

void LoraShrinkExpand(const LoraWeights& w, const float* x, int64_t x_stride, float* out, int64_t out_stride,
                      const int32_t* rows, int64_t num_rows) {
  const LoraSegment segment{w, rows, num_rows};
  LoraShrinkExpand(&segment, 1, x, x_stride, out, out_stride);
}

}  // namespace ferry::kernels::cpu
