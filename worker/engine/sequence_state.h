// One home for what a runner keeps of each sequence between steps, shared by the CPU engine
// (worker/model/cpu_runner.*) and the GPU engine (worker/gpu/cuda_runner.*): the tokens, the KV
// block table, and the state sampling carries from one draw to the next (the seeded stream's
// index, penalty counts, the guided matcher, the allowed-ids mask). A StepSpec is validated and
// applied here, and every sampled token is appended here, so both engines start, forget and
// extend sequences by the same code.
#pragma once

#include <cstdint>
#include <memory>
#include <unordered_map>
#include <vector>

#include "worker/engine/guided_decoding.h"
#include "worker/engine/model_runner.h"
#include "worker/engine/sampler.h"

namespace ferry::worker {

struct LoraAdapter;  // worker/lora/lora_adapter.h: engines that serve adapters set it

struct SequenceState {
  std::vector<int32_t> token_ids;    // prompt + every token generated so far
  int32_t num_computed = 0;          // tokens whose K/V are in the cache
  std::vector<int32_t> block_table;  // physical block ids, in position order
  SamplingOptions sampling;
  int32_t num_generated = 0;         // index of the next draw in the seeded stream
  // Occurrences of token_ids for penalties, rebuilt when (re)sent and extended per sample;
  // left empty when the options have no penalty.
  TokenCounts counts;
  int32_t prompt_logprobs = -1;  // NewSequenceSpec.prompt_logprobs
  int32_t prompt_len = 0;        // token_ids.size() - num_generated when (re)sent
  // Guided decoding: the constraint's state after the generated tokens; null when unguided.
  std::unique_ptr<GuidedMatcher> guided;
  std::unique_ptr<const TokenMask> allowed;  // allowed_token_ids; null: any
  SpeculativeMethod speculative = SpeculativeMethod::kNone;
  int32_t draft_computed = 0;  // kDraftModel: positions whose K/V the draft model's cache holds
  // The adapter it runs under (NewSequenceSpec.lora_name), held for as long as it runs: an
  // eviction or an unload never frees weights it reads. Null: the base model.
  std::shared_ptr<const LoraAdapter> lora;

  int32_t num_known() const { return static_cast<int32_t>(token_ids.size()); }
  // Whether computing `num_tokens` more reaches the end of the known tokens (the step samples).
  bool ReachesEnd(int32_t num_tokens) const { return num_computed + num_tokens == num_known(); }
  // What the sampler draws under: allowed_token_ids' mask, else the guided state's; null: any.
  const TokenMask* mask() const { return allowed ? allowed.get() : SamplingMask(guided.get()); }
  // Appends one sampled token: to the tokens, the seeded stream's index, the penalty counts and
  // the guided state.
  void Append(int32_t token);
};

// The sequences one runner holds, by seq_id. Not thread-safe: the runner's step thread owns it.
class SequenceTable {
 public:
  SequenceTable() = default;
  // `info`: the runner's (vocab_size, limits, what it supports); must outlive the table.
  // `guided_vocab`: the vocabulary guided decoding walks; null when the checkpoint has none.
  SequenceTable(const ModelInfo* info, std::unique_ptr<GuidedVocab> guided_vocab);

  const GuidedVocab* guided_vocab() const { return guided_vocab_.get(); }

  // Throws std::invalid_argument naming the sequence, changing nothing, unless the whole step
  // applies (step_validation.h). Returns the number of tokens the step computes.
  int64_t Validate(const StepSpec& step) const;
  // Forgets the finished and preempted sequences (unknown ids are ignored: forgetting twice is
  // harmless), starts the new ones and extends the scheduled ones' block tables. After Validate.
  void Apply(const StepSpec& step);

  SequenceState& at(uint64_t seq_id) { return seqs_.at(seq_id); }
  const SequenceState& at(uint64_t seq_id) const { return seqs_.at(seq_id); }
  void Erase(uint64_t seq_id) { seqs_.erase(seq_id); }
  void Clear() { seqs_.clear(); }
  size_t size() const { return seqs_.size(); }

 private:
  const ModelInfo* info_ = nullptr;
  std::unique_ptr<GuidedVocab> guided_vocab_;
  std::unordered_map<uint64_t, SequenceState> seqs_;
};

}  // namespace ferry::worker
