// LoRA's low-rank update on the GPU (issue #57): Punica's BGMV split for a batch whose token rows
// run under different adapters. The base GEMM runs once for the whole batch (cuBLAS); then, for
// each row whose adapter targets the projection, the shrink v = A x (to the adapter's rank, fp32)
// and the expand out += scale * B v, each row reading its own adapter's weights through a slot
// table. Fixed launch sizes (the rows of the step, the slots' largest rank) and per-step inputs in
// device memory (each row's slot, the slot table), so a decode step holding it is captured in a
// CUDA graph and replayed with other adapters. A row's result depends on its input and its adapter
// only, never on the rows beside it. Reference: kernels/cpu/lora.h (same math, fp32 accumulation).
#pragma once

#include <cstdint>

namespace ferry::kernels::cuda {

// One slot's weights for one projection, in device memory, bf16. a null: the slot's adapter does
// not target the projection (its rows are left as the base GEMM wrote them).
struct LoraSlotWeights {
  const uint16_t* a = nullptr;    // [rank, k]: lora_A rows (row r at a + r * k)
  const uint16_t* b_t = nullptr;  // [rank, n]: lora_B transposed (row r at b_t + r * n)
  int32_t rank = 0;               // 1..max_rank
  float scale = 0.f;              // lora_alpha / rank, or / sqrt(rank) under rsLoRA
};

struct LoraArgs {
  const uint16_t* x;          // [num_tokens, x_stride] bf16: the projection's input (k used)
  int64_t x_stride;
  float* out;                 // [num_tokens, out_stride] fp32: the base output, updated in place
  int64_t out_stride;
  int64_t out_offset;         // the projection's first column in out (fused q/k/v or gate/up)
  const int32_t* token_slot;  // [num_tokens]: each row's slot in [0, num_slots), -1 none
  const LoraSlotWeights* slots;  // [num_slots] device memory
  int32_t num_slots;
  int32_t num_tokens;
  int64_t k;                  // input width
  int64_t n;                  // output width (columns out_offset .. out_offset + n)
  int32_t max_rank;           // every slot's rank <= this; scratch holds max_rank per row
  float* scratch;             // [num_tokens, max_rank] fp32: the shrink's results
  void* stream;
};

inline constexpr int32_t kMaxLoraRank = 512;

// Enqueues the shrink and the expand. 0, or the launch's cudaError_t as an int; arguments it cannot
// run (a null pointer, a width <= 0, max_rank outside 1..kMaxLoraRank, out_offset < 0 or past
// out_stride - n) return cudaErrorInvalidValue without launching. num_tokens 0 is a no-op.
int LoraShrinkExpand(const LoraArgs& args);
// The same checks, without launching: "" or what is wrong (for the host tests and the callers' errors).
const char* LoraArgsError(const LoraArgs& args);

}  // namespace ferry::kernels::cuda
