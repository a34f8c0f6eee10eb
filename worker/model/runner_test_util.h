// Test helpers for driving a ModelRunner the way the scheduler does: a block pool that hands
// out scrambled ids, and a mini scheduler that sends each sequence in full once, then only the
// tokens and blocks of each step, and supports preemption.
#pragma once

#include <gtest/gtest.h>

#include <algorithm>
#include <filesystem>
#include <map>
#include <numeric>
#include <random>
#include <string>
#include <vector>

#include <unistd.h>

#include <cstdio>
#include <functional>

#include "common/temp_dir.h"
#include "worker/comm/communicator.h"
#include "worker/model/cpu_runner.h"

namespace ferry::worker::testing {

using ferry::testing::TempDir;

// The body of a forked tensor-parallel rank: joins a Gloo group of two over `store`, runs `body`
// with its communicator, and exits 0, or 1 after printing what failed (the parent reads the status).
[[noreturn]] inline void RunGlooRank(const std::string& store, int rank, const std::function<void(Communicator*)>& body) {
  int status = 0;
  try {
    GlooOptions gloo;
    gloo.rank = rank;
    gloo.size = 2;
    gloo.store_dir = store;
    gloo.timeout_s = 60;
    auto comm = CreateGlooCommunicator(gloo);
    body(comm.get());
  } catch (const std::exception& e) {
    std::fprintf(stderr, "rank %d: %s\n", rank, e.what());
    status = 1;
  }
  std::fflush(nullptr);
  _exit(status);
}

class MiniScheduler {
 public:
  MiniScheduler(CpuRunner& runner, uint32_t seed) : runner_(runner) {
    const int32_t n = runner.info().num_kv_blocks;
    free_.resize(n);
    std::iota(free_.begin(), free_.end(), 0);
    std::shuffle(free_.begin(), free_.end(), std::mt19937(seed));
  }

  // Sequences still alive are finished, so another scheduler can reuse the runner and blocks.
  ~MiniScheduler() {
    std::vector<uint64_t> live;
    for (const auto& [id, s] : seqs_) {
      if (s.sent) live.push_back(id);
    }
    if (!live.empty() || !pending_finished_.empty() || !pending_preempted_.empty()) {
      StepSpec spec;
      spec.finished_ids = live;
      spec.finished_ids.insert(spec.finished_ids.end(), pending_finished_.begin(),
                               pending_finished_.end());
      spec.preempted_ids = pending_preempted_;
      runner_.Step(spec);
    }
  }

  // lookahead > 0: speculative decoding by prompt lookup, with that many draft slots whenever a
  // step reaches the end of its tokens (the blocks past what the computed tokens need go back to
  // the pool after the step, as the scheduler's rollback does).
  void Add(uint64_t id, std::vector<int32_t> prompt, SamplingOptions sampling = {}, int32_t lookahead = 0,
           SpeculativeMethod method = SpeculativeMethod::kNgram) {
    Seq& s = seqs_[id];
    s.method = lookahead > 0 ? method : SpeculativeMethod::kNone;
    s.tokens = std::move(prompt);
    s.prompt_len = static_cast<int32_t>(s.tokens.size());
    s.sampling = sampling;
    s.lookahead = lookahead;
  }

  // The LoRA adapter sequence `id` runs under (sent with it; again after a preemption).
  void SetLora(uint64_t id, std::string lora_name) { seqs_.at(id).lora_name = std::move(lora_name); }

  // One engine step: each (id, max_tokens) computes up to max_tokens of its uncomputed tokens.
  // Returns the samples; records each sample's token and logits row.
  std::vector<SampledTokenOut> Step(const std::vector<std::pair<uint64_t, int32_t>>& work) {
    StepSpec spec;
    spec.preempted_ids.swap(pending_preempted_);
    spec.finished_ids.swap(pending_finished_);
    std::map<uint64_t, int32_t> scheduled_n;
    for (auto [id, max_tokens] : work) {
      Seq& s = seqs_.at(id);
      if (!s.sent) {
        spec.new_sequences.push_back({.seq_id = id, .token_ids = s.tokens, .num_generated = s.num_generated(),
                                      .sampling = s.sampling,
                                      .speculative = s.method,
                                      .lora_name = s.lora_name});
        s.sent = true;
      }
      const int32_t n = std::min<int32_t>(max_tokens, int32_t(s.tokens.size()) - s.num_computed);
      const bool reaches_end = s.num_computed + n == int32_t(s.tokens.size());
      const int32_t lookahead =
          reaches_end ? std::min(s.lookahead, runner_.info().max_model_len - s.num_computed - n) : 0;
      ScheduledSpec sched{id, n, {}, lookahead};
      const int32_t bs = runner_.info().block_size;
      const int32_t need = (s.num_computed + n + lookahead + bs - 1) / bs;
      while (int32_t(s.blocks.size()) < need) {
        s.blocks.push_back(free_.back());
        sched.new_block_ids.push_back(free_.back());
        free_.pop_back();
      }
      spec.scheduled.push_back(sched);
      scheduled_n[id] = n;
    }
    const auto out = runner_.Step(spec);
    const SpeculationCounts counts = runner_.TakeSpeculationCounts();
    speculation_.num_drafts += counts.num_drafts;
    speculation_.num_draft_tokens += counts.num_draft_tokens;
    speculation_.num_accepted_tokens += counts.num_accepted_tokens;
    ++num_steps_;
    const int32_t vocab = runner_.info().vocab_size;
    const int32_t bs = runner_.info().block_size;
    for (auto& [id, n] : scheduled_n) seqs_.at(id).num_computed += n;
    // Rows match samples one to one unless drafts were verified (keep_logits off: none).
    const bool rows_are_samples = runner_.last_logits().size() == out.size() * size_t(vocab);
    std::map<uint64_t, int32_t> num_samples;
    for (size_t i = 0; i < out.size(); ++i) {
      Seq& s = seqs_.at(out[i].seq_id);
      s.tokens.push_back(out[i].token_id);
      ++num_samples[out[i].seq_id];
      if (!rows_are_samples) continue;
      const float* row = runner_.last_logits().data() + i * vocab;
      s.logits.emplace_back(row, row + vocab);
    }
    for (auto& [id, count] : num_samples) {
      Seq& s = seqs_.at(id);
      s.num_computed += count - 1;  // accepted drafts
      const auto keep = static_cast<size_t>((s.num_computed + bs - 1) / bs);
      while (s.blocks.size() > keep) {
        free_.push_back(s.blocks.back());
        s.blocks.pop_back();
      }
    }
    return out;
  }

  // Forgets the worker-side state; the next Step sends the sequence again in full.
  void Preempt(uint64_t id) {
    Seq& s = seqs_.at(id);
    free_.insert(free_.end(), s.blocks.begin(), s.blocks.end());
    s.blocks.clear();
    s.num_computed = 0;
    s.sent = false;
    pending_preempted_.push_back(id);
  }

  void Finish(uint64_t id) {
    Seq& s = seqs_.at(id);
    free_.insert(free_.end(), s.blocks.begin(), s.blocks.end());
    pending_finished_.push_back(id);
    done_[id] = std::move(s);
    seqs_.erase(id);
  }

  // Runs the listed sequences together until each has `num_new` generated tokens, with every
  // prefill limited to `chunk` tokens a step.
  void RunUntil(const std::vector<uint64_t>& ids, int32_t num_new, int32_t chunk) {
    for (;;) {
      std::vector<std::pair<uint64_t, int32_t>> work;
      for (uint64_t id : ids) {
        if (seqs_.at(id).num_generated() < num_new) work.push_back({id, chunk});
      }
      if (work.empty()) return;
      Step(work);
    }
  }

  std::vector<int32_t> Generated(uint64_t id) const {
    const Seq& s = Get(id);
    return {s.tokens.begin() + s.prompt_len, s.tokens.end()};
  }
  const std::vector<std::vector<float>>& Logits(uint64_t id) const { return Get(id).logits; }
  // Speculative decoding over every Step so far, and the number of Steps.
  const SpeculationCounts& speculation() const { return speculation_; }
  int64_t num_steps() const { return num_steps_; }

 private:
  struct Seq {
    std::vector<int32_t> tokens;
    int32_t prompt_len = 0;
    int32_t num_computed = 0;
    std::vector<int32_t> blocks;
    SamplingOptions sampling;
    int32_t lookahead = 0;
    SpeculativeMethod method = SpeculativeMethod::kNone;
    std::string lora_name;  // NewSequenceSpec.lora_name (SetLora)
    bool sent = false;
    std::vector<std::vector<float>> logits;  // one [vocab] row per sample
    int32_t num_generated() const { return static_cast<int32_t>(tokens.size()) - prompt_len; }
  };
  const Seq& Get(uint64_t id) const {
    auto it = seqs_.find(id);
    return it != seqs_.end() ? it->second : done_.at(id);
  }

  CpuRunner& runner_;
  std::vector<int32_t> free_;
  std::map<uint64_t, Seq> seqs_;
  std::map<uint64_t, Seq> done_;
  std::vector<uint64_t> pending_preempted_;
  std::vector<uint64_t> pending_finished_;
  SpeculationCounts speculation_;
  int64_t num_steps_ = 0;
};

// Largest |a - b| over two equally sized vectors.
inline float MaxAbsDiff(const std::vector<float>& a, const std::vector<float>& b) {
  EXPECT_EQ(a.size(), b.size());
  float m = 0.f;
  for (size_t i = 0; i < std::min(a.size(), b.size()); ++i) m = std::max(m, std::abs(a[i] - b[i]));
  return m;
}

}  // namespace ferry::worker::testing
