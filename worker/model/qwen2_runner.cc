#include "worker/model/qwen2_runner.h"

#include <cblas.h>
#include <omp.h>

#include <algorithm>
#include <cstring>
#include <stdexcept>
#include <string>
#include <unordered_set>

namespace ferry::worker {
namespace {

std::string Id(uint64_t seq_id) { return "sequence " + std::to_string(seq_id); }

[[noreturn]] void Invalid(const std::string& what) { throw std::invalid_argument(what); }

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

void Qwen2Runner::ValidateNew(const NewSequenceSpec& seq) const {
  if (seq.token_ids.empty()) Invalid(Id(seq.seq_id) + ": no tokens");
  if (static_cast<int64_t>(seq.token_ids.size()) > info_.max_model_len) {
    Invalid(Id(seq.seq_id) + ": " + std::to_string(seq.token_ids.size()) +
            " tokens exceed max_model_len " + std::to_string(info_.max_model_len));
  }
  for (int32_t t : seq.token_ids) {
    if (t < 0 || t >= info_.vocab_size) {
      Invalid(Id(seq.seq_id) + ": token id " + std::to_string(t) + " outside vocab of " +
              std::to_string(info_.vocab_size));
    }
  }
  if (seq.num_generated < 0 || seq.num_generated > static_cast<int32_t>(seq.token_ids.size())) {
    Invalid(Id(seq.seq_id) + ": num_generated " + std::to_string(seq.num_generated) +
            " outside [0, " + std::to_string(seq.token_ids.size()) + "]");
  }
  // A cached prefix (prefix caching) is already in the blocks it is sent with; at least one
  // token is always left to compute so there are logits to sample from.
  if (seq.num_cached_tokens < 0 || seq.num_cached_tokens >= static_cast<int32_t>(seq.token_ids.size())) {
    Invalid(Id(seq.seq_id) + ": num_cached_tokens " + std::to_string(seq.num_cached_tokens) +
            " outside [0, " + std::to_string(seq.token_ids.size()) + ")");
  }
  if (const std::string bad = CheckSamplingOptions(seq.sampling); !bad.empty()) {
    Invalid(Id(seq.seq_id) + ": bad sampling options: " + bad);
  }
}

void Qwen2Runner::ValidateScheduled(const ScheduledSpec& s, const Sequence& seq) const {
  const std::string id = Id(s.seq_id);
  const int64_t known = static_cast<int64_t>(seq.token_ids.size());
  const int64_t end = int64_t{seq.num_computed} + s.num_tokens;
  if (s.num_tokens <= 0) Invalid(id + ": num_tokens " + std::to_string(s.num_tokens) + " <= 0");
  if (end > known) {
    Invalid(id + ": num_tokens " + std::to_string(s.num_tokens) + " from " +
            std::to_string(seq.num_computed) + " computed goes past its " +
            std::to_string(known) + " known tokens");
  }
  if (end > info_.max_model_len) {
    Invalid(id + ": context " + std::to_string(end) + " exceeds max_model_len " +
            std::to_string(info_.max_model_len));
  }
  for (int32_t b : s.new_block_ids) {
    if (b < 0 || b >= info_.num_kv_blocks) {
      Invalid(id + ": block id " + std::to_string(b) + " outside [0, " +
              std::to_string(info_.num_kv_blocks) + ")");
    }
  }
  const int64_t blocks = static_cast<int64_t>(seq.block_table.size() + s.new_block_ids.size());
  const int64_t needed = (end + info_.block_size - 1) / info_.block_size;
  if (blocks < needed) {
    Invalid(id + ": " + std::to_string(blocks) + " blocks cannot hold positions up to " +
            std::to_string(end) + " (need " + std::to_string(needed) + ")");
  }
}

void Qwen2Runner::Validate(const StepSpec& step) const {
  std::unordered_set<uint64_t> erased(step.finished_ids.begin(), step.finished_ids.end());
  erased.insert(step.preempted_ids.begin(), step.preempted_ids.end());
  std::unordered_map<uint64_t, Sequence> fresh;  // new sequences as they will start
  for (const NewSequenceSpec& n : step.new_sequences) {
    ValidateNew(n);
    if (fresh.count(n.seq_id) || (seqs_.count(n.seq_id) && !erased.count(n.seq_id))) {
      Invalid(Id(n.seq_id) + ": sent as new but already known");
    }
    fresh[n.seq_id] = Sequence{n.token_ids, n.num_cached_tokens, {}, n.sampling, n.num_generated};
  }
  std::unordered_set<uint64_t> scheduled;
  for (const ScheduledSpec& s : step.scheduled) {
    if (!scheduled.insert(s.seq_id).second) Invalid(Id(s.seq_id) + ": scheduled twice");
    const Sequence* seq = nullptr;
    if (auto it = fresh.find(s.seq_id); it != fresh.end()) {
      seq = &it->second;
    } else if (auto old = seqs_.find(s.seq_id); old != seqs_.end() && !erased.count(s.seq_id)) {
      seq = &old->second;
    }
    if (seq == nullptr) Invalid(Id(s.seq_id) + ": scheduled but unknown");
    ValidateScheduled(s, *seq);
  }
}

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
