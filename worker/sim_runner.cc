#include "worker/sim_runner.h"

#include <algorithm>
#include <chrono>
#include <stdexcept>
#include <string>
#include <thread>

#include "worker/arch/model_config.h"

namespace ferry::worker {

SimRunner::SimRunner(const SimOptions& options) : cost_(options.cost), overlap_(options.overlap) {
  const ModelConfig config = LoadModelConfig(options.model_dir);
  info_.model = "sim:" + config.name;
  info_.dtype = "sim";
  info_.block_size = options.block_size;
  info_.num_kv_blocks = options.num_kv_blocks;
  if (info_.num_kv_blocks == 0) {
    const int64_t capacity = options.cost.kv_capacity_tokens;
    info_.num_kv_blocks = capacity > 0 ? static_cast<int32_t>(capacity / options.block_size) : 4096;
  }
  info_.max_model_len = options.max_model_len > 0 ? options.max_model_len : config.max_position_embeddings;
  info_.vocab_size = config.vocab_size;
  info_.eos_token_ids = config.eos_token_ids;
  num_live_tokens_ = options.num_live_tokens > 0 ? std::min(options.num_live_tokens, config.vocab_size)
                                                 : config.vocab_size;
}

// A hash of the sequence's last few tokens: deterministic per sequence, independent of the batch.
int32_t SimRunner::NextToken(const Sequence& seq) const {
  uint64_t h = 0x9e3779b97f4a7c15ull ^ seq.tokens.size();
  const size_t from = seq.tokens.size() > 4 ? seq.tokens.size() - 4 : 0;
  for (size_t i = from; i < seq.tokens.size(); ++i) h = (h ^ static_cast<uint64_t>(seq.tokens[i])) * 0x100000001b3ull;
  return static_cast<int32_t>(h % static_cast<uint64_t>(num_live_tokens_));
}

double SimRunner::ModelledSeconds(const StepSpec& step) const {
  StepShape shape;
  for (const ScheduledSpec& s : step.scheduled) {
    int32_t computed = 0;
    if (auto it = seqs_.find(s.seq_id); it != seqs_.end()) computed = it->second.num_computed;
    for (const NewSequenceSpec& n : step.new_sequences) {
      if (n.seq_id == s.seq_id) computed = n.num_cached_tokens;
    }
    shape.num_tokens += s.num_tokens;
    shape.num_seqs += 1;
    shape.num_kv_tokens += computed + s.num_tokens;
  }
  return shape.num_seqs == 0 ? 0.0 : cost_.StepSeconds(shape);
}

std::vector<SampledTokenOut> SimRunner::Step(const StepSpec& step) {
  const auto start = std::chrono::steady_clock::now();
  const double seconds = ModelledSeconds(step);
  std::vector<SampledTokenOut> out = Apply(step);
  // Sleeps overshoot on coarse VM timers (~1 ms); the overshoot is paid back by shorter sleeps
  // in the next steps so the mean step time is the model's. Capped so idle time never counts.
  std::this_thread::sleep_until(start + std::chrono::duration<double>(seconds - debt_s_));
  const double actual = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  debt_s_ = std::clamp(debt_s_ + actual - seconds, 0.0, kMaxDebtSeconds);
  return out;
}

// The modelled device runs submitted steps back to back: each ends its modelled time after the
// later of its submission and the end of the step before it. Sleeping until those absolute
// times cannot accumulate oversleeping, so no debt is kept.
void SimRunner::Submit(const StepSpec& step) {
  if (!overlap_) throw std::logic_error("SimRunner::Submit without --sim-overlap");
  if (submitted_.size() >= static_cast<size_t>(kMaxSubmittedSteps)) {
    throw std::logic_error("SimRunner::Submit: " + std::to_string(submitted_.size()) + " steps already submitted");
  }
  const double seconds = ModelledSeconds(step);
  std::vector<SampledTokenOut> samples = Apply(step);
  device_free_ = std::max(device_free_, Clock::now()) +
                 std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(seconds));
  submitted_.push_back({device_free_, std::move(samples)});
}

bool SimRunner::Ready() const { return submitted_.empty() || Clock::now() >= submitted_.front().done; }

std::vector<SampledTokenOut> SimRunner::Collect() {
  if (submitted_.empty()) throw std::logic_error("SimRunner::Collect with no step submitted");
  std::this_thread::sleep_until(submitted_.front().done);
  std::vector<SampledTokenOut> out = std::move(submitted_.front().samples);
  submitted_.pop_front();
  return out;
}

std::vector<SampledTokenOut> SimRunner::Apply(const StepSpec& step) {
  for (uint64_t id : step.finished_ids) seqs_.erase(id);
  for (uint64_t id : step.preempted_ids) seqs_.erase(id);
  for (const NewSequenceSpec& n : step.new_sequences) seqs_[n.seq_id] = {n.token_ids, n.num_cached_tokens};
  std::vector<SampledTokenOut> out;
  for (const ScheduledSpec& s : step.scheduled) {
    auto it = seqs_.find(s.seq_id);
    if (it == seqs_.end()) throw std::invalid_argument("sequence " + std::to_string(s.seq_id) + ": unknown");
    Sequence& seq = it->second;
    seq.num_computed += s.num_tokens;
    if (seq.num_computed > static_cast<int32_t>(seq.tokens.size())) {
      throw std::invalid_argument("sequence " + std::to_string(s.seq_id) + ": computes past its tokens");
    }
    if (seq.num_computed < static_cast<int32_t>(seq.tokens.size())) continue;
    const int32_t token = NextToken(seq);
    seq.tokens.push_back(token);
    SampledTokenOut sample;
    sample.seq_id = s.seq_id;
    sample.token_id = token;
    out.push_back(sample);
  }
  return out;
}

}  // namespace ferry::worker
