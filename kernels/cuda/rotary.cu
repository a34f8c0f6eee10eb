#include "kernels/cuda/rotary.h"

#include <cuda_runtime.h>

namespace ferry::kernels::cuda {
namespace {

struct QkvRotaryParams {
  float* qkv;                            // [num_tokens, qkv_stride]
  const float* __restrict__ bias;        // [qkv_dim] or nullptr
  const float* __restrict__ cos_sin;     // [max_position, head_dim]
  const int32_t* __restrict__ positions; // [num_tokens]
  int num_heads;
  int num_kv_heads;
  int head_dim;
  int64_t qkv_stride;
  const float* __restrict__ q_norm;  // [head_dim] or nullptr (then k_norm too)
  const float* __restrict__ k_norm;
  float norm_eps;
};

__device__ __forceinline__ float Bias(const float* bias, int i) { return bias != nullptr ? bias[i] : 0.f; }

// One block per token. Work items: (rotated head, pair i < half) for the q and k heads, then
// one item per v element (bias only).
template <int kThreads>
__global__ void __launch_bounds__(kThreads) QkvRotaryKernel(QkvRotaryParams p) {
  const int half = p.head_dim / 2;
  float* row = p.qkv + static_cast<int64_t>(blockIdx.x) * p.qkv_stride;
  const float* cos_ = p.cos_sin + static_cast<int64_t>(p.positions[blockIdx.x]) * p.head_dim;
  const float* sin_ = cos_ + half;
  const int rotated_heads = p.num_heads + p.num_kv_heads;
  const int num_pairs = rotated_heads * half;
  const int v_begin = rotated_heads * p.head_dim;
  const int num_items = num_pairs + p.num_kv_heads * p.head_dim;
  for (int item = threadIdx.x; item < num_items; item += kThreads) {
    if (item < num_pairs) {
      const int head = item / half, i = item % half;
      const int lo = head * p.head_dim + i, hi = lo + half;
      const float a = row[lo] + Bias(p.bias, lo);
      const float b = row[hi] + Bias(p.bias, hi);
      const float c = cos_[i], s = sin_[i];
      // Same expression as the CPU kernel: a * c - b * s and b * c + a * s, unfused.
      row[lo] = __fsub_rn(__fmul_rn(a, c), __fmul_rn(b, s));
      row[hi] = __fadd_rn(__fmul_rn(b, c), __fmul_rn(a, s));
    } else {
      const int e = v_begin + (item - num_pairs);
      row[e] += Bias(p.bias, e);
    }
  }
}

// The same with each q and k head RMS-normed between the bias and the rotation (Qwen3). One
// block per token, one warp per head: the warp sums the head's squares, scales its values in
// place, then rotates its pairs; v heads get their bias only.
template <int kWarps>
__global__ void __launch_bounds__(kWarps * 32) QkvNormRotaryKernel(QkvRotaryParams p) {
  const int half = p.head_dim / 2, lane = threadIdx.x % 32, warp = threadIdx.x / 32;
  float* row = p.qkv + static_cast<int64_t>(blockIdx.x) * p.qkv_stride;
  const float* cos_ = p.cos_sin + static_cast<int64_t>(p.positions[blockIdx.x]) * p.head_dim;
  const float* sin_ = cos_ + half;
  const int rotated_heads = p.num_heads + p.num_kv_heads;
  for (int head = warp; head < rotated_heads; head += kWarps) {
    float* x = row + head * p.head_dim;
    const float* bias = p.bias != nullptr ? p.bias + head * p.head_dim : nullptr;
    const float* weight = head < p.num_heads ? p.q_norm : p.k_norm;
    float sum = 0.f;
    for (int i = lane; i < p.head_dim; i += 32) {
      const float v = x[i] + Bias(bias, i);
      x[i] = v;
      sum += v * v;
    }
    for (int offset = 16; offset > 0; offset /= 2) sum += __shfl_xor_sync(0xffffffffu, sum, offset);
    const float scale = rsqrtf(sum / static_cast<float>(p.head_dim) + p.norm_eps);
    for (int i = lane; i < p.head_dim; i += 32) x[i] = x[i] * scale * weight[i];
    __syncwarp();  // a pair's two halves were scaled by different lanes
    for (int i = lane; i < half; i += 32) {
      const float a = x[i], b = x[i + half];
      const float c = cos_[i], s = sin_[i];
      x[i] = __fsub_rn(__fmul_rn(a, c), __fmul_rn(b, s));
      x[i + half] = __fadd_rn(__fmul_rn(b, c), __fmul_rn(a, s));
    }
  }
  if (p.bias == nullptr) return;
  const int v_begin = rotated_heads * p.head_dim, v_size = p.num_kv_heads * p.head_dim;
  for (int e = threadIdx.x; e < v_size; e += kWarps * 32) row[v_begin + e] += p.bias[v_begin + e];
}

}  // namespace

int QkvBiasRotary(const QkvRotaryArgs& args) {
  if (args.num_tokens <= 0) return 0;
  if (args.head_dim <= 0 || args.head_dim % 2 != 0) return static_cast<int>(cudaErrorInvalidValue);
  if ((args.q_norm == nullptr) != (args.k_norm == nullptr)) return static_cast<int>(cudaErrorInvalidValue);
  QkvRotaryParams p{args.qkv,      args.bias,         args.cos_sin, args.positions, args.num_heads,
                    args.num_kv_heads, args.head_dim, args.qkv_stride, args.q_norm, args.k_norm,
                    args.norm_eps};
  auto stream = static_cast<cudaStream_t>(args.stream);
  if (args.q_norm != nullptr) {
    QkvNormRotaryKernel<8><<<args.num_tokens, 8 * 32, 0, stream>>>(p);
  } else {
    QkvRotaryKernel<256><<<args.num_tokens, 256, 0, stream>>>(p);
  }
  return static_cast<int>(cudaGetLastError());
}

}  // namespace ferry::kernels::cuda
