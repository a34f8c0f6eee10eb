// The goodput and load-level modes: what the controller measures, handed to
// the goodput planner (goodput_planner.h), and how each mode takes its
// choice. Pure, like the rest of the controller.
#include <algorithm>
#include <cstdio>
#include <utility>

#include "scheduler/core/controller.h"

namespace ferry::scheduler {

StepFit Controller::CurrentFit(double seconds_per_token) {
  // The batch must have varied for a fit (it does on its own as requests
  // come and go below the cap). A cap that stays full stops it varying: the
  // latest fit stands in. Until the first such fit, the fit at one batch
  // size (a seat costs its tokens only; optimistic). Step time in proportion
  // to the tokens, the guess before that, is a trap: it makes a step's fixed
  // part grow with the batch, so no cap completes more than another, a small
  // one wins on TPOT, and the batch never varies enough for a fit (tuning
  // seed 115: cap 1 for a minute of rising load, 0.30 of the best static cap).
  if (std::optional<StepFit> fit = steps_.Fit()) {
    last_fit_ = fit;
    fit_has_seqs_ = true;
  } else if (!fit_has_seqs_) {
    if (std::optional<StepFit> one = steps_.FitAtOneBatchSize()) last_fit_ = one;
  }
  // Nothing fitted yet (too few steps, or pure decode at one batch size): the tokens' share.
  return last_fit_ ? *last_fit_ : StepFit{0, 0, seconds_per_token};
}

std::optional<StepFit> Controller::FitOfTheWindow() {
  const double step_mean = steps_.RecentMean(steps_.size());
  const double tokens_per_step = steps_.RecentTokensMean(steps_.size());
  if (step_mean <= 0 || tokens_per_step <= 0) return std::nullopt;
  return CurrentFit(step_mean / tokens_per_step);
}

bool Controller::ModelInputs(const StepObservation& obs) {
  const GoodputOptions& g = options_.goodput;
  const SloOptions& o = options_.slo;
  if (static_cast<int32_t>(outputs_.size()) < g.min_completions) return false;
  const std::optional<StepFit> fit = FitOfTheWindow();
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
  in.prompt_tokens = (steps_.TokensPerSeq() - 1.0) * in.output_tokens;
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
  in.slo_rate_per_s = RateOver(counts_lanes ? slo_arrivals_ : arrivals_, obs.now_s, g.rate_window_s);
  in.slo_queue = counts_lanes ? obs.num_waiting_slo : obs.num_waiting;
  // The SLO lanes' share of the running batch, by their share of recent completions.
  in.slo_running = obs.num_running;
  if (counts_lanes) in.slo_running *= static_cast<double>(slo_outputs_.size()) / static_cast<double>(outputs_.size());
  if (counts_lanes) {
    // Subsets counted at the same steps over the same window (Step checks
    // each observation), so neither difference is negative.
    const double other_rate = RateOver(arrivals_, obs.now_s, g.other_rate_window_s) -
                              RateOver(slo_arrivals_, obs.now_s, g.other_rate_window_s);
    const double other_queue = obs.num_waiting - obs.num_waiting_slo - obs.num_waiting_slo_late;
    in.other_demand_per_s = (other_queue + other_rate * g.horizon_s) / (g.horizon_s + g.other_wait_s);
    in.other_rate_per_s = other_rate;
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
    in.max_num_seqs = std::max(options_.min_num_seqs, std::min(in.max_num_seqs, num_seqs_ - 1));
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

// Before the model's first choice (GoodputOptions::min_completions) the
// cap is a blind quarter of the bound: no reply length is known, so no
// completion rate or goodput. One thing is known from the first steps: what
// a decode step costs. A cap whose pure-decode step already misses the TPOT
// target fails every request it admits, whatever the lengths, so the start
// is cut to the largest cap whose decode step meets it (by the fit so far,
// optimistic until the batch has varied). On the CPU engine at 50 ms that
// is 4-6 sequences, not 16: with long RAG prompts a cold start at 16 failed
// every TPOT for the first 170 s of a 1,500 s trace (cpu-0.5b tuning seed
// 61). On a GPU a decode step at a quarter of the bound meets the target,
// and nothing changes.
void Controller::ColdStartBound(const StepObservation& obs) {
  if (!options_.slo.targets_stated || options_.slo.tpot_target_s <= 0) return;
  const std::optional<StepFit> fitted = FitOfTheWindow();
  if (!fitted) return;
  const StepFit& fit = *fitted;
  if (fit.fixed_s <= 0 && fit.per_seq_s <= 0) return;  // the tokens' share: no step cost per sequence known yet
  last_adjust_s_ = obs.now_s;
  int32_t cap = num_seqs_;
  while (cap > options_.min_num_seqs && fit.Seconds(cap, cap) > options_.slo.tpot_target_s) --cap;
  if (cap >= num_seqs_) return;  // only cuts: the fit is refined as steps come
  char buf[200];
  std::snprintf(buf, sizeof(buf),
                "[goodput] cold start: a decode step of %d sequences takes %.2f ms by the fit so far (%.3f ms + "
                "%.1f us/seq + %.2f us/token), over the %.2f ms TPOT",
                num_seqs_, 1e3 * fit.Seconds(num_seqs_, num_seqs_), 1e3 * fit.fixed_s, 1e6 * fit.per_seq_s,
                1e6 * fit.per_token_s, 1e3 * options_.slo.tpot_target_s);
  Change(obs.now_s, cap, "cut", buf);
}

void Controller::StepGoodput(const StepObservation& obs) {
  if (obs.now_s - last_adjust_s_ < options_.goodput.adjust_interval_s) return;
  if (static_cast<int32_t>(outputs_.size()) < options_.goodput.min_completions) return ColdStartBound(obs);
  if (!ModelInputs(obs)) return;
  PlannerInputs* in = &inputs_;
  last_adjust_s_ = obs.now_s;
  in->draining = draining_;
  in->was_unreachable = regime_ == PlanRegime::kUnreachable;
  in->current_cap = num_seqs_;
  const PlannerChoice& choice = PlanCap(*in, plan_);
  ++num_plans_;
  draining_ = choice.drains;
  regime_ = choice.regime;
  // A raise of a sixteenth of the cap or less is noise in the window's
  // estimates (it flaps at a TPOT bound that falls between two caps); cuts
  // are always taken.
  if (choice.cap == num_seqs_ || (choice.cap > num_seqs_ && choice.cap - num_seqs_ <= num_seqs_ / 16)) return;
  Change(obs.now_s, choice.cap, choice.cap > num_seqs_ ? "raise" : "cut", choice.reason);
}

void Controller::StepLoadLevel(const StepObservation& obs) {
  if (obs.now_s - last_adjust_s_ < options_.goodput.adjust_interval_s) return;
  if (!ModelInputs(obs)) return;
  PlannerInputs* in = &inputs_;
  last_adjust_s_ = obs.now_s;
  const auto& levels = options_.load.levels;
  for (const LoadLevel& l : levels) in->candidates.push_back(l.num_seqs);
  // The pool may bound every level above the smallest: that one stays a choice.
  in->max_num_seqs = std::max(in->max_num_seqs, std::min(levels.front().num_seqs, options_.max_num_seqs));
  in->min_num_seqs = std::min(in->min_num_seqs, levels.front().num_seqs);
  in->draining = draining_;
  in->was_unreachable = regime_ == PlanRegime::kUnreachable;
  in->current_cap = num_seqs_;
  const PlannerChoice& choice = PlanCap(*in, plan_);
  ++num_plans_;
  draining_ = choice.drains;
  regime_ = choice.regime;
  size_t target = 0;
  while (target + 1 < levels.size() && levels[target].num_seqs != choice.cap) ++target;
  if (target == level_) return;
  level_ = target;
  Change(obs.now_s, std::clamp(levels[target].num_seqs, options_.min_num_seqs, options_.max_num_seqs),
         levels[target].name, choice.reason);
}

}  // namespace ferry::scheduler
