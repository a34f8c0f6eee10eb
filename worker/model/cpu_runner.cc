#include "worker/model/cpu_runner.h"

#include <cblas.h>
#include <omp.h>

#include <algorithm>
#include <cstring>
#include <filesystem>
#include <span>
#include <stdexcept>
#include <string>
#include <unordered_set>

#include "worker/engine/ngram_proposer.h"
#include "worker/model/draft_proposer.h"

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
  return std::make_unique<CpuRunner>(options);
}

CpuRunner::CpuRunner(const RunnerOptions& options) : options_(options) {
  options_.dtype = ResolveMatmulDtype(options.dtype);
  ModelOptions model_options;
  try {
    model_options.dtype = ParseMatmulDtype(options_.dtype);
    model_options.quantization = ParseQuantization(options_.quantization);
  } catch (const std::invalid_argument& e) {
    throw std::runtime_error(options.model_dir + ": " + e.what());
  }
  model_options.comm = options.comm;
  model_options.quantize_lm_head = options.quantize_lm_head;
  if (options.block_size <= 0) throw std::runtime_error("block_size must be positive");
  if (options.num_threads > 0) {
    omp_set_num_threads(options.num_threads);
    openblas_set_num_threads(options.num_threads);
  }
  model_ = CpuModel::Load(options.model_dir, model_options);
  model_->Reserve(options.reserve_tokens, options.reserve_logits_rows);
  const ModelConfig& c = model_->config();
  info_.model = c.name;
  info_.dtype = options_.dtype;
  // A checkpoint quantized on disk runs its own int8 layers whatever --quantization says.
  info_.quantization = LoadInt8CheckpointScheme(options.model_dir) ? "compressed-tensors"
                                                                   : QuantizationName(model_options.quantization);
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
  info_.supports_prompt_logprobs = true;
  cache_ = std::make_unique<KvCache>(model_->kv_layout(), info_.num_kv_blocks, info_.block_size);
  seqs_ = SequenceTable(&info_, LoadGuidedVocab(options.model_dir, info_.vocab_size, info_.eos_token_ids));
  info_.supports_guided_decoding = seqs_.guided_vocab() != nullptr;
  info_.speculative = options.speculative;
  info_.speculative_methods = {SpeculativeMethod::kNgram};
  if (options.speculative.method == SpeculativeMethod::kDraftModel) {
    draft_ = std::make_unique<DraftProposer>(options.speculative.draft_model, model_options, info_.num_kv_blocks,
                                             info_.block_size, info_.vocab_size, info_.max_model_len);
    info_.speculative_methods.push_back(SpeculativeMethod::kDraftModel);
  }
  try {
    ValidateLoraOptions(options.lora);  // also refuses --lora-modules without --enable-lora
  } catch (const std::invalid_argument& e) {
    throw std::runtime_error(std::string("LoRA: ") + e.what());
  }
  if (options.lora.enable) {
    try {
      lora_ = std::make_unique<LoraRegistry>(c, model_->shard(), options.lora,
                                             model_options.dtype == MatmulDtype::kBfloat16);
    } catch (const std::invalid_argument& e) {
      throw std::runtime_error(std::string("LoRA: ") + e.what());
    }
    info_.max_loras = options.lora.max_loras;
    info_.max_lora_rank = options.lora.max_lora_rank;
  }
}

void CpuRunner::LoadLora(const std::string& name, const std::string& path) {
  if (lora_ == nullptr) ModelRunner::LoadLora(name, path);
  lora_->Load(name, path);
}

void CpuRunner::UnloadLora(const std::string& name) {
  if (lora_ == nullptr) ModelRunner::UnloadLora(name);
  lora_->Unload(name);
}

std::vector<std::string> CpuRunner::LoraNames() const { return lora_ ? lora_->Names() : std::vector<std::string>{}; }

// Everything is validated against the state the step would produce before any of it is applied,
// so a rejected step leaves the runner exactly as it was.
std::vector<SampledTokenOut> CpuRunner::Step(const StepSpec& step) {
  seqs_.Validate(step);
  std::vector<std::shared_ptr<const LoraAdapter>> adapters =
      AcquireStepAdapters(lora_.get(), step, [this](uint64_t id) { return seqs_.at(id).lora.get(); });
  seqs_.Apply(step);
  for (size_t i = 0; i < adapters.size(); ++i) seqs_.at(step.new_sequences[i].seq_id).lora = std::move(adapters[i]);
  return RunAndSample(step);
}

std::vector<SampledTokenOut> CpuRunner::RunAndSample(const StepSpec& step) {
  batch_ = ForwardBatch{};
  prompt_logprobs_.clear();
  prompt_token_rows_.clear();
  speculation_ = {};
  // Drafts first, for every sequence whose step reaches its end with lookahead slots (a draft
  // model proposes for all of them together); then one target pass computes and verifies them.
  std::vector<Sampling> planned = ProposeDrafts(step);
  std::vector<Sampling> sampling;  // in scheduled order, matching the logits rows
  std::vector<PromptRows> prompt_rows;
  int32_t num_rows = 0;
  for (size_t i = 0; i < step.scheduled.size(); ++i) {
    const ScheduledSpec& s = step.scheduled[i];
    Sampling& p = planned[i];
    Sequence& seq = *p.seq;
    const int32_t known = seq.num_known();
    const bool reaches_end = seq.ReachesEnd(s.num_tokens);
    // The drafts follow the known tokens for this pass only, in the slots the scheduler reserved:
    // rows for the last known token and each draft give the distributions that verify them.
    seq.token_ids.insert(seq.token_ids.end(), drafts_.begin() + p.draft_begin,
                         drafts_.begin() + p.draft_begin + p.num_drafts);
    const int32_t first_token_row = batch_.num_tokens();
    batch_.AddSequence(seq.token_ids.data() + seq.num_computed, s.num_tokens + p.num_drafts, seq.num_computed,
                       seq.block_table, info_.block_size, reaches_end ? 1 + p.num_drafts : 0, seq.lora.get());
    seq.token_ids.resize(static_cast<size_t>(known));
    if (seq.prompt_logprobs >= 0) {
      AddPromptRows(s.seq_id, seq, seq.num_computed, s.num_tokens, first_token_row, prompt_rows);
    }
    seq.num_computed += s.num_tokens;
    if (reaches_end) {
      p.first_row = num_rows;
      sampling.push_back(p);
      num_rows += 1 + p.num_drafts;
    }
  }
  std::vector<SampledTokenOut> out;
  last_logits_.clear();
  if (step.scheduled.empty()) return out;
  const std::vector<float>& logits = model_->Forward(batch_, *cache_);
  if (options_.keep_logits) last_logits_.assign(logits.begin(), logits.end());
  for (const Sampling& s : sampling) {
    const int32_t known = s.seq->num_known();
    // An accepted draft's K/V, written this pass, is valid; a rejected one's slot is the
    // scheduler's to reuse.
    const int32_t accepted = SampleAndVerify(s, logits.data() + int64_t{s.first_row} * info_.vocab_size, out);
    s.seq->num_computed += accepted;
    if (s.seq->speculative == SpeculativeMethod::kDraftModel && s.num_drafts > 0) {
      s.seq->draft_computed = DraftProposer::ComputedAfter(known, s.num_drafts, accepted);
    }
  }
  // The scheduler takes back the blocks that held only rejected drafts (or unused slots): the
  // table keeps what the computed tokens need, as the scheduler's lease does.
  for (const ScheduledSpec& s : step.scheduled) {
    if (s.num_lookahead_tokens == 0) continue;
    Sequence& seq = seqs_.at(s.seq_id);
    const auto keep = static_cast<size_t>((seq.num_computed + info_.block_size - 1) / info_.block_size);
    if (seq.block_table.size() > keep) seq.block_table.resize(keep);
  }
  // After sampling: the prompt rows' logits replace the sampled rows' (only prompt positions
  // are read from the sequences' tokens, so the samples just appended do not matter).
  ScorePromptRows(prompt_rows);
  return out;
}

std::vector<CpuRunner::Sampling> CpuRunner::ProposeDrafts(const StepSpec& step) {
  drafts_.clear();
  std::vector<Sampling> planned;
  std::vector<DraftProposer::Request> draft_requests;
  for (const ScheduledSpec& s : step.scheduled) {
    Sequence& seq = seqs_.at(s.seq_id);
    Sampling p{s.seq_id, &seq, 0, static_cast<int32_t>(drafts_.size()), 0};
    if (seq.ReachesEnd(s.num_tokens) && s.num_lookahead_tokens > 0) {
      if (seq.speculative == SpeculativeMethod::kNgram) {
        const SpeculativeConfig& c = options_.speculative;
        p.num_drafts =
            ProposeNgram(seq.token_ids, c.prompt_lookup_min, c.prompt_lookup_max, s.num_lookahead_tokens, proposal_);
        drafts_.insert(drafts_.end(), proposal_.begin(), proposal_.begin() + p.num_drafts);
      } else if (seq.speculative == SpeculativeMethod::kDraftModel) {
        p.num_drafts = s.num_lookahead_tokens;
        draft_requests.push_back({&seq.token_ids, &seq.block_table, &seq.draft_computed, p.num_drafts,
                                  static_cast<size_t>(p.draft_begin)});
        drafts_.resize(drafts_.size() + static_cast<size_t>(p.num_drafts));
      }
    }
    planned.push_back(p);
  }
  if (!draft_requests.empty()) draft_->Propose(draft_requests, drafts_);
  return planned;
}

SampleResult CpuRunner::SampleNext(Sequence& seq, const float* row) {
  SampleResult r = sampler_.Sample(row, info_.vocab_size, seq.sampling, &seq.counts, seq.num_generated, seq.mask());
  seq.Append(r.token_id);
  return r;
}

// Rejection sampling (Leviathan et al. 2023; Chen et al. 2023) for drafts that are a point mass
// (prompt lookup proposes one token, not a distribution q): draft d is accepted with probability
// min(1, p(d) / q(d)) = p(d) and, rejected, replaced by a draw from max(0, p - q) renormalised,
// which is p without d. One draw from p with the request's own stream does both: accept iff it
// equals d, and otherwise it is the replacement. So each position samples exactly what decoding
// without drafts samples there (the same draw of the same distribution, penalties and guided
// state included), greedy and seeded alike.
int32_t CpuRunner::SampleAndVerify(const Sampling& s, const float* logits, std::vector<SampledTokenOut>& out) {
  Sequence& seq = *s.seq;
  int32_t accepted = 0;
  for (int32_t i = 0; i <= s.num_drafts; ++i) {
    SampleResult r = SampleNext(seq, logits + int64_t{i} * info_.vocab_size);
    out.push_back({s.seq_id, r.token_id, seq.sampling.logprobs >= 0, r.logprob, std::move(r.top_logprobs)});
    if (i == s.num_drafts || r.token_id != drafts_[static_cast<size_t>(s.draft_begin + i)]) break;
    ++accepted;
  }
  if (s.num_drafts > 0) {
    ++speculation_.num_drafts;
    speculation_.num_draft_tokens += s.num_drafts;
    speculation_.num_accepted_tokens += accepted;
  }
  return accepted;
}

void CpuRunner::AddPromptRows(uint64_t seq_id, const Sequence& seq, int32_t start, int32_t num_tokens,
                                int32_t first_token_row, std::vector<PromptRows>& prompt_rows) {
  // The logits at position p score prompt token p + 1; the last prompt position scores the
  // first generated token, which the sampler reports.
  const int32_t end = std::min(start + num_tokens, seq.prompt_len - 1);
  if (end <= start) return;
  PromptRows rows{seq_id, &seq, start + 1, static_cast<int32_t>(prompt_token_rows_.size()), end - start};
  for (int32_t p = start; p < end; ++p) prompt_token_rows_.push_back(first_token_row + (p - start));
  prompt_rows.push_back(rows);
}

void CpuRunner::ScorePromptRows(const std::vector<PromptRows>& prompt_rows) {
  const int32_t vocab = info_.vocab_size;
  const auto total = static_cast<int32_t>(prompt_token_rows_.size());
  for (const PromptRows& p : prompt_rows) prompt_logprobs_.push_back({p.seq_id, p.first_index, {}});
  // A slice of rows at a time: a whole 8,192-token prefill's logits would be 5 GB at Qwen2's
  // 151,936-token vocabulary; a slice of 256 is 156 MB.
  size_t seq = 0;  // prompt_rows[seq] holds the row being scored
  for (int32_t begin = 0; begin < total; begin += kPromptRowsPerSlice) {
    const int32_t count = std::min(kPromptRowsPerSlice, total - begin);
    const std::vector<float>& logits =
        model_->Logits(std::span<const int32_t>(prompt_token_rows_).subspan(begin, count));
    for (int32_t row = begin; row < begin + count; ++row) {
      while (row >= prompt_rows[seq].first_row + prompt_rows[seq].count) ++seq;
      const PromptRows& p = prompt_rows[seq];
      const int32_t token = p.seq->token_ids[p.first_index + (row - p.first_row)];
      SampleResult r = sampler_.Score(logits.data() + int64_t{row - begin} * vocab, vocab, token, p.seq->prompt_logprobs);
      prompt_logprobs_[seq].tokens.push_back({p.seq_id, token, true, r.logprob, std::move(r.top_logprobs), r.rank});
    }
  }
}

}  // namespace ferry::worker
