#include "kernels/cuda/elementwise.h"

#include <cuda_bf16.h>

#include <algorithm>
#include <cuda_runtime.h>

namespace ferry::kernels::cuda {
namespace {

constexpr int kThreads = 256;
constexpr int kMaxGridY = 65535;  // CUDA's limit on gridDim.y

struct SiluAndMulParams {
  const float* __restrict__ gate_up;  // [num_tokens, 2 * intermediate]
  __nv_bfloat16* __restrict__ out;    // [num_tokens, intermediate]
  int intermediate;
  int num_tokens;
};

// grid (column blocks, min(tokens, kMaxGridY)): a block strides over the tokens, since grid.y
// stops at 65,535 and a step may hold more tokens.
__global__ void __launch_bounds__(kThreads) SiluAndMulKernel(SiluAndMulParams p) {
  const int i = blockIdx.x * kThreads + threadIdx.x;
  if (i >= p.intermediate) return;
  for (int64_t row = blockIdx.y; row < p.num_tokens; row += gridDim.y) {
    const float* gate = p.gate_up + row * 2 * p.intermediate;
    const float g = gate[i], u = gate[p.intermediate + i];
    p.out[row * p.intermediate + i] = __float2bfloat16_rn(g / (1.f + expf(-g)) * u);
  }
}

struct EmbeddingParams {
  const int32_t* __restrict__ token_ids;   // [num_tokens]
  const __nv_bfloat16* __restrict__ table; // [vocab, hidden]
  float* __restrict__ out;                 // [num_tokens, hidden]
  int hidden;
};

// One block per token.
__global__ void __launch_bounds__(kThreads) EmbeddingKernel(EmbeddingParams p) {
  const __nv_bfloat16* row = p.table + static_cast<int64_t>(p.token_ids[blockIdx.x]) * p.hidden;
  float* dst = p.out + static_cast<int64_t>(blockIdx.x) * p.hidden;
  for (int i = threadIdx.x; i < p.hidden; i += kThreads) dst[i] = __bfloat162float(row[i]);
}

struct GatherVocabParams {
  const float* __restrict__ gathered;  // [num_ranks, num_rows, slice]
  float* __restrict__ out;             // [num_rows, vocab]
  int num_rows;
  int slice;
  int vocab;
};

// grid (column blocks, rows).
__global__ void __launch_bounds__(kThreads) GatherVocabKernel(GatherVocabParams p) {
  const int col = blockIdx.x * kThreads + threadIdx.x;
  if (col >= p.vocab) return;
  const int rank = col / p.slice, offset = col % p.slice;
  for (int64_t row = blockIdx.y; row < p.num_rows; row += gridDim.y) {  // as SiluAndMul: grid.y is bounded
    const int64_t src = (static_cast<int64_t>(rank) * p.num_rows + row) * p.slice + offset;
    p.out[row * p.vocab + col] = p.gathered[src];
  }
}

int Blocks(int n) { return (n + kThreads - 1) / kThreads; }

}  // namespace

int SiluAndMul(const SiluAndMulArgs& args) {
  if (args.num_tokens <= 0 || args.intermediate <= 0) return 0;
  SiluAndMulParams p{args.gate_up, reinterpret_cast<__nv_bfloat16*>(args.out), args.intermediate, args.num_tokens};
  const dim3 grid(Blocks(args.intermediate), std::min(args.num_tokens, kMaxGridY));
  SiluAndMulKernel<<<grid, kThreads, 0, static_cast<cudaStream_t>(args.stream)>>>(p);
  return static_cast<int>(cudaGetLastError());
}

int Embedding(const EmbeddingArgs& args) {
  if (args.num_tokens <= 0) return 0;
  EmbeddingParams p{args.token_ids, reinterpret_cast<const __nv_bfloat16*>(args.table), args.out, args.hidden};
  EmbeddingKernel<<<args.num_tokens, kThreads, 0, static_cast<cudaStream_t>(args.stream)>>>(p);
  return static_cast<int>(cudaGetLastError());
}

int GatherVocabShards(const GatherVocabArgs& args) {
  if (args.num_rows <= 0) return 0;
  if (args.vocab > static_cast<int64_t>(args.num_ranks) * args.slice) return static_cast<int>(cudaErrorInvalidValue);
  GatherVocabParams p{args.gathered, args.out, args.num_rows, args.slice, args.vocab};
  const dim3 grid(Blocks(args.vocab), std::min(args.num_rows, kMaxGridY));
  GatherVocabKernel<<<grid, kThreads, 0, static_cast<cudaStream_t>(args.stream)>>>(p);
  return static_cast<int>(cudaGetLastError());
}

}  // namespace ferry::kernels::cuda
