#include "scheduler/cap/demand_model.h"

#include <algorithm>
#include <cmath>
#include <stdexcept>
#include <string>
#include <utility>

namespace ferry::scheduler {

DemandModel::DemandModel(const ControllerOptions& options) : options_(options) {
  if (!options_.slo.targets_stated) regime_ = PlanRegime::kNoTargets;
  plan_.choice.reason.reserve(kCapReasonRoom);
}

void DemandModel::OnCompletion(const RequestCompletion& done) {
  if (done.num_output_tokens > 0) outputs_.push_back({done.now_s, static_cast<double>(done.num_output_tokens)});
  if (done.num_tokens > 0 && done.num_output_tokens > 0) {
    const int32_t computed = done.num_tokens - done.num_output_tokens - done.num_cached_tokens;
    if (computed < 1 || done.num_cached_tokens < 0) {  // the cache never holds a prompt's last token
      throw std::invalid_argument("controller completion: " + std::to_string(done.num_tokens) + " tokens, " +
                                  std::to_string(done.num_output_tokens) + " generated and " +
                                  std::to_string(done.num_cached_tokens) + " cached leave no prompt token computed");
    }
    prompts_.push_back({done.now_s, static_cast<double>(computed)});
  }
  // KV is shared by every lane, so the context estimate counts them all.
  if (done.num_tokens > 0) {
    // The KV a running sequence holds, seen at a random step: its prompt and
    // on average half its output; a reply of o tokens runs for o steps, so it
    // weighs o. Without an output count: the final context, the most it holds.
    const double o = std::min(done.num_output_tokens, done.num_tokens);
    const double weight = o > 0 ? o : 1;
    held_weighted_.push_back({done.now_s, weight * (done.num_tokens - o / 2)});
    held_weights_.push_back({done.now_s, weight});
  }
  if (!CountsLane(done.lane)) return;
  if (done.num_output_tokens > 0) {
    slo_outputs_.push_back({done.now_s, static_cast<double>(done.num_output_tokens)});
  }
  ttft_.push_back({done.now_s, done.ttft_s});
  tpot_.push_back({done.now_s, done.tpot_s});
}

bool DemandModel::CountsLane(const std::string& lane) const {
  const auto& lanes = options_.slo.lanes;
  return lanes.empty() || std::find(lanes.begin(), lanes.end(), lane) != lanes.end();
}

void DemandModel::Observe(const StepObservation& obs) {
  if (obs.num_arrivals_slo > 0) slo_arrivals_.push_back({obs.now_s, static_cast<double>(obs.num_arrivals_slo)});
  preemptions_since_adjust_ += obs.num_preemptions;
  Expire(obs.now_s);
}

void DemandModel::Expire(double now_s) {
  // The other lanes' arrivals are read over a longer window (the controller keeps every lane's as long).
  const double rate_from = now_s - std::max(options_.load.rate_window_s, options_.goodput.other_rate_window_s);
  while (!slo_arrivals_.empty() && slo_arrivals_.front().time_s < rate_from) slo_arrivals_.pop_front();
  const double slo_from = now_s - options_.slo.window_s;
  for (auto* d : {&ttft_, &tpot_, &outputs_, &slo_outputs_, &prompts_, &held_weighted_, &held_weights_}) {
    while (!d->empty() && d->front().time_s < slo_from) d->pop_front();
  }
}

void DemandModel::OnSet(double now_s) {
  last_adjust_s_ = now_s;
  ttft_.clear();
  tpot_.clear();
}

double DemandModel::PercentileOf(const Ring<TimedValue>& d, double pct) {
  if (d.empty()) return 0.0;
  scratch_.clear();
  for (const TimedValue& e : d) scratch_.push_back(e.value);
  const double rank = std::ceil(pct / 100.0 * static_cast<double>(scratch_.size()));
  const size_t k = static_cast<size_t>(std::clamp(rank, 1.0, static_cast<double>(scratch_.size()))) - 1;
  std::nth_element(scratch_.begin(), scratch_.begin() + static_cast<ptrdiff_t>(k), scratch_.end());
  return scratch_[k];
}

bool DemandModel::ModelInputs(const StepObservation& obs, const ControllerView& view) {
  const GoodputOptions& g = options_.goodput;
  const SloOptions& o = options_.slo;
  if (static_cast<int32_t>(outputs_.size()) < g.min_completions) return false;
  const std::optional<StepFit> fit = view.step_cost.FitOfTheWindow();
  if (!fit) return false;
  // Every field afresh, the vectors' storage kept.
  std::vector<double> slo_output_tokens = std::move(inputs_.slo_output_tokens);
  std::vector<int32_t> candidates = std::move(inputs_.candidates);
  inputs_ = PlannerInputs{};
  slo_output_tokens.clear();
  candidates.clear();
  inputs_.slo_output_tokens = std::move(slo_output_tokens);
  inputs_.candidates = std::move(candidates);
  PlannerInputs& in = inputs_;
  in.step = *fit;
  double out_sum = 0;
  for (const TimedValue& v : outputs_) out_sum += v.value;
  in.output_tokens = std::max(1.0, out_sum / static_cast<double>(outputs_.size()));
  // Tokens per sequence-step = (P + O) / O when a request spends about one
  // step per output token (prefill steps are few beside its decode steps).
  // At least 1: every scheduled sequence computes a token (Step checks it).
  in.prompt_tokens = (view.step_cost.TokensPerSeq() - 1.0) * in.output_tokens;
  // The prompts as admitted, a prefill chunk's size: P above also counts recompute after preemptions (up to
  // 2.2x the trace's mean prompt on tuning seed 140 bounded at 256), which adds chunks, not size
  // (scheduler.md 7i).
  if (!prompts_.empty()) {
    double sum = 0;
    for (const TimedValue& v : prompts_) sum += v.value;
    in.prompt_chunk_tokens = sum / static_cast<double>(prompts_.size());
  }
  in.step_token_budget = obs.max_num_batched_tokens;
  // Demand. Without per-lane counts every request is the SLO lanes'.
  const bool counts_lanes = obs.num_arrivals_slo >= 0 && obs.num_waiting_slo >= 0 && !o.lanes.empty();
  in.slo_rate_per_s = view.RateOver(counts_lanes ? slo_arrivals_ : view.arrivals, obs.now_s, g.rate_window_s);
  in.slo_queue = counts_lanes ? obs.num_waiting_slo : obs.num_waiting;
  // The SLO lanes' share of the running batch, by their share of recent completions.
  in.slo_running = obs.num_running;
  if (counts_lanes) in.slo_running *= static_cast<double>(slo_outputs_.size()) / static_cast<double>(outputs_.size());
  if (counts_lanes) {
    // Subsets counted at the same steps over the same window (Step checks
    // each observation), so neither difference is negative.
    const double other_rate = view.RateOver(view.arrivals, obs.now_s, g.other_rate_window_s) -
                              view.RateOver(slo_arrivals_, obs.now_s, g.other_rate_window_s);
    const double other_queue = obs.num_waiting - obs.num_waiting_slo - obs.num_waiting_slo_late;
    in.other_demand_per_s = (other_queue + other_rate * g.horizon_s) / (g.horizon_s + g.other_wait_s);
    in.other_rate_per_s = other_rate;
    in.slo_rate_long_per_s = view.RateOver(slo_arrivals_, obs.now_s, g.other_rate_window_s);
    in.waiting_behind = obs.num_waiting - obs.num_waiting_slo;
    in.slo_late_queue = obs.num_waiting_slo_late;
  }
  // Idle: nothing to plan for; the cap stays where the last load left it.
  if (in.slo_rate_per_s + in.slo_queue + in.other_demand_per_s <= 0) return false;
  in.ttft_target_s = o.ttft_target_s;
  in.horizon_s = g.horizon_s;
  in.tpot_target_s = o.tpot_target_s;
  // The latest SLO-lane reply lengths (at most 64: the planner evaluates
  // each for every candidate cap).
  const size_t num_outputs = std::min<size_t>(slo_outputs_.size(), 64);
  for (size_t i = slo_outputs_.size() - num_outputs; i < slo_outputs_.size(); ++i) {
    in.slo_output_tokens.push_back(slo_outputs_[i].value);
  }
  in.min_num_seqs = options_.min_num_seqs;
  in.max_num_seqs = KvRaiseLimit(obs);
  const int32_t preempted = std::exchange(preemptions_since_adjust_, 0);
  if (preempted > 0 && !obs.resumes_from_cache) {
    // Recompute preemptions: the pool holds fewer seats than the running batch.
    in.max_num_seqs = std::max(options_.min_num_seqs, std::min(in.max_num_seqs, view.num_seqs - 1));
  }
  in.tie_share = g.tie_share;
  in.reach_share = g.reach_share;
  if (!ttft_.empty()) {  // the SLO lanes' completions in the window, in the same order in both deques
    size_t good = 0, in_time = 0;
    for (size_t i = 0; i < ttft_.size(); ++i) {
      in_time += ttft_[i].value <= o.ttft_target_s;
      good += ttft_[i].value <= o.ttft_target_s && tpot_[i].value <= o.tpot_target_s;
    }
    in.measured_good_share = static_cast<double>(good) / static_cast<double>(ttft_.size());
    in.ttft_good_share = static_cast<double>(in_time) / static_cast<double>(ttft_.size());
  }
  in.has_targets = o.targets_stated;
  in.late_last = g.late_last;
  // For status(): the windowed percentiles, as slo mode reports them.
  if (static_cast<int32_t>(tpot_.size()) >= o.min_samples) {
    tpot_p_s_ = PercentileOf(tpot_, o.percentile);
    ttft_p_s_ = PercentileOf(ttft_, o.percentile);
  }
  return true;
}

int32_t DemandModel::KvRaiseLimit(const StepObservation& obs) const {
  const SloOptions& o = options_.slo;
  int32_t limit = options_.max_num_seqs;
  if (obs.resumes_from_cache && obs.kv_capacity_tokens > 0 && obs.num_running > 0 && obs.kv_usage > 0) {
    // What the whole pool holds at the KV each running sequence holds now.
    // The rule below undercounts seats here: shared prefix blocks are held
    // once. On a long-context trace at saturation that rule (then on final
    // contexts) held the controller at 0.70-0.97 of the best static cap
    // (docs/benchmarks/scheduler.md 3e).
    const double held = obs.kv_usage / static_cast<double>(obs.num_running);
    limit = std::min(limit, std::max(obs.num_running, static_cast<int32_t>(1.0 / held)));
  } else if (obs.kv_capacity_tokens > 0 && static_cast<int32_t>(held_weights_.size()) >= o.min_samples) {
    // Seats beyond what the pool holds at the mean KV a running sequence
    // holds only buy preemptions (recompute); kv_raise_limit leaves room for
    // the batch's spread about that mean. (The final context, used before,
    // counts every sequence as if it were at its last token: 0.87 of the
    // best static cap on tuning seed 13, rtx4090d-tp4 without caching at
    // 4 ms, now 0.94.)
    double sum = 0, weights = 0;
    for (const TimedValue& v : held_weighted_) sum += v.value;
    for (const TimedValue& v : held_weights_) weights += v.value;
    const double fit = o.kv_raise_limit * static_cast<double>(obs.kv_capacity_tokens) / std::max(1.0, sum / weights);
    limit = std::min(limit, static_cast<int32_t>(fit));
  }
  return std::max(limit, options_.min_num_seqs);
}

const PlannerChoice& DemandModel::Plan(int32_t current_cap) {
  inputs_.draining = draining_;
  inputs_.was_unreachable = regime_ == PlanRegime::kUnreachable;
  inputs_.current_cap = current_cap;
  const PlannerChoice& choice = PlanCap(inputs_, plan_);
  ++num_plans_;
  draining_ = choice.drains;
  regime_ = choice.regime;
  return choice;
}

void DemandModel::Report(ControllerStatus& status) const {
  status.ttft_p_s = ttft_p_s_;
  status.tpot_p_s = tpot_p_s_;
  status.num_plans = num_plans_;
  status.regime = PlanRegimeName(regime_);
}

}  // namespace ferry::scheduler
