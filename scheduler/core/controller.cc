#include "scheduler/core/controller.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <stdexcept>
#include <utility>

#include "scheduler/core/goodput_planner.h"

namespace ferry::scheduler {
namespace {

// Room for a change's reason (PlanCap's is at most 560 bytes): reserved in every kept change once.
constexpr size_t kReasonRoom = 640;

void Validate(const ControllerOptions& o) {
  if (o.min_num_seqs < 1) throw std::invalid_argument("controller min_num_seqs must be >= 1");
  if (o.max_num_seqs < o.min_num_seqs) {
    throw std::invalid_argument("controller max_num_seqs = " + std::to_string(o.max_num_seqs) +
                                " is below min_num_seqs = " + std::to_string(o.min_num_seqs));
  }
  if (o.load.levels.empty()) throw std::invalid_argument("controller load levels are empty");
  for (size_t i = 1; i < o.load.levels.size(); ++i) {
    if (o.load.levels[i].num_seqs < o.load.levels[i - 1].num_seqs) {
      throw std::invalid_argument("controller load level \"" + o.load.levels[i].name +
                                  "\" has a smaller cap than the level below it");
    }
  }
  if (!(o.slo.ttft_target_s > 0) || !(o.slo.tpot_target_s > 0)) {
    throw std::invalid_argument("controller SLO targets must be > 0");
  }
  if (!(o.slo.percentile > 0 && o.slo.percentile <= 100)) {
    throw std::invalid_argument("controller SLO percentile must be in (0, 100]");
  }
  const GoodputOptions& g = o.goodput;
  if (!std::isfinite(g.other_ttft_target_s) || g.other_ttft_target_s < 0) {
    throw std::invalid_argument("controller other lanes' TTFT target = " + std::to_string(g.other_ttft_target_s) +
                                " s: want a finite value >= 0 (0: not known)");
  }
  if (!(g.reach_share >= 0 && g.reach_share <= 1)) {
    throw std::invalid_argument("controller reach_share = " + std::to_string(g.reach_share) +
                                ": want a share in [0, 1]");
  }
  if (!(g.other_wait_share > 0 && g.other_wait_share <= 1)) {
    throw std::invalid_argument("controller other_wait_share = " + std::to_string(g.other_wait_share) +
                                ": want a share in (0, 1]");
  }
}

}  // namespace

const char* ControllerModeName(ControllerMode mode) {
  switch (mode) {
    case ControllerMode::kStatic: return "static";
    case ControllerMode::kLoadLevel: return "load-level";
    case ControllerMode::kGoodput: return "goodput";
  }
  return "?";
}

ControllerMode ParseControllerMode(const std::string& name) {
  if (name == "static") return ControllerMode::kStatic;
  if (name == "load-level") return ControllerMode::kLoadLevel;
  // "slo" named a rule-based controller that failed on traces it was not
  // tuned on; configurations that name it get the model (controller.h).
  if (name == "goodput" || name == "slo") return ControllerMode::kGoodput;
  throw std::invalid_argument("controller mode \"" + name +
                              "\" is not one of static, load-level, goodput (slo: the same as goodput)");
}

static std::vector<LoadLevel> DefaultLoadLevels(int32_t min_num_seqs, int32_t max_num_seqs) {
  std::vector<LoadLevel> levels;
  auto add = [&](int32_t cap) { levels.push_back({"seqs-" + std::to_string(cap), cap}); };
  // Four levels per doubling (ratio 2^(1/4), rounded, repeats dropped): the
  // model's choice is never more than ~19% from a level.
  for (int k = 0;; ++k) {
    const auto cap = static_cast<int32_t>(std::lround(std::max(1, min_num_seqs) * std::pow(2.0, k / 4.0)));
    if (cap >= max_num_seqs) break;
    if (levels.empty() || cap > levels.back().num_seqs) add(cap);
  }
  add(max_num_seqs);
  return levels;
}

double OtherLanesTtftTarget(const std::vector<LaneTtft>& lane_ttft, const std::vector<std::string>& slo_lanes) {
  if (slo_lanes.empty()) return 0;
  double tightest_ms = 0;
  for (const LaneTtft& t : lane_ttft) {
    if (std::find(slo_lanes.begin(), slo_lanes.end(), t.lane) != slo_lanes.end()) continue;
    if (tightest_ms == 0 || t.ttft_ms < tightest_ms) tightest_ms = t.ttft_ms;
  }
  return tightest_ms / 1000.0;
}

Controller::Controller(ControllerOptions options) : options_(std::move(options)) {
  if (options_.load.levels.empty() && options_.min_num_seqs >= 1 && options_.max_num_seqs >= options_.min_num_seqs) {
    options_.load.levels = DefaultLoadLevels(options_.min_num_seqs, options_.max_num_seqs);
  }
  Validate(options_);
  if (UsesModel()) {  // GoodputOptions: the model modes' times scale with the TTFT target
    time_unit_s_ = options_.slo.ttft_target_s / kReferenceTtftS;
    GoodputOptions& g = options_.goodput;
    for (double* t : {&g.rate_window_s, &g.adjust_interval_s, &g.other_wait_s, &g.other_rate_window_s, &g.horizon_s,
                      &options_.load.rate_window_s, &options_.slo.window_s}) {
      *t *= time_unit_s_;
    }
    // A target the other lanes state is their own, in seconds: it does not scale.
    if (g.other_ttft_target_s > 0) g.other_wait_s = g.other_wait_share * g.other_ttft_target_s;
  }
  auto clamp = [&](int32_t n) {
    return std::clamp(n, options_.min_num_seqs, options_.max_num_seqs);
  };
  switch (options_.mode) {
    case ControllerMode::kStatic: num_seqs_ = options_.max_num_seqs; break;
    case ControllerMode::kLoadLevel: {
      // The level nearest a quarter of the bound (goodput's start) until the model has data.
      const auto& levels = options_.load.levels;
      for (level_ = 0; level_ + 1 < levels.size() && levels[level_ + 1].num_seqs <= options_.max_num_seqs / 4;) ++level_;
      if (!options_.slo.targets_stated) level_ = levels.size() - 1;  // kNoTargets: the top level
      num_seqs_ = clamp(levels[level_].num_seqs);
      break;
    }
    case ControllerMode::kGoodput:
      // Without targets the cap starts where it stays, at the bound (kNoTargets).
      num_seqs_ = clamp(options_.initial_num_seqs > 0 ? options_.initial_num_seqs
                        : options_.slo.targets_stated ? options_.max_num_seqs / 4
                                                      : options_.max_num_seqs);
      break;
  }
  if (!options_.slo.targets_stated) regime_ = PlanRegime::kNoTargets;
  changes_.Reserve(kKeptChanges, [](CapChange& c) {
    c.reason.reserve(kReasonRoom);
    c.level.reserve(32);  // a load level's name
  });
  plan_.choice.reason.reserve(kReasonRoom);
}

void Controller::OnCompletion(const RequestCompletion& done) {
  if (!UsesModel()) return;
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

bool Controller::CountsLane(const std::string& lane) const {
  const auto& lanes = options_.slo.lanes;
  return lanes.empty() || std::find(lanes.begin(), lanes.end(), lane) != lanes.end();
}

// The model modes subtract the SLO lanes' counts from the totals and read
// tokens per sequence-step: an observation that breaks these is a bug in the
// caller, refused by name rather than clamped.
static void CheckObservation(const StepObservation& obs, bool uses_model) {
  auto refuse = [](const std::string& what) { throw std::invalid_argument("controller observation: " + what); };
  if (obs.num_arrivals_slo > obs.num_arrivals) {
    refuse("num_arrivals_slo = " + std::to_string(obs.num_arrivals_slo) + " exceeds num_arrivals = " +
           std::to_string(obs.num_arrivals));
  }
  if (obs.num_waiting_slo > obs.num_waiting) {
    refuse("num_waiting_slo = " + std::to_string(obs.num_waiting_slo) + " exceeds num_waiting = " +
           std::to_string(obs.num_waiting));
  }
  if (obs.num_waiting_slo_late < 0 || obs.num_waiting_slo + obs.num_waiting_slo_late > obs.num_waiting) {
    refuse("num_waiting_slo_late = " + std::to_string(obs.num_waiting_slo_late) +
           " is negative or, with num_waiting_slo = " + std::to_string(obs.num_waiting_slo) +
           ", exceeds num_waiting = " + std::to_string(obs.num_waiting));
  }
  if (obs.last_step_tokens > 0 && obs.last_step_tokens < obs.last_step_seqs) {
    refuse("last_step_tokens = " + std::to_string(obs.last_step_tokens) + " is below last_step_seqs = " +
           std::to_string(obs.last_step_seqs) + " (every scheduled sequence computes a token)");
  }
  // Without it the step model falls back to num_running, which need not be the step's batch.
  if (uses_model && obs.last_step_tokens > 0 && obs.last_step_seqs <= 0) {
    refuse("last_step_seqs is not given for a step of " + std::to_string(obs.last_step_tokens) +
           " tokens (the goodput and load-level modes need it)");
  }
}

int32_t Controller::Step(const StepObservation& obs) {
  CheckObservation(obs, UsesModel());
  if (!seen_step_) first_step_s_ = obs.now_s, seen_step_ = true;
  last_step_s_ = obs.now_s;
  if (obs.num_arrivals > 0) arrivals_.push_back({obs.now_s, static_cast<double>(obs.num_arrivals)});
  if (obs.num_arrivals_slo > 0) slo_arrivals_.push_back({obs.now_s, static_cast<double>(obs.num_arrivals_slo)});
  if (obs.last_step_s > 0 && obs.last_step_tokens > 0) {
    steps_.Add(obs.now_s, obs.last_step_s,
               obs.last_step_seqs > 0 ? obs.last_step_seqs : obs.num_running, obs.last_step_tokens);
  }
  preemptions_since_adjust_ += obs.num_preemptions;
  Expire(obs.now_s);
  if (held_) return num_seqs_;  // observed above, so the model is current when released
  switch (options_.mode) {
    case ControllerMode::kStatic: break;
    case ControllerMode::kLoadLevel: StepLoadLevel(obs); break;
    case ControllerMode::kGoodput: StepGoodput(obs); break;
  }
  return num_seqs_;
}

void Controller::Expire(double now_s) {
  // The model reads the other lanes' arrivals over a longer window.
  const double rate_from =
      now_s - std::max(options_.load.rate_window_s, options_.goodput.other_rate_window_s);
  for (auto* d : {&arrivals_, &slo_arrivals_}) {
    while (!d->empty() && d->front().time_s < rate_from) d->pop_front();
  }
  const double slo_from = now_s - options_.slo.window_s;
  steps_.Expire(slo_from);
  for (auto* d : {&ttft_, &tpot_, &outputs_, &slo_outputs_, &prompts_, &held_weighted_, &held_weights_}) {
    while (!d->empty() && d->front().time_s < slo_from) d->pop_front();
  }
}

double Controller::PercentileOf(const Ring<TimedValue>& d, double pct) {
  if (d.empty()) return 0.0;
  scratch_.clear();
  for (const TimedValue& e : d) scratch_.push_back(e.value);
  const double rank = std::ceil(pct / 100.0 * static_cast<double>(scratch_.size()));
  const size_t k = static_cast<size_t>(std::clamp(rank, 1.0, static_cast<double>(scratch_.size()))) - 1;
  std::nth_element(scratch_.begin(), scratch_.begin() + static_cast<ptrdiff_t>(k), scratch_.end());
  return scratch_[k];
}

double Controller::ArrivalRate(double now_s) const {
  return RateOver(arrivals_, now_s, options_.load.rate_window_s);
}

double Controller::RateOver(const Ring<TimedValue>& d, double now_s, double window_s) const {
  // Until a whole window has passed, over the time observed (at least one
  // time unit: 1 s, or the model modes' TTFT target): a rate over the full
  // window would start near zero and climb for its first window_s.
  double n = 0;
  for (size_t i = d.size(); i > 0 && d[i - 1].time_s >= now_s - window_s; --i) n += d[i - 1].value;
  return n / std::clamp(now_s - first_step_s_, time_unit_s_, window_s);
}

int32_t Controller::KvRaiseLimit(const StepObservation& obs) const {
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

void Controller::Set(int32_t num_seqs, double now_s, bool hold) {
  const int32_t to = std::clamp(num_seqs, options_.min_num_seqs, options_.max_num_seqs);
  last_adjust_s_ = now_s;
  held_ = hold;
  Change(now_s, to, "admin", "Set(" + std::to_string(num_seqs) + (hold ? ", held)" : ")"));
  // The reported percentiles describe the cap the operator replaced.
  ttft_.clear();
  tpot_.clear();
}

void Controller::Change(double now_s, int32_t to, std::string_view level, std::string_view reason) {
  if (to == num_seqs_) return;
  if (changes_.size() == kKeptChanges) changes_.pop_front();
  // Into a kept slot: its strings' room was reserved at construction, so a change allocates nothing.
  CapChange& change = changes_.PushSlot();
  change.time_s = now_s;
  change.from = num_seqs_;
  change.to = to;
  change.level.assign(level);
  change.reason.assign(reason);
  ++num_changes_;
  num_seqs_ = to;
}

ControllerStatus Controller::status() const {
  ControllerStatus s;
  s.mode = options_.mode;
  s.num_seqs = num_seqs_;
  s.level = options_.mode == ControllerMode::kLoadLevel ? options_.load.levels[level_].name
                                                        : ControllerModeName(options_.mode);
  s.ttft_p_s = ttft_p_s_;
  s.tpot_p_s = tpot_p_s_;
  s.arrival_rate_per_s = ArrivalRate(last_step_s_);
  s.num_changes = num_changes_;
  s.num_plans = num_plans_;
  s.held = held_;
  s.regime = UsesModel() ? PlanRegimeName(regime_) : "static";
  return s;
}

std::vector<CapChange> Controller::TakeChanges() {
  const uint64_t pending = std::min<uint64_t>(num_changes_ - num_taken_, changes_.size());
  std::vector<CapChange> out;
  out.reserve(pending);
  for (size_t i = changes_.size() - pending; i < changes_.size(); ++i) out.push_back(changes_[i]);
  num_taken_ = num_changes_;
  return out;
}

}  // namespace ferry::scheduler
