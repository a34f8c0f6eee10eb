// Test helper: drives any runner with last_logits() (CpuRunner, CudaRunner) through the
// same steps, the way the scheduler would: chunked prefill mixed with decodes, block ids from a
// scrambled pool, an optional prefix-cached sequence sharing another's first blocks. Two
// runners driven with the same Script see the same steps (same sequences, tokens and blocks),
// plus, under teacher forcing, the re-sends below where a runner's sample differed.
//
// Teacher forcing (Drive's `forced`: per sequence, the reference's samples): after its k-th
// sample a sequence continues with forced[k] whatever the runner sampled, so the two engines
// compute every position from the same tokens and one argmax flipped at a near-tie does not make
// the rest diverge (parity_compare.h). The ModelRunner contract has no "replace the last sample"
// message, so a sequence whose sample differs is finished and sent again as new in its next step,
// on the same blocks: token_ids = the prompt and the forced tokens so far, num_generated = the
// samples so far, num_cached_tokens = the positions already computed (their K/V are in its blocks,
// as for a prefix-cache hit), and all its blocks again as the step's new_block_ids.
#pragma once

#include <algorithm>
#include <cstdint>
#include <numeric>
#include <random>
#include <stdexcept>
#include <string>
#include <vector>

#include "worker/engine/model_runner.h"
#include "worker/gpu/parity_compare.h"

namespace ferry::worker::gpu::testing {

using parity::Trace;

struct Script {
  std::vector<std::vector<int32_t>> prompts;
  int32_t num_new = 32;   // generated tokens per sequence
  int32_t chunk = 64;     // prefill tokens per sequence and step
  int32_t block_size = 16;
  int32_t num_blocks = 0;
  uint32_t seed = 1;
  // Sequence `prefix_seq` (when >= 0) starts only after sequence 0 finished its prefill, with
  // its first `prefix_tokens` (a multiple of block_size) taken from sequence 0's prompt and
  // blocks: prefix caching.
  int32_t prefix_seq = -1;
  int32_t prefix_tokens = 0;
  // Per prompt, the LoRA adapter it runs under ("" the base model); empty: every one the base.
  std::vector<std::string> lora_names;
};

namespace driver_detail {

struct Seq {
  std::vector<int32_t> tokens;  // prompt, then the tokens it continues with
  std::vector<int32_t> blocks;  // its block table
  int32_t computed = 0;
  bool sent = false;
  bool resend = false;  // its last sample was replaced: finish it and send it again
};

class Planner {
 public:
  Planner(const Script& script, const std::vector<std::vector<int32_t>>* forced) : script_(script), forced_(forced) {
    pool_.resize(script.num_blocks);
    std::iota(pool_.begin(), pool_.end(), 0);
    std::shuffle(pool_.begin(), pool_.end(), std::mt19937(script.seed));
    for (const auto& p : script.prompts) seqs_.push_back({p, {}, 0, false, false});
    const size_t n = seqs_.size();
    if (forced != nullptr && forced->size() != n) {
      throw std::invalid_argument("forced tokens for " + std::to_string(forced->size()) + " sequences, script has " +
                                  std::to_string(n));
    }
    for (size_t i = 0; forced != nullptr && i < n; ++i) {
      if ((*forced)[i].size() < static_cast<size_t>(script.num_new)) {
        throw std::invalid_argument("forced tokens of sequence " + std::to_string(i) + ": " +
                                    std::to_string((*forced)[i].size()) + " < num_new " +
                                    std::to_string(script.num_new));
      }
    }
    trace_.tokens.resize(n);
    trace_.rows.resize(n);
  }

  // The next step; empty `scheduled` once every sequence has its num_new samples.
  StepSpec Next() {
    StepSpec spec;
    for (int32_t i = 0; i < static_cast<int32_t>(seqs_.size()); ++i) {
      if (static_cast<int32_t>(trace_.tokens[i].size()) >= script_.num_new) continue;
      if (i == script_.prefix_seq && seqs_[0].computed < static_cast<int32_t>(script_.prompts[0].size())) continue;
      spec.scheduled.push_back(Schedule(i, &spec));
    }
    return spec;
  }

  // Records sample k of the step (row: [vocab]) and the token its sequence continues with.
  void Record(const SampledTokenOut& out, const float* row, int32_t vocab) {
    const auto i = static_cast<int32_t>(out.seq_id) - 1;
    std::vector<int32_t>& sampled = trace_.tokens.at(i);
    const int32_t next = forced_ != nullptr ? (*forced_)[i][sampled.size()] : out.token_id;
    if (next != out.token_id) {
      seqs_[i].resend = true;
      ++trace_.num_forced;
    }
    seqs_[i].tokens.push_back(next);
    sampled.push_back(out.token_id);
    trace_.rows[i].push_back(parity::MakeRow(row, vocab, true));
  }

  StepSpec FinishAll() const {
    StepSpec done;
    for (size_t i = 0; i < seqs_.size(); ++i) done.finished_ids.push_back(i + 1);
    return done;
  }

  Trace& trace() { return trace_; }

 private:
  ScheduledSpec Schedule(int32_t i, StepSpec* spec) {
    Seq& s = seqs_[i];
    const auto id = static_cast<uint64_t>(i + 1);
    ScheduledSpec sched{id, 0, {}};
    if (!s.sent || s.resend) {
      if (!s.sent && i == script_.prefix_seq) {
        const int32_t shared = script_.prefix_tokens / script_.block_size;
        s.blocks.assign(seqs_[0].blocks.begin(), seqs_[0].blocks.begin() + shared);
        s.computed = script_.prefix_tokens;
      }
      if (s.resend) spec->finished_ids.push_back(id);
      const auto generated = static_cast<int32_t>(trace_.tokens[i].size());
      spec->new_sequences.push_back({id, s.tokens, generated, {}, s.computed});
      if (!script_.lora_names.empty()) spec->new_sequences.back().lora_name = script_.lora_names[i];
      sched.new_block_ids = s.blocks;  // a (re)introduced sequence's table starts empty
      s.sent = true;
      s.resend = false;
    }
    sched.num_tokens = std::min<int32_t>(script_.chunk, static_cast<int32_t>(s.tokens.size()) - s.computed);
    while (static_cast<int32_t>(s.blocks.size()) * script_.block_size < s.computed + sched.num_tokens) {
      if (pool_.empty()) throw std::invalid_argument("script.num_blocks too small");
      s.blocks.push_back(pool_.back());
      sched.new_block_ids.push_back(pool_.back());
      pool_.pop_back();
    }
    s.computed += sched.num_tokens;
    return sched;
  }

  const Script& script_;
  const std::vector<std::vector<int32_t>>* forced_;
  std::vector<int32_t> pool_;
  std::vector<Seq> seqs_;
  Trace trace_;
};

}  // namespace driver_detail

// Runs `script` to the end and returns every sample with the logits row it came from. forced:
// nullptr (free-running: each sequence continues with its own samples) or, per sequence, at least
// script.num_new tokens to continue with (teacher forcing, see above). The runner needs
// keep_logits.
template <typename Runner>
Trace Drive(Runner& runner, const Script& script, const std::vector<std::vector<int32_t>>* forced = nullptr) {
  driver_detail::Planner plan(script, forced);
  const int32_t vocab = runner.info().vocab_size;
  for (StepSpec spec = plan.Next(); !spec.scheduled.empty(); spec = plan.Next()) {
    const std::vector<SampledTokenOut> out = runner.Step(spec);
    ++plan.trace().num_steps;
    if (runner.last_logits().size() != out.size() * static_cast<size_t>(vocab)) {
      throw std::runtime_error("the runner kept " + std::to_string(runner.last_logits().size()) +
                               " logits for " + std::to_string(out.size()) + " samples (keep_logits off?)");
    }
    for (size_t k = 0; k < out.size(); ++k) plan.Record(out[k], runner.last_logits().data() + k * vocab, vocab);
  }
  runner.Step(plan.FinishAll());
  return std::move(plan.trace());
}

}  // namespace ferry::worker::gpu::testing
