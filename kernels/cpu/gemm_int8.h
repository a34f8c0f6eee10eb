// W8A8 int8 matmul: out[m, n] = float(sum_k qx[m, k] qw[n, k]) * sx[m] * sw[n] (+ bias) (+ out).
//
// Weights are quantized once at load, per output channel (row of W), symmetric: sw[n] =
// max|w|/127, qw = round(w / sw) in [-127, 127] (a checkpoint quantized elsewhere may also hold
// -128). Activations are quantized per token (row of x) the same way at run time
// (QuantizeRowsInt8). Products are summed in int32, which is exact (even with VNNI's +128 offset,
// |sum| <= 255 * 128 * k < 2^31 for k <= 65,536), so the order of the sum does not matter: a
// row's result is the same bits whatever the row count, the tile shape, the thread split or the
// instruction set. The float epilogue is one fixed sequence per element, compiled without FP
// contraction: v = float(acc); v = v * sx[m]; v = v * sw[n]; v = v + bias[n]; out = out + v.
//
// Two kernels, same bits: AVX-512 VNNI (vpdpbusd, u8 x s8: x is offset by 128 and the offset
// removed exactly with the weight row sums), and an AVX2 one (int8 widened to int16, vpmaddwd)
// for CPUs without VNNI or under FERRY_CPU_ISA=avx2.
//
// Packed weight layout (PackInt8): columns in groups of kInt8Cols = 16 (one vpdpbusd operand: 16
// columns x 4 k-values, 64 bytes), groups in blocks of kInt8Groups = 4 (64 columns; the last block
// padded with zero rows), k padded with zeros to a multiple of 4 (Int8PaddedK). For each block,
// for each 4-chunk of k, its 4 groups' 64 bytes one after another: a kernel tile of 64 columns
// reads one sequential stream of 256 bytes per 4 k-values, which the hardware prefetcher follows
// at full memory bandwidth (decode reads every weight once per step).
#pragma once

#include <cstdint>

namespace ferry::kernels::cpu {

constexpr int kInt8Cols = 16;
constexpr int kInt8Groups = 4;
constexpr int kInt8BlockCols = kInt8Cols * kInt8Groups;
inline int64_t Int8PaddedK(int64_t k) { return (k + 3) / 4 * 4; }
inline int64_t Int8PaddedN(int64_t n) { return (n + kInt8BlockCols - 1) / kInt8BlockCols * kInt8BlockCols; }
inline int64_t PackedInt8Size(int64_t n, int64_t k) { return Int8PaddedN(n) * Int8PaddedK(k); }

// Quantizes rows of a [rows, k] fp32 matrix symmetrically: scale[r] = max_j |src[r, j]| / 127
// (0 for an all-zero row), q[r, j] = round-to-nearest-even(src[r, j] * (127 / max)).
// q: [rows, Int8PaddedK(k)], the padding zeroed; scale: [rows]. Used for activations (per token)
// and weights (per output channel) alike.
void QuantizeRowsInt8(const float* src,  // [rows, k]
                      int64_t rows, int64_t k,
                      int8_t* q,         // [rows, Int8PaddedK(k)]
                      float* scale);     // [rows]

// Packs quantized weights q ([n, Int8PaddedK(k)] as QuantizeRowsInt8 writes them) into the layout
// above, and writes each column's sum of q (sums[n..Int8PaddedN(n)) = 0): the VNNI kernel's offset
// correction. packed: [PackedInt8Size(n, k)]; sums: [Int8PaddedN(n)].
void PackInt8(const int8_t* q, int64_t n, int64_t k, int8_t* packed, int32_t* sums);

struct GemmInt8Args {
  const int8_t* x = nullptr;       // [m, Int8PaddedK(k)] quantized activations, padding zero
  const float* x_scale = nullptr;  // [m]
  const int8_t* weight = nullptr;  // PackInt8's layout
  const float* w_scale = nullptr;  // [Int8PaddedN(n)] (padding any finite value)
  const int32_t* w_sums = nullptr;  // [Int8PaddedN(n)] from PackInt8
  const float* bias = nullptr;     // [n] or nullptr
  float* out = nullptr;            // [m, n] row-major, row stride n
  int64_t m = 0;
  int64_t n = 0;
  int64_t k = 0;
  bool accumulate = false;  // out += ... instead of out = ...
};

// Throws std::invalid_argument on negative sizes or a null pointer where m * n > 0.
void GemmInt8(const GemmInt8Args& args);

// Whether GemmInt8 runs the VNNI kernel (AVX-512 VNNI present and isa.h's choice is AVX-512).
bool Int8UsesVnni();

}  // namespace ferry::kernels::cpu
