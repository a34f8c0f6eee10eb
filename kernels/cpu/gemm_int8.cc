// Int8 quantization, packing, the AVX2 kernel and the driver (contract in gemm_int8.h).
// Compiled with -mavx2 -mfma -ffp-contract=off.
#include "kernels/cpu/gemm_int8.h"

#include <immintrin.h>
#include <omp.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <stdexcept>
#include <string>
#include <vector>

#include "kernels/cpu/gemm_int8_impl.h"
#include "kernels/cpu/isa.h"

namespace ferry::kernels::cpu {
namespace int8_impl {
namespace {

// Four int8 activations widened to int16 and repeated across the register: [x0 x1 x2 x3] x 4.
inline __m256i BroadcastI16(const int8_t* x) {
  int32_t v;
  std::memcpy(&v, x, sizeof(v));
  return _mm256_broadcastq_epi64(_mm_cvtepi8_epi16(_mm_cvtsi32_si128(v)));
}

// R rows x one group of 16 columns. Per 4-chunk of k, the group's 64 weight bytes are four
// registers of 4 columns x 4 k as int16; vpmaddwd leaves each column's two pair sums side by side.
template <int R>
void Tile(const GemmInt8Args& a, const int8_t* xs, int64_t kp, int64_t r, int64_t g) {
  // Group g is group g % 4 of its block: 64 bytes at that offset in each 256-byte chunk.
  const int8_t* w = a.weight + g / kInt8Groups * kInt8BlockCols * kp + g % kInt8Groups * 64;
  const int8_t* x = xs + r * kp;
  __m256i acc[R][4];
  for (int i = 0; i < R; ++i) {
    for (int q = 0; q < 4; ++q) acc[i][q] = _mm256_setzero_si256();
  }
  for (int64_t kk = 0; kk < kp; kk += 4) {
    __m256i wv[4];
    for (int q = 0; q < 4; ++q) {
      wv[q] = _mm256_cvtepi8_epi16(_mm_loadu_si128(reinterpret_cast<const __m128i*>(w + kk * kInt8BlockCols + 16 * q)));
    }
    for (int i = 0; i < R; ++i) {
      const __m256i xb = BroadcastI16(x + i * kp + kk);
      for (int q = 0; q < 4; ++q) acc[i][q] = _mm256_add_epi32(acc[i][q], _mm256_madd_epi16(wv[q], xb));
    }
  }
  const int64_t col = g * kInt8Cols;
  if (col >= a.n) return;
  const int64_t count = std::min<int64_t>(kInt8Cols, a.n - col);
  for (int i = 0; i < R; ++i) {
    alignas(32) int32_t sums[kInt8Cols];
    for (int h = 0; h < 2; ++h) {
      // hadd within 128-bit lanes gives columns [0 1 4 5 | 2 3 6 7] of the pair; reorder.
      const __m256i s = _mm256_hadd_epi32(acc[i][2 * h], acc[i][2 * h + 1]);
      _mm256_store_si256(reinterpret_cast<__m256i*>(sums + 8 * h), _mm256_permute4x64_epi64(s, 0xd8));
    }
    Int8Epilogue(a, r + i, col, count, sums);
  }
}

}  // namespace

void PanelAvx2(const GemmInt8Args& a, const int8_t* x, int64_t r0, int64_t r1, int64_t b0, int64_t b1) {
  const int64_t kp = Int8PaddedK(a.k);
  const int64_t g0 = b0 * kInt8Groups, g1 = b1 * kInt8Groups;
  int64_t r = r0;
  for (; r + 2 <= r1; r += 2) {
    for (int64_t g = g0; g < g1; ++g) Tile<2>(a, x, kp, r, g);
  }
  for (; r < r1; ++r) {
    for (int64_t g = g0; g < g1; ++g) Tile<1>(a, x, kp, r, g);
  }
}

}  // namespace int8_impl

namespace {

// Weight bytes per panel, the unit of thread work (kept in L2 while a block of rows passes).
constexpr int64_t kPanelBytes = 256 * 1024;
// Bytes of quantized x per row block, kept in L3 while every panel passes over it.
constexpr int64_t kRowBlockBytes = 4 * 1024 * 1024;
// Below this many multiply-adds a call runs on one thread.
constexpr int64_t kMinParallelMacs = int64_t{1} << 18;
// vpdpbusd's u8 x s8 sums stay below 2^31 for 255 * 127 * k.
constexpr int64_t kMaxK = 65536;

bool CpuHasVnni() {
  return __builtin_cpu_supports("avx512vnni") && __builtin_cpu_supports("avx512bw");
}

}  // namespace

bool Int8UsesVnni() { return ActiveIsa() == Isa::kAvx512 && CpuHasVnni(); }

void QuantizeRowsInt8(const float* src, int64_t rows, int64_t k, int8_t* q, float* scale) {
  const int64_t kp = Int8PaddedK(k);
#pragma omp parallel for schedule(static) if (rows * k >= (int64_t{1} << 20))
  for (int64_t r = 0; r < rows; ++r) {
    const float* s = src + r * k;
    float amax = 0.f;
    for (int64_t j = 0; j < k; ++j) amax = std::max(amax, std::fabs(s[j]));
    const float inv = amax > 0.f ? 127.f / amax : 0.f;
    int8_t* d = q + r * kp;
    // |s * inv| <= 127 up to one rounding of the product, so the rounded value is within
    // [-127, 127]; the bounds below only guard that last ulp.
    for (int64_t j = 0; j < k; ++j) {
      const float v = std::nearbyint(s[j] * inv);
      d[j] = static_cast<int8_t>(std::min(127.f, std::max(-127.f, v)));
    }
    for (int64_t j = k; j < kp; ++j) d[j] = 0;
    scale[r] = amax / 127.f;
  }
}

void PackInt8(const int8_t* q, int64_t n, int64_t k, int8_t* packed, int32_t* sums) {
  const int64_t kp = Int8PaddedK(k), np = Int8PaddedN(n);
#pragma omp parallel for schedule(static) if (n * k >= (int64_t{1} << 20))
  for (int64_t b = 0; b < np / kInt8BlockCols; ++b) {
    int8_t* dst = packed + b * kInt8BlockCols * kp;
    for (int64_t kk = 0; kk < kp; kk += 4) {
      for (int64_t c = 0; c < kInt8BlockCols; ++c) {  // group c / 16, column c % 16 of it
        const int64_t row = b * kInt8BlockCols + c;
        for (int64_t j = 0; j < 4; ++j) *dst++ = row < n ? q[row * kp + kk + j] : 0;
      }
    }
    for (int64_t c = 0; c < kInt8BlockCols; ++c) {
      const int64_t row = b * kInt8BlockCols + c;
      int32_t s = 0;
      for (int64_t j = 0; row < n && j < kp; ++j) s += q[row * kp + j];
      sums[row] = s;
    }
  }
}

void GemmInt8(const GemmInt8Args& a) {
  if (a.m < 0 || a.n < 0 || a.k < 0) {
    throw std::invalid_argument("GemmInt8: negative size m=" + std::to_string(a.m) + " n=" +
                                std::to_string(a.n) + " k=" + std::to_string(a.k));
  }
  if (a.k > kMaxK) {
    throw std::invalid_argument("GemmInt8: k=" + std::to_string(a.k) + " above the limit " +
                                std::to_string(kMaxK) + " (int32 sums could overflow)");
  }
  if (a.m == 0 || a.n == 0) return;
  if (a.out == nullptr || a.x_scale == nullptr || a.w_scale == nullptr || a.w_sums == nullptr ||
      (a.k > 0 && (a.x == nullptr || a.weight == nullptr))) {
    throw std::invalid_argument("GemmInt8: null x, scales, weight, sums or out");
  }
  const bool vnni = Int8UsesVnni();
  const int64_t kp = std::max<int64_t>(4, Int8PaddedK(a.k));
  const uint8_t* xu = nullptr;
  if (vnni) {
    // vpdpbusd takes u8 activations: x + 128 (flipping the sign bit), once per call.
    thread_local std::vector<uint8_t> offset;
    if (static_cast<int64_t>(offset.size()) < a.m * kp) offset.resize(a.m * kp);
    for (int64_t i = 0; i < a.m * kp; ++i) offset[i] = static_cast<uint8_t>(a.x[i]) ^ 0x80u;
    xu = offset.data();
  }
  const int64_t blocks = Int8PaddedN(a.n) / kInt8BlockCols;
  const int64_t rows_per_block = std::max<int64_t>(4, kRowBlockBytes / kp / 4 * 4);
  // Panels: about kPanelBytes of weights each, their number a multiple of the thread count so
  // that no thread waits on another's extra panel. Any split gives the same bits.
  const int64_t threads = omp_get_max_threads();
  const bool parallel = a.m * a.n * a.k >= kMinParallelMacs && blocks > 1 && threads > 1;
  int64_t panels = std::max<int64_t>(1, blocks * kInt8BlockCols * kp / kPanelBytes);
  if (parallel) panels = (std::max(panels, threads) + threads - 1) / threads * threads;
  panels = std::min(panels, blocks);
  const int64_t per_panel = (blocks + panels - 1) / panels;
  panels = (blocks + per_panel - 1) / per_panel;
  for (int64_t r0 = 0; r0 < a.m; r0 += rows_per_block) {
    const int64_t r1 = std::min(a.m, r0 + rows_per_block);
#pragma omp parallel for schedule(static) if (parallel)
    for (int64_t p = 0; p < panels; ++p) {
      const int64_t b0 = p * per_panel, b1 = std::min(blocks, (p + 1) * per_panel);
      if (vnni) {
        int8_impl::PanelVnni(a, xu, r0, r1, b0, b1);
      } else {
        int8_impl::PanelAvx2(a, a.x, r0, r1, b0, b1);
      }
    }
  }
}

}  // namespace ferry::kernels::cpu
