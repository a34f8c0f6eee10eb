// The full sampler on the device, batched: one block per row, for every parameter the CPU
// sampler (worker/engine/sampler.h, the reference) serves. Per row, in the CPU's order:
//   1. logit bias, then min_tokens suppression (bias entries of -inf), on a scratch copy of the row;
//   2. the allowed-ids / guided-decoding bitmask (a rejected id reads as -inf);
//   3. repetition, then frequency and presence penalties (vLLM's order);
//   4. temperature < 1e-5 (is_greedy): the argmax of that, lowest id on ties. Otherwise
//      logits * inv_temperature, then the kept set: the top_k most likely, the smallest
//      most-likely set whose mass reaches top_p of the top-k mass, and min-p, each a prefix of
//      the order (logit descending, id ascending), so the kept set is the shortest of the three;
//   5. the draw: u = CounterUniform(seed, sample_index) over the kept set's mass.
// Logprobs are the log-softmax of the RAW logits: the sampled token's and up to 20 alternatives,
// most likely first, ties by lower id.
//
// Same distribution as the CPU, not the same token for a given seed: the kept set is found by
// radix selection over order-preserving float bits (no sort), its weights exp(logit - max) are
// summed in fixed point (2^-40 units: exact, so independent of the thread layout), and the
// draw walks the kept set in id order, where the CPU walks it in its own partition order. A
// token whose weight is below 2^-40 of the most likely one's is kept but never drawn (the CPU
// draws it with probability < 1e-12). Kept-set boundaries agree with the CPU's except where a
// top-p mass lands within rounding (float exp on each side) of the target.
//
// Deterministic: a row's result depends only on its logits and parameters, never on the
// other rows of the batch or on the order of atomics (integer histograms, fixed reductions).
#pragma once

#include <cstdint>
#include <limits>

namespace ferry::kernels::cuda {

// Largest number of top logprobs per row (the CPU's kMaxLogprobs).
inline constexpr int kSamplerMaxTopLogprobs = 20;
// Largest vocabulary: the fixed-point mass of a row must fit in 64 bits (2^23 * 2^40).
inline constexpr int32_t kSamplerMaxVocab = 1 << 23;

// One row's parameters (the host packs them: worker/gpu/device_sampler.h).
struct SamplerRowParams {
  int32_t logits_row = 0;    // row of `logits` this sample reads
  int32_t is_greedy = 1;     // temperature < 1e-5: argmax of the penalised logits
  float inv_temperature = 1.f;  // 1 / temperature, as the CPU computes it
  int32_t top_k = 0;         // 0 or >= vocab: off
  float top_p = 1.f;         // 1: off
  // log(min_p): keep logit - max >= this. -inf (min_p 0): off.
  double min_p_log = -std::numeric_limits<double>::infinity();
  float presence_penalty = 0.f;
  float frequency_penalty = 0.f;
  float repetition_penalty = 1.f;
  int32_t num_top_logprobs = -1;  // -1: no logprobs; 0: the sampled token's; N <= 20: plus the top N
  uint64_t seed = 0;
  uint64_t sample_index = 0;
  // Offsets into the arena, in 4-byte words. Entries are 2 words each.
  int32_t bias_offset = 0;   // SamplerBias[num_bias], sorted by id, equal ids in application order
  int32_t num_bias = 0;
  int32_t penalty_offset = 0;  // SamplerPenalty[num_penalties], distinct ids
  int32_t num_penalties = 0;
  int32_t mask_offset = -1;    // uint32[ceil(vocab / 32)], bit i%32 of word i/32 = id i allowed; -1: none
};

struct SamplerBias {
  int32_t token_id;
  float bias;  // added to the logit; -inf: suppressed (min_tokens)
};

struct SamplerPenalty {
  int32_t token_id;       // seen in the prompt or generated: repetition applies
  int32_t num_generated;  // > 0: presence and frequency apply
};

// One row's result.
struct SamplerResult {
  int32_t token_id;
  float logprob;  // of token_id under the raw logits (when num_top_logprobs >= 0)
  int32_t top_ids[kSamplerMaxTopLogprobs];  // the first num_top_logprobs, most likely first; then -1
  float top_logprobs[kSamplerMaxTopLogprobs];
};

struct SampleArgs {
  const float* logits;                 // [num_logits_rows, vocab] raw
  const SamplerRowParams* params;      // [num_rows]
  const uint32_t* arena;               // entries and masks the params point into
  float* scratch;                      // [num_rows, vocab] the biased, penalised rows (rows with entries)
  SamplerResult* out;                  // [num_rows]
  int32_t num_rows;
  int32_t vocab;
  void* stream;
};

// Samples every row. Returns 0, or cudaErrorInvalidValue without launching for null pointers
// or a vocab outside [1, kSamplerMaxVocab] (the caller names the field). Allocates nothing and
// never synchronises (capturable). Ids in the entries must be < vocab, logits finite.
int Sample(const SampleArgs& args);

}  // namespace ferry::kernels::cuda
