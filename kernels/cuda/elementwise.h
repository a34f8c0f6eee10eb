// Element-wise kernels of the decoder on the GPU. References: kernels/cpu SiluAndMul and the
// CPU model's embedding lookup (worker/model/cpu_model.cc).
#pragma once

#include <cstdint>

namespace ferry::kernels::cuda {

// out = bf16(silu(gate) * up) with gate and up the two halves of each row (fused gate/up GEMM).
struct SiluAndMulArgs {
  const float* gate_up;  // [num_tokens, 2 * intermediate] fp32
  uint16_t* out;         // [num_tokens, intermediate] bf16 bits
  int32_t num_tokens;
  int32_t intermediate;
  void* stream;
};
int SiluAndMul(const SiluAndMulArgs& args);

// out[t] = fp32(table[token_ids[t]]): the bf16 embedding rows into the fp32 residual stream.
struct EmbeddingArgs {
  const int32_t* token_ids;  // [num_tokens], each in [0, vocab)
  const uint16_t* table;     // [vocab, hidden] bf16 bits
  float* out;                // [num_tokens, hidden]
  int32_t num_tokens;
  int32_t hidden;
  void* stream;
};
int Embedding(const EmbeddingArgs& args);

// Vocab-parallel logits after an all-gather: gathered holds each rank's padded slice
// [num_ranks, num_rows, slice]; out gets [num_rows, vocab] with the padding dropped.
struct GatherVocabArgs {
  const float* gathered;  // [num_ranks, num_rows, slice]
  float* out;             // [num_rows, vocab]
  int32_t num_ranks;
  int32_t num_rows;
  int32_t slice;
  int32_t vocab;          // <= num_ranks * slice
  void* stream;
};
int GatherVocabShards(const GatherVocabArgs& args);

}  // namespace ferry::kernels::cuda
