// Shared by the two int8 kernels (gemm_int8.cc: AVX2, gemm_int8_vnni.cc: AVX-512 VNNI). Both files
// are compiled with -ffp-contract=off, so Int8Epilogue is the same float operations, unfused, in
// each: the two kernels give the same bits (gemm_int8.h).
#pragma once

#include <cstdint>

#include "kernels/cpu/gemm_int8.h"

namespace ferry::kernels::cpu::int8_impl {

// Writes one row's outputs for columns [col, col + count), count <= kInt8Cols, from their exact
// int32 sums.
inline void Int8Epilogue(const GemmInt8Args& a, int64_t row, int64_t col, int64_t count,
                         const int32_t* acc) {
  const float sx = a.x_scale[row];
  float* out = a.out + row * a.n + col;
  for (int64_t j = 0; j < count; ++j) {
    float v = static_cast<float>(acc[j]);
    v = v * sx;
    v = v * a.w_scale[col + j];
    if (a.bias != nullptr) v = v + a.bias[col + j];
    out[j] = a.accumulate ? out[j] + v : v;
  }
}

// Rows [r0, r1) x column blocks [b0, b1) (kInt8BlockCols columns each) of the output. x: the
// activations as the kernel reads them, [m, Int8PaddedK(k)]: a.x + 128 as u8 for VNNI, a.x itself
// for AVX2.
void PanelVnni(const GemmInt8Args& a, const uint8_t* x, int64_t r0, int64_t r1, int64_t b0, int64_t b1);
void PanelAvx2(const GemmInt8Args& a, const int8_t* x, int64_t r0, int64_t r1, int64_t b0, int64_t b1);

}  // namespace ferry::kernels::cpu::int8_impl
