// Batch-invariant AVX2 matmul (contract in gemm.h). Compiled with -mavx2 -mfma; intrinsics,
// not vector extensions, so that the compiler cannot contract or reorder differently in the
// tile shapes below (every shape must do the same arithmetic per output element).
#include "kernels/cpu/gemm.h"

#include <immintrin.h>
#include <omp.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <stdexcept>
#include <string>

namespace ferry::kernels::cpu {
namespace {

// Tile of kRows x kCols outputs: 12 accumulators, 4 x loads and 3 weight loads per 12 FMAs,
// 16 ymm registers in all (3 x 4 spilled an accumulator: 0.6x the speed). A single row takes
// kWideCols columns instead, so that it still has 6 chains in flight.
constexpr int kRows = 4;
constexpr int kCols = kBf16GroupRows;
constexpr int kWideCols = 2 * kBf16GroupRows;
// Weight bytes per panel, the unit of thread work: a panel's weight rows stay in L2 while the
// rows of x pass over them, one tile of rows (in L1) at a time.
constexpr int64_t kPanelBytes = 256 * 1024;
// Bytes of x per row block, kept in L3 while every panel passes over it.
constexpr int64_t kRowBlockBytes = 8 * 1024 * 1024;
// Below this many multiply-adds a call runs on one thread (fork/join costs more).
constexpr int64_t kMinParallelMacs = int64_t{1} << 18;

inline __m256 LoadW(const float* p) { return _mm256_loadu_ps(p); }

// bf16 -> fp32 is exact: the bf16 bits are the top half of the fp32 bits.
inline __m256 LoadW(const uint16_t* p) {
  const __m128i h = _mm_loadu_si128(reinterpret_cast<const __m128i*>(p));
  return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(h), 16));
}

inline float WScalar(const float* p) { return *p; }

inline float WScalar(const uint16_t* p) {
  const uint32_t bits = static_cast<uint32_t>(*p) << 16;
  float f;
  std::memcpy(&f, &bits, sizeof(f));
  return f;
}

inline uint16_t Bf16Bits(float f) {
  uint32_t u;
  std::memcpy(&u, &f, sizeof(u));
  if (std::isnan(f)) return static_cast<uint16_t>((u | 0x00400000u) >> 16);
  return static_cast<uint16_t>((u + 0x7fffu + ((u >> 16) & 1u)) >> 16);
}

// ((0+4)+(2+6)) + ((1+5)+(3+7)): the one lane order gemm.h promises.
inline float Sum8(__m256 v) {
  const __m128 a = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  const __m128 b = _mm_add_ps(a, _mm_movehl_ps(a, a));
  return _mm_cvtss_f32(_mm_add_ss(b, _mm_shuffle_ps(b, b, 1)));
}

// Where one weight row (output column) lives: its k8 / 8 chunks of 8 values, `chunk_stride`
// apart from `main`, then its k - k8 tail values at `tail`.
template <typename W>
struct Column {
  const W* main;
  const W* tail;
};

// How a weight matrix is laid out (gemm.h): plain fp32 rows, or packed bf16 groups.
template <typename W>
struct Weights {
  const W* data;
  int64_t n, k, k8;
  int64_t chunk_stride;  // elements from one chunk of 8 of a column to its next

  Column<W> At(int64_t col) const;
};

template <>
Column<float> Weights<float>::At(int64_t col) const {
  const float* row = data + col * k;
  return {row, row + k8};
}

template <>
Column<uint16_t> Weights<uint16_t>::At(int64_t col) const {
  const int64_t group = col / kBf16GroupRows;
  const uint16_t* main = data + group * kBf16GroupRows * k8 + (col % kBf16GroupRows) * 8;
  const int64_t groups = (n + kBf16GroupRows - 1) / kBf16GroupRows;
  return {main, data + groups * kBf16GroupRows * k8 + col * (k - k8)};
}

// R rows x C columns of out. x: the tile's first row ([R, k], stride k); out: its first output
// ([R, C] at stride n); bias: [C] or nullptr.
template <int R, int C, typename W>
void Tile(const float* x, const Weights<W>& w, int64_t col, float* out, int64_t n,
          const float* bias, bool accumulate) {
  Column<W> cols[C];
#pragma GCC unroll 8
  for (int c = 0; c < C; ++c) cols[c] = w.At(col + c);
  __m256 s[R][C];
#pragma GCC unroll 8
  for (int r = 0; r < R; ++r) {
#pragma GCC unroll 8
    for (int c = 0; c < C; ++c) s[r][c] = _mm256_setzero_ps();
  }
  const int64_t k = w.k;
  for (int64_t kk = 0, chunk = 0; kk < w.k8; kk += 8, chunk += w.chunk_stride) {
    __m256 wv[C];
#pragma GCC unroll 8
    for (int c = 0; c < C; ++c) wv[c] = LoadW(cols[c].main + chunk);
#pragma GCC unroll 8
    for (int r = 0; r < R; ++r) {
      const __m256 xv = _mm256_loadu_ps(x + r * k + kk);
#pragma GCC unroll 8
      for (int c = 0; c < C; ++c) s[r][c] = _mm256_fmadd_ps(xv, wv[c], s[r][c]);
    }
  }
  for (int r = 0; r < R; ++r) {
    for (int c = 0; c < C; ++c) {
      float v = Sum8(s[r][c]);
      for (int64_t kk = w.k8; kk < k; ++kk) {
        v = std::fma(x[r * k + kk], WScalar(cols[c].tail + (kk - w.k8)), v);
      }
      if (bias != nullptr) v += bias[c];
      float* o = out + r * n + c;
      *o = accumulate ? *o + v : v;
    }
  }
}

// Columns [c0, c1) of one tile of R rows starting at row r, C columns per tile where they fit
// and one at a time after (same arithmetic per element).
template <int R, int C, typename W>
void RowTile(const GemmArgs& a, const Weights<W>& w, int64_t r, int64_t c0, int64_t c1) {
  const float* x = a.x + r * a.k;
  float* out = a.out + r * a.n;
  auto bias = [&](int64_t c) { return a.bias != nullptr ? a.bias + c : nullptr; };
  int64_t c = c0;
  for (; c + C <= c1; c += C) Tile<R, C>(x, w, c, out + c, a.n, bias(c), a.accumulate);
  for (; c < c1; ++c) Tile<R, 1>(x, w, c, out + c, a.n, bias(c), a.accumulate);
}

// Rows [r0, r1) x columns [c0, c1): a tile of rows at a time over every column of the panel.
template <typename W>
void Panel(const GemmArgs& a, const Weights<W>& w, int64_t r0, int64_t r1, int64_t c0, int64_t c1) {
  int64_t r = r0;
  for (; r + kRows <= r1; r += kRows) RowTile<kRows, kCols>(a, w, r, c0, c1);
  for (; r < r1; ++r) RowTile<1, kWideCols>(a, w, r, c0, c1);
}

template <typename W>
void GemmAs(const GemmArgs& a, const Weights<W>& w) {
  const int64_t row_bytes = std::max<int64_t>(1, a.k) * static_cast<int64_t>(sizeof(float));
  const int64_t rows_per_block = std::max<int64_t>(kRows, kRowBlockBytes / row_bytes / kRows * kRows);
  // Panels start on a group of packed rows (and on a wide tile).
  const int64_t weight_row_bytes = std::max<int64_t>(1, a.k) * static_cast<int64_t>(sizeof(W));
  const int64_t panel_cols =
      std::max<int64_t>(kWideCols, kPanelBytes / weight_row_bytes / kWideCols * kWideCols);
  const int64_t num_panels = (a.n + panel_cols - 1) / panel_cols;
  const bool parallel = a.m * a.n * a.k >= kMinParallelMacs && num_panels > 1;
  for (int64_t r0 = 0; r0 < a.m; r0 += rows_per_block) {
    const int64_t r1 = std::min(a.m, r0 + rows_per_block);
#pragma omp parallel for schedule(static) if (parallel)
    for (int64_t p = 0; p < num_panels; ++p) {
      Panel(a, w, r0, r1, p * panel_cols, std::min(a.n, (p + 1) * panel_cols));
    }
  }
}

}  // namespace

int64_t PackedBf16Size(int64_t n, int64_t k) {
  const int64_t k8 = k & ~int64_t{7};
  const int64_t groups = (n + kBf16GroupRows - 1) / kBf16GroupRows;
  return groups * kBf16GroupRows * k8 + n * (k - k8);
}

void PackBf16(const float* weight, int64_t n, int64_t k, uint16_t* out) {
  const int64_t k8 = k & ~int64_t{7};
  const int64_t groups = (n + kBf16GroupRows - 1) / kBf16GroupRows;
  // Chunks: [group][chunk][row of the group][8]; rows past n are zeros (computed, never stored).
#pragma omp parallel for schedule(static) if (n * k >= (int64_t{1} << 20))
  for (int64_t g = 0; g < groups; ++g) {
    uint16_t* dst = out + g * kBf16GroupRows * k8;
    for (int64_t kk = 0; kk < k8; kk += 8) {
      for (int64_t i = 0; i < kBf16GroupRows; ++i) {
        const int64_t row = g * kBf16GroupRows + i;
        for (int64_t j = 0; j < 8; ++j) *dst++ = row < n ? Bf16Bits(weight[row * k + kk + j]) : 0;
      }
    }
  }
  uint16_t* tail = out + groups * kBf16GroupRows * k8;
  for (int64_t row = 0; row < n; ++row) {
    for (int64_t kk = k8; kk < k; ++kk) *tail++ = Bf16Bits(weight[row * k + kk]);
  }
}

void Gemm(const GemmArgs& a) {
  if (a.m < 0 || a.n < 0 || a.k < 0) {
    throw std::invalid_argument("Gemm: negative size m=" + std::to_string(a.m) + " n=" +
                                std::to_string(a.n) + " k=" + std::to_string(a.k));
  }
  if (a.m == 0 || a.n == 0) return;
  if (a.out == nullptr || (a.k > 0 && (a.x == nullptr || a.weight == nullptr))) {
    throw std::invalid_argument("Gemm: null x, weight or out");
  }
  const int64_t k8 = a.k & ~int64_t{7};
  if (a.dtype == GemmWeight::kBfloat16Packed) {
    GemmAs(a, Weights<uint16_t>{static_cast<const uint16_t*>(a.weight), a.n, a.k, k8, kBf16GroupRows * 8});
  } else {
    GemmAs(a, Weights<float>{static_cast<const float*>(a.weight), a.n, a.k, k8, 8});
  }
}

void RoundToBf16(const float* x, float* out, int64_t n) {
#pragma omp parallel for schedule(static) if (n >= (int64_t{1} << 18))
  for (int64_t i = 0; i < n; ++i) {
    const uint32_t bits = static_cast<uint32_t>(Bf16Bits(x[i])) << 16;
    std::memcpy(&out[i], &bits, sizeof(bits));
  }
}

}  // namespace ferry::kernels::cpu
