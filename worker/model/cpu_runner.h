// The CPU ModelRunner: the engine layer's sequence table (worker/engine/sequence_state.h) over a
// CpuModel and its paged KV cache. ModelRunner::Create returns one of these; tests construct it
// directly to read logits.
#pragma once

#include <cstdint>
#include <memory>
#include <utility>
#include <vector>

#include "worker/engine/model_runner.h"
#include "worker/engine/sampler.h"
#include "worker/engine/sequence_state.h"
#include "worker/lora/lora_registry.h"
#include "worker/model/cpu_model.h"
#include "worker/model/draft_proposer.h"

namespace ferry::worker {

class CpuRunner final : public ModelRunner {
 public:
  explicit CpuRunner(const RunnerOptions& options);

  const ModelInfo& info() const override { return info_; }
  std::vector<SampledTokenOut> Step(const StepSpec& step) override;
  std::vector<PromptLogprobsOut> TakePromptLogprobs() override { return std::move(prompt_logprobs_); }
  SpeculationCounts TakeSpeculationCounts() override { return std::exchange(speculation_, {}); }
  void ForgetAll() override { seqs_.Clear(); }
  void LoadLora(const std::string& name, const std::string& path) override;
  void UnloadLora(const std::string& name) override;
  std::vector<std::string> LoraNames() const override;
  // The adapters this runner serves; null without --enable-lora.
  const LoraRegistry* lora() const { return lora_.get(); }

  // With RunnerOptions::keep_logits, the fp32 logits the last Step sampled from, one row per
  // sampled position in scheduled order (with drafts: 1 + drafts rows for the sequence, some
  // never sampled when a draft was rejected): [rows, vocab_size]. Row-major; else empty.
  const std::vector<float>& last_logits() const { return last_logits_; }
  CpuModel& model() { return *model_; }
  int32_t num_sequences() const { return static_cast<int32_t>(seqs_.size()); }

 private:
  using Sequence = SequenceState;
  // A sequence that samples this step: its logits rows [first_row, first_row + 1 + drafts).
  struct Sampling {
    uint64_t seq_id = 0;
    Sequence* seq = nullptr;
    int32_t first_row = 0;
    int32_t draft_begin = 0, num_drafts = 0;  // its drafts in drafts_
  };
  // Prompt positions of one sequence scored this step: prompt_token_rows_[first_row, first_row +
  // count) are the token rows whose logits score prompt tokens first_index, first_index + 1, ...
  struct PromptRows {
    uint64_t seq_id = 0;
    const Sequence* seq = nullptr;
    int32_t first_index = 0;
    int32_t first_row = 0;
    int32_t count = 0;
  };

  std::vector<SampledTokenOut> RunAndSample(const StepSpec& step);
  // Per scheduled sequence, its drafts in drafts_ (none short of its end or without lookahead).
  std::vector<Sampling> ProposeDrafts(const StepSpec& step);
  // Samples the sequence's rows in order from `logits` ([rows, vocab]), accepting each draft the
  // draw equals, stopping at the first it does not: the tokens of the accepted drafts and one more,
  // appended to `out` and to the sequence. Returns the number of drafts accepted.
  int32_t SampleAndVerify(const Sampling& s, const float* logits, std::vector<SampledTokenOut>& out);
  // One draw from one row, appended to the sequence (token, counts, guided state).
  SampleResult SampleNext(Sequence& seq, const float* row);
  // Appends the rows of `seq`'s prompt positions in this step's chunk [start, start + num_tokens)
  // to batch_.logits_rows (token rows from first_token_row) and to prompt_rows.
  void AddPromptRows(uint64_t seq_id, const Sequence& seq, int32_t start, int32_t num_tokens,
                     int32_t first_token_row, std::vector<PromptRows>& prompt_rows);
  // Scores every row of prompt_token_rows_ from the model's logits, kPromptRowsPerSlice at a time.
  void ScorePromptRows(const std::vector<PromptRows>& prompt_rows);
  static constexpr int32_t kPromptRowsPerSlice = 256;

  RunnerOptions options_;
  ModelInfo info_;
  std::unique_ptr<CpuModel> model_;
  std::unique_ptr<KvCache> cache_;
  std::unique_ptr<DraftProposer> draft_;  // --speculative-config draft_model; else null
  // Guided decoding walks the vocabulary's bytes from tokenizer.json, which the table holds;
  // without a byte-level tokenizer.json it is not supported.
  SequenceTable seqs_;
  Sampler sampler_;
  ForwardBatch batch_;  // rebuilt each step; kept to reuse its capacity
  std::vector<float> last_logits_;
  std::vector<PromptLogprobsOut> prompt_logprobs_;  // of the last Step
  std::vector<int32_t> prompt_token_rows_;  // this step's token rows that score prompt tokens
  std::vector<int32_t> drafts_;             // this step's drafts, all sequences
  std::vector<int32_t> proposal_;           // Propose's scratch
  SpeculationCounts speculation_;           // of the last Step
  std::unique_ptr<LoraRegistry> lora_;      // --enable-lora; else null
};

}  // namespace ferry::worker
