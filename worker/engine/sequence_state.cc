#include "worker/engine/sequence_state.h"

#include <utility>

#include "worker/engine/step_validation.h"

namespace ferry::worker {

void SequenceState::Append(int32_t token) {
  if (guided) guided->Advance(token);
  token_ids.push_back(token);
  ++num_generated;
  if (HasPenalties(sampling)) counts.AddGenerated(token);
}

SequenceTable::SequenceTable(const ModelInfo* info, std::unique_ptr<GuidedVocab> guided_vocab)
    : info_(info), guided_vocab_(std::move(guided_vocab)) {}

int64_t SequenceTable::Validate(const StepSpec& step) const { return ValidateStep(step, *info_, seqs_); }

void SequenceTable::Apply(const StepSpec& step) {
  for (uint64_t id : step.finished_ids) seqs_.erase(id);
  for (uint64_t id : step.preempted_ids) seqs_.erase(id);
  for (const NewSequenceSpec& n : step.new_sequences) {
    SequenceState& seq = seqs_[n.seq_id] = SequenceState{};
    seq.token_ids = n.token_ids;
    seq.num_computed = n.num_cached_tokens;
    seq.sampling = n.sampling;
    seq.num_generated = n.num_generated;
    seq.prompt_logprobs = n.prompt_logprobs;
    // After a preemption token_ids ends with the num_generated tokens sampled before it.
    seq.prompt_len = static_cast<int32_t>(n.token_ids.size()) - n.num_generated;
    if (HasPenalties(n.sampling)) seq.counts.Reset(n.token_ids, n.num_generated);
    seq.guided = SequenceMatcher(n.sampling.guided, guided_vocab_.get(), n.token_ids, n.num_generated);
    seq.allowed = AllowedIdsMask(n.sampling.allowed_token_ids, info_->vocab_size);
    seq.speculative = n.speculative;
  }
  for (const ScheduledSpec& s : step.scheduled) {
    SequenceState& seq = seqs_.at(s.seq_id);
    seq.block_table.insert(seq.block_table.end(), s.new_block_ids.begin(), s.new_block_ids.end());
  }
}

}  // namespace ferry::worker
