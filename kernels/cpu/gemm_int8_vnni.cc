// The AVX-512 VNNI int8 kernel (contract in gemm_int8.h). Compiled with -mavx512vnni and
// -ffp-contract=off; run only where the CPU has VNNI (gemm_int8.cc dispatches).
#include <immintrin.h>

#include <cstring>

#include "kernels/cpu/gemm_int8_impl.h"

namespace ferry::kernels::cpu::int8_impl {
namespace {

// Four int8 activations as one 32-bit lane of u8 (x + 128): vpdpbusd multiplies u8 by s8.
inline __m512i BroadcastU8(const int8_t* x) {
  int32_t v;
  std::memcpy(&v, x, sizeof(v));
  return _mm512_set1_epi32(v ^ static_cast<int32_t>(0x80808080u));
}

// R rows x C groups of 16 columns, starting at row r and group g.
template <int R, int C>
void Tile(const GemmInt8Args& a, int64_t kp, int64_t r, int64_t g) {
  const int8_t* w[C];
#pragma GCC unroll 8
  for (int c = 0; c < C; ++c) w[c] = a.weight + (g + c) * kInt8Cols * kp;
  const int8_t* x = a.x + r * kp;
  __m512i acc[R][C];
#pragma GCC unroll 8
  for (int i = 0; i < R; ++i) {
#pragma GCC unroll 8
    for (int c = 0; c < C; ++c) acc[i][c] = _mm512_setzero_si512();
  }
  for (int64_t kk = 0; kk < kp; kk += 4) {
    __m512i wv[C];
#pragma GCC unroll 8
    for (int c = 0; c < C; ++c) wv[c] = _mm512_loadu_si512(w[c] + kk * kInt8Cols);
#pragma GCC unroll 8
    for (int i = 0; i < R; ++i) {
      const __m512i xb = BroadcastU8(x + i * kp + kk);
#pragma GCC unroll 8
      for (int c = 0; c < C; ++c) acc[i][c] = _mm512_dpbusd_epi32(acc[i][c], xb, wv[c]);
    }
  }
  for (int c = 0; c < C; ++c) {
    const int64_t col = (g + c) * kInt8Cols;
    if (col >= a.n) break;
    // The +128 offset contributed 128 * (column sum of q): removed exactly.
    const __m512i offset = _mm512_slli_epi32(_mm512_loadu_si512(a.w_sums + col), 7);
    const int64_t count = a.n - col < kInt8Cols ? a.n - col : kInt8Cols;
    for (int i = 0; i < R; ++i) {
      alignas(64) int32_t sums[kInt8Cols];
      _mm512_store_si512(sums, _mm512_sub_epi32(acc[i][c], offset));
      Int8Epilogue(a, r + i, col, count, sums);
    }
  }
}

// Tiles of 4 rows x 4 groups (16 accumulators, 4 weight vectors, one broadcast), a single row
// taking 8 groups so that it still has 8 independent chains; then the leftovers.
template <int R, int C>
void Rows(const GemmInt8Args& a, int64_t kp, int64_t r, int64_t g0, int64_t g1) {
  int64_t g = g0;
  for (; g + C <= g1; g += C) Tile<R, C>(a, kp, r, g);
  for (; g < g1; ++g) Tile<R, 1>(a, kp, r, g);
}

}  // namespace

void PanelVnni(const GemmInt8Args& a, int64_t r0, int64_t r1, int64_t g0, int64_t g1) {
  const int64_t kp = Int8PaddedK(a.k);
  int64_t r = r0;
  for (; r + 4 <= r1; r += 4) Rows<4, 4>(a, kp, r, g0, g1);
  for (; r < r1; ++r) Rows<1, 8>(a, kp, r, g0, g1);
}

}  // namespace ferry::kernels::cpu::int8_impl
