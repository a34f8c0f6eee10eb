// The AVX-512 VNNI int8 kernel (contract in gemm_int8.h). Compiled with -mavx512vnni and
// -ffp-contract=off; run only where the CPU has VNNI (gemm_int8.cc dispatches).
#include <immintrin.h>

#include <cstring>

#include "kernels/cpu/gemm_int8_impl.h"

namespace ferry::kernels::cpu::int8_impl {
namespace {

// Four u8 activations broadcast to every 32-bit lane (one vpbroadcastd from memory).
inline __m512i Broadcast4(const uint8_t* x) {
  int32_t v;
  std::memcpy(&v, x, sizeof(v));
  return _mm512_set1_epi32(v);
}

// R rows x one block of 64 columns (4 vpdpbusd operands per 4 k-values). A single row is
// memory-bound and would have only 4 dependent chains: it takes two k-chunks per iteration into
// separate accumulators (8 chains), summed at the end (exactly: integers).
template <int R>
void Tile(const GemmInt8Args& a, const uint8_t* xu, int64_t kp, int64_t r, int64_t block) {
  constexpr int U = R == 1 ? 2 : 1;
  const int8_t* w = a.weight + block * kInt8BlockCols * kp;
  const uint8_t* x = xu + r * kp;
  __m512i acc[U][R][kInt8Groups];
  for (int u = 0; u < U; ++u) {
    for (int i = 0; i < R; ++i) {
      for (int c = 0; c < kInt8Groups; ++c) acc[u][i][c] = _mm512_setzero_si512();
    }
  }
  auto step = [&](int u, int64_t kk) {
    __m512i wv[kInt8Groups];
#pragma GCC unroll 4
    for (int c = 0; c < kInt8Groups; ++c) wv[c] = _mm512_loadu_si512(w + kk * kInt8BlockCols + c * 64);
#pragma GCC unroll 8
    for (int i = 0; i < R; ++i) {
      const __m512i xb = Broadcast4(x + i * kp + kk);
#pragma GCC unroll 4
      for (int c = 0; c < kInt8Groups; ++c) acc[u][i][c] = _mm512_dpbusd_epi32(acc[u][i][c], xb, wv[c]);
    }
  };
  int64_t kk = 0;
  for (; kk + 4 * U <= kp; kk += 4 * U) {
#pragma GCC unroll 2
    for (int u = 0; u < U; ++u) step(u, kk + 4 * u);
  }
  for (; kk < kp; kk += 4) step(0, kk);
  for (int c = 0; c < kInt8Groups; ++c) {
    const int64_t col = block * kInt8BlockCols + c * kInt8Cols;
    if (col >= a.n) break;
    // The +128 offset contributed 128 * (column sum of q): removed exactly.
    const __m512i offset = _mm512_slli_epi32(_mm512_loadu_si512(a.w_sums + col), 7);
    const int64_t count = a.n - col < kInt8Cols ? a.n - col : kInt8Cols;
    for (int i = 0; i < R; ++i) {
      __m512i sum = acc[0][i][c];
      for (int u = 1; u < U; ++u) sum = _mm512_add_epi32(sum, acc[u][i][c]);
      alignas(64) int32_t sums[kInt8Cols];
      _mm512_store_si512(sums, _mm512_sub_epi32(sum, offset));
      Int8Epilogue(a, r + i, col, count, sums);
    }
  }
}

}  // namespace

// Tiles of 4 rows x 64 columns: 16 accumulators, 4 weight vectors and a broadcast per 4 k.
void PanelVnni(const GemmInt8Args& a, const uint8_t* x, int64_t r0, int64_t r1, int64_t b0, int64_t b1) {
  const int64_t kp = Int8PaddedK(a.k);
  int64_t r = r0;
  for (; r + 4 <= r1; r += 4) {
    for (int64_t b = b0; b < b1; ++b) Tile<4>(a, x, kp, r, b);
  }
  for (; r < r1; ++r) {
    for (int64_t b = b0; b < b1; ++b) Tile<1>(a, x, kp, r, b);
  }
}

}  // namespace ferry::kernels::cpu::int8_impl
