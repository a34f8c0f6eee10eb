// --backend sim: a ModelRunner that runs no model. Each step sleeps for the time a
// CostModel gives for what the step computes, and returns tokens that depend only on the
// sequence's own tokens (so batching and preemption cannot change them). The real gateway and
// scheduler then run at GPU-like speed on a CPU machine.
#pragma once

#include <chrono>
#include <deque>
#include <memory>
#include <unordered_map>

#include "common/cost_model.h"
#include "worker/engine/model_runner.h"

namespace ferry::worker {

struct SimOptions {
  std::string model_dir;         // config.json and generation_config.json only (no weights)
  CostModelParams cost;
  int32_t block_size = 16;
  int32_t num_kv_blocks = 0;     // 0: cost.kv_capacity_tokens / block_size, else 4096
  int32_t max_model_len = 0;     // 0: config.json's max_position_embeddings
  int32_t num_live_tokens = 0;   // sampled ids are below this (0: vocab_size); e.g. the tokenizer's size
  // --sim-overlap: model a device that runs steps asynchronously (ModelRunner::Submit/Collect):
  // a submitted step starts when the one before it ends, not when the host gets to it, and the
  // host's work on the next step overlaps it, as on the GPU engine.
  bool overlap = false;
};

class SimRunner final : public ModelRunner {
 public:
  explicit SimRunner(const SimOptions& options);

  const ModelInfo& info() const override { return info_; }
  std::vector<SampledTokenOut> Step(const StepSpec& step) override;
  void ForgetAll() override { seqs_.clear(); }

  bool supports_overlap() const override { return overlap_; }
  void Submit(const StepSpec& step) override;
  std::vector<SampledTokenOut> Collect() override;
  bool Ready() const override;

  // The step time the cost model gives for `step` (what Step sleeps).
  double ModelledSeconds(const StepSpec& step) const;

 private:
  struct Sequence {
    std::vector<int32_t> tokens;
    int32_t num_computed = 0;
  };
  using Clock = std::chrono::steady_clock;
  struct Submitted {
    Clock::time_point done;  // when the modelled device finishes it
    std::vector<SampledTokenOut> samples;
  };
  int32_t NextToken(const Sequence& seq) const;
  // Applies the step to the sequences and samples (no sleeping); throws std::invalid_argument.
  std::vector<SampledTokenOut> Apply(const StepSpec& step);

  ModelInfo info_;
  CostModel cost_;
  int32_t num_live_tokens_;
  std::unordered_map<uint64_t, Sequence> seqs_;
  static constexpr double kMaxDebtSeconds = 0.02;
  double debt_s_ = 0;  // time the steps so far ran over the model (oversleeping)
  const bool overlap_;
  std::deque<Submitted> submitted_;  // oldest first
  Clock::time_point device_free_;    // when the last submitted step ends
};

}  // namespace ferry::worker
