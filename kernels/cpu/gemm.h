// Batch-invariant dense matmul for AVX2 CPUs: out[m, n] = x[m, k] W[n, k]^T (+ bias) (+ out).
//
// Why it exists: on a CPU without AVX-512, oneDNN 2.6 has no bf16 matmul, and its fp32 kernels
// change a row's reduction order with the number of rows in the call, so the worker padded every
// call to 16 rows (16x the work of a one-sequence decode step). Here every output element is
// one fixed computation whatever m is and wherever its row sits in the call:
//   eight fp32 partial sums, lane j taking k-indices j, j+8, j+16, ... in order with fused
//   multiply-adds; then the lanes summed as ((0+4)+(2+6)) + ((1+5)+(3+7)); then any k tail
//   (k % 8 elements) in order; then bias; then added to out when accumulating.
// So a row's result is bitwise the same in a call of 1 row or 512, which is what lets
// continuous batching never change a greedy result. Needs AVX2 and FMA (every x86 CPU the
// worker runs on); the result is the same on AVX2 and AVX-512 machines.
//
// fp32 weights stay in Hugging Face's plain [n, k] row-major layout. bf16 weights are packed once
// at load (PackBf16) so that the rows a tile reads together are one sequential stream: a plain
// bf16 matrix read 8 rows at a time reached 6-10 GB/s of the VM's 15 (docs/benchmarks/cpu.md).
// bf16 is widened exactly to fp32 as it is loaded. Output columns are split across OpenMP
// threads, which does not touch the order above.
#pragma once

#include <cstdint>

namespace ferry::kernels::cpu {

enum class GemmWeight {
  kFloat32,        // float [n, k] row-major
  kBfloat16Packed  // uint16_t bf16 bits in PackBf16's layout
};

// Rows of W per packed group. Layout of PackBf16: for each group of kBf16GroupRows rows (the last
// padded with zero rows), for each chunk of 8 k-indices below k8 = k - k % 8, the group's rows'
// 8 values one after another; then every row's k - k8 tail values, row by row.
constexpr int kBf16GroupRows = 3;
int64_t PackedBf16Size(int64_t n, int64_t k);  // uint16_t elements
// weight: [n, k] row-major fp32, rounded to bf16 (nearest even); out: [PackedBf16Size(n, k)].
void PackBf16(const float* weight, int64_t n, int64_t k, uint16_t* out);

struct GemmArgs {
  const float* x = nullptr;     // [m, k] row-major, row stride k
  const void* weight = nullptr;  // [n, k]: laid out as `dtype` says
  GemmWeight dtype = GemmWeight::kFloat32;
  const float* bias = nullptr;  // [n] or nullptr
  float* out = nullptr;         // [m, n] row-major, row stride n
  int64_t m = 0;
  int64_t n = 0;
  int64_t k = 0;
  bool accumulate = false;      // out += x W^T (bias, if any, added too) instead of out = ...
};

// Throws std::invalid_argument on negative sizes or a null pointer where m * n > 0.
void Gemm(const GemmArgs& args);

// Rounds fp32 values to the nearest bf16 (ties to even), kept as fp32: what a bf16 matmul
// does to its activations before multiplying. In place allowed (out == x).
void RoundToBf16(const float* x, float* out, int64_t n);

}  // namespace ferry::kernels::cpu
