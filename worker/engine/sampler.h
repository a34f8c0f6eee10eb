// Token sampling from one row of logits. Deterministic given (logits, options, history, sample
// index): the random draw is a pure function of (seed, index) and the history is rebuilt from
// the tokens a sequence is (re)sent with, so a sequence samples the same tokens whatever else
// shares its batch and after preemption and recompute.
#pragma once

#include <cstdint>
#include <string>
#include <unordered_map>
#include <utility>
#include <vector>

#include "common/counter_uniform.h"
#include "common/sampling_limits.h"
#include "worker/engine/model_runner.h"

namespace ferry::worker {

class TokenMask;  // worker/engine/guided_decoding.h

// Uniform in [0, 1) from a counter-based generator: splitmix64 over the pair. No state.
using ferry::CounterUniform;  // common/counter_uniform.h

// Largest SamplingOptions.logprobs accepted.
using ferry::kMaxLogprobs;  // common/sampling_limits.h

// Empty when the options are within the documented ranges, else what is wrong with them.
std::string CheckSamplingOptions(const SamplingOptions& options);

// Whether any penalty is on, i.e. whether sampling needs the sequence's TokenCounts.
bool HasPenalties(const SamplingOptions& options);

// Whether the argmax of the raw logits is what Sampler::Sample returns and all it returns (no
// logprobs): the fast path a backend may take (the GPU's device argmax). Reads every field of
// SamplingOptions; sampler.cc fails to compile when a field is added until it is decided here, so
// a new option cannot be silently skipped by a fast path.
bool ArgmaxSuffices(const SamplingOptions& options);

// The distinct tokens a sequence has seen, with how often each was generated, kept up to date
// one token at a time so a penalty step costs O(distinct tokens), never O(vocab) or O(length).
class TokenCounts {
 public:
  struct Entry {
    int32_t token_id = 0;
    int32_t num_generated = 0;  // occurrences among generated tokens
    bool in_prompt = false;
  };

  // token_ids: the prompt followed by the last num_generated tokens, which were generated.
  void Reset(const std::vector<int32_t>& token_ids, int32_t num_generated);
  void AddGenerated(int32_t token_id);
  // One entry per distinct token, in first-seen order.
  const std::vector<Entry>& entries() const { return entries_; }

 private:
  Entry& Find(int32_t token_id);

  std::vector<Entry> entries_;
  std::unordered_map<int32_t, int32_t> index_;  // token id -> position in entries_
};

// Applies repetition, then frequency and presence penalties (vLLM's order) to logits in place,
// touching only the tokens in counts.
void ApplyPenalties(float* logits,  // [vocab]
                    const SamplingOptions& options, const TokenCounts& counts);

struct SampleResult {
  int32_t token_id = 0;
  float logprob = 0.f;  // of token_id under the raw logits; set when options.logprobs >= 0
  int32_t rank = 0;     // Score only: 1 + the number of tokens with a larger logit
  std::vector<std::pair<int32_t, float>> top_logprobs;  // most likely first, ties by lower id
};

class Sampler {
 public:
  // Order: logit bias and min_tokens suppression, penalties, temperature, top-k, top-p, min-p,
  // draw. Temperature 0 (or below 1e-5):
  // argmax of the penalised logits, lowest id on ties. Otherwise logits / temperature, keep the
  // top_k most likely (when top_k > 0), then the smallest most-likely set whose mass reaches
  // top_p, then drop tokens with p < min_p * max p, renormalise and draw with
  // CounterUniform(seed, sample_index). Logprobs are of the raw logits. A null history
  // skips the penalties. allowed (guided decoding): only these ids are sampled; when the bias
  // or min_tokens leaves none of them, the constraint wins and they are sampled from their raw
  // logits. Null: every id.
  SampleResult Sample(const float* logits,  // [vocab]
                      int32_t vocab, const SamplingOptions& options, const TokenCounts* history,
                      int32_t sample_index, const TokenMask* allowed = nullptr);
  // The token only, without history (penalties are then no-ops).
  int32_t Sample(const float* logits, int32_t vocab, const SamplingOptions& options,
                 int32_t sample_index) {
    return Sample(logits, vocab, options, nullptr, sample_index).token_id;
  }

  // Log-softmax of the raw logits at token_id, plus the num_top (<= 20) most likely, and
  // token_id's rank: a prompt token's logprob, scored the way Sample scores a sampled one.
  SampleResult Score(const float* logits,  // [vocab]
                     int32_t vocab, int32_t token_id, int32_t num_top);

 private:
  struct Candidate {
    float logit;  // after penalties and temperature
    int32_t id;
  };
  int32_t Draw(int32_t vocab, const SamplingOptions& options, int32_t sample_index);
  size_t SelectTopK(size_t k, int32_t vocab);
  size_t NucleusSize(size_t end, float max_logit, double target);
  void FillLogprobs(const float* logits, int32_t vocab, int32_t num_top, SampleResult* out);
  void MaskDisallowed(const float* logits, int32_t vocab, const TokenMask& allowed, bool biased);

  // Scratch reused across calls so a call allocates nothing vocab-sized once warm.
  std::vector<float> penalized_;       // [vocab]
  std::vector<Candidate> candidates_;  // [vocab]
  std::vector<double> weights_;        // [kept] exp(logit - max)
  std::vector<Candidate> top_;         // bounded heap for small top-k and logprobs
};

// argmax with the lowest id winning ties.
int32_t Argmax(const float* logits, int32_t vocab);  // logits: [vocab]

}  // namespace ferry::worker
