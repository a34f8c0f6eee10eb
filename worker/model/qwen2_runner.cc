#include "worker/model/qwen2_runner.h"

#include <cblas.h>
#include <omp.h>

#include <algorithm>
#include <cstring>
#include <stdexcept>
#include <string>
#include <unordered_set>

#include "worker/model/step_validation.h"

namespace ferry::worker {
namespace {

int32_t DeriveNumBlocks(const RunnerOptions& options, const KvCacheLayout& layout) {
  if (options.num_kv_blocks > 0) return options.num_kv_blocks;
  // Per rank: a tensor-parallel rank caches only its KV heads, so the budget holds more blocks.
  const int64_t per_block = KvCache::BytesPerBlock(layout, options.block_size);
  const int64_t blocks = options.kv_cache_bytes / per_block;
  if (blocks < 1) {
    throw std::runtime_error(options.model_dir + ": kv_cache_bytes " +
                             std::to_string(options.kv_cache_bytes) + " holds no block of " +
                             std::to_string(per_block) + " bytes");
  }
  return static_cast<int32_t>(std::min<int64_t>(blocks, INT32_MAX));
}

}  // namespace

std::unique_ptr<ModelRunner> ModelRunner::Create(const RunnerOptions& options) {
  return std::make_unique<Qwen2Runner>(options);
}

Qwen2Runner::Qwen2Runner(const RunnerOptions& options) : options_(options) {
  ModelOptions model_options;
  try {
    model_options.dtype = ParseMatmulDtype(options.dtype);
  } catch (const std::invalid_argument& e) {
    throw std::runtime_error(options.model_dir + ": " + e.what());
  }
  model_options.comm = options.comm;
  if (options.block_size <= 0) throw std::runtime_error("block_size must be positive");
  if (options.num_threads > 0) {
    omp_set_num_threads(options.num_threads);
    openblas_set_num_threads(options.num_threads);
  }
  model_ = Qwen2Model::Load(options.model_dir, model_options);
  const Qwen2Config& c = model_->config();
  info_.model = c.name;
  info_.dtype = options.dtype;
  info_.tp_rank = model_->shard().rank;
  info_.tp_size = model_->shard().size;
  info_.block_size = options.block_size;
  info_.num_kv_blocks = DeriveNumBlocks(options, model_->kv_layout());
  info_.max_model_len = options.max_model_len > 0 ? options.max_model_len
                                                  : c.max_position_embeddings;
  info_.vocab_size = c.vocab_size;
  info_.eos_token_ids = c.eos_token_ids;
  info_.generation_defaults = {c.default_temperature, c.default_top_p, c.default_top_k, c.default_min_p,
                               c.default_repetition_penalty};
  cache_ = std::make_unique<KvCache>(model_->kv_layout(), info_.num_kv_blocks, info_.block_size);
}

std::vector<SampledTokenOut> Qwen2Runner::Step(const StepSpec& step) {
  Validate(step);
  Apply(step);
  return RunAndSample(step);
}

// ---------------------------------------------------------------------------------------------
// Validation: everything is checked against the state the step would produce before any of it
// is applied, so a rejected step leaves the runner exactly as it was.

void Qwen2Runner::Validate(const StepSpec& step) const { ValidateStep(step, info_, seqs_); }

// ---------------------------------------------------------------------------------------------
// Applying and running

void Qwen2Runner::Apply(const StepSpec& step) {
  // Unknown finished/preempted ids are ignored: forgetting twice is harmless.
  for (uint64_t id : step.finished_ids) seqs_.erase(id);
  for (uint64_t id : step.preempted_ids) seqs_.erase(id);
  for (const NewSequenceSpec& n : step.new_sequences) {
    Sequence& seq = seqs_[n.seq_id] = Sequence{n.token_ids, n.num_cached_tokens, {}, n.sampling, n.num_generated};
    // After a preemption token_ids ends with the num_generated tokens sampled before it.
    if (HasPenalties(n.sampling)) seq.counts.Reset(n.token_ids, n.num_generated);
  }
  for (const ScheduledSpec& s : step.scheduled) {
    Sequence& seq = seqs_.at(s.seq_id);
    seq.block_table.insert(seq.block_table.end(), s.new_block_ids.begin(), s.new_block_ids.end());
  }
}

std::vector<SampledTokenOut> Qwen2Runner::RunAndSample(const StepSpec& step) {
  batch_ = ForwardBatch{};
  std::vector<Sequence*> sampling;  // in scheduled order, matching the logits rows
  std::vector<uint64_t> sampling_ids;
  for (const ScheduledSpec& s : step.scheduled) {
    Sequence& seq = seqs_.at(s.seq_id);
    const bool reaches_end =
        seq.num_computed + s.num_tokens == static_cast<int32_t>(seq.token_ids.size());
    batch_.AddSequence(seq.token_ids.data() + seq.num_computed, s.num_tokens, seq.num_computed,
                       seq.block_table, info_.block_size, reaches_end);
    seq.num_computed += s.num_tokens;
    if (reaches_end) {
      sampling.push_back(&seq);
      sampling_ids.push_back(s.seq_id);
    }
  }
  std::vector<SampledTokenOut> out;
  last_logits_.clear();
  if (step.scheduled.empty()) return out;
  const std::vector<float>& logits = model_->Forward(batch_, *cache_);
  last_logits_.assign(logits.begin(), logits.end());
  const int32_t vocab = info_.vocab_size;
  for (size_t i = 0; i < sampling.size(); ++i) {
    Sequence& seq = *sampling[i];
    SampleResult r = sampler_.Sample(logits.data() + i * vocab, vocab, seq.sampling,
                                     &seq.counts, seq.num_generated);
    seq.token_ids.push_back(r.token_id);
    ++seq.num_generated;
    if (HasPenalties(seq.sampling)) seq.counts.AddGenerated(r.token_id);
    out.push_back({sampling_ids[i], r.token_id, seq.sampling.logprobs >= 0, r.logprob,
                   std::move(r.top_logprobs)});
  }
  return out;
}

}  // namespace ferry::worker
