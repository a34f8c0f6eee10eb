#include "scheduler/core/controller.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <stdexcept>
#include <utility>

#include "scheduler/core/goodput_planner.h"

namespace ferry::scheduler {
namespace {

// Percentile by nearest rank over the window's values; 0 when empty.
double Percentile(const std::deque<double>& values, double pct) {
  if (values.empty()) return 0.0;
  std::vector<double> v(values.begin(), values.end());
  const double rank = std::ceil(pct / 100.0 * static_cast<double>(v.size()));
  const size_t k = static_cast<size_t>(std::clamp(rank, 1.0, static_cast<double>(v.size()))) - 1;
  std::nth_element(v.begin(), v.begin() + static_cast<ptrdiff_t>(k), v.end());
  return v[k];
}

template <typename Deque>
std::deque<double> Values(const Deque& d) {
  std::deque<double> out;
  for (const auto& e : d) out.push_back(e.value);
  return out;
}

std::string Fmt(const char* format, double a, double b = 0, double c = 0) {
  char buf[256];
  std::snprintf(buf, sizeof(buf), format, a, b, c);
  return buf;
}

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
  if (!(o.slo.decrease_factor > 0 && o.slo.decrease_factor < 1)) {
    throw std::invalid_argument("controller decrease_factor must be in (0, 1)");
  }
}

}  // namespace

const char* ControllerModeName(ControllerMode mode) {
  switch (mode) {
    case ControllerMode::kStatic: return "static";
    case ControllerMode::kLoadLevel: return "load-level";
    case ControllerMode::kSlo: return "slo";
    case ControllerMode::kGoodput: return "goodput";
  }
  return "?";
}

ControllerMode ParseControllerMode(const std::string& name) {
  if (name == "static") return ControllerMode::kStatic;
  if (name == "load-level") return ControllerMode::kLoadLevel;
  if (name == "slo") return ControllerMode::kSlo;
  if (name == "goodput") return ControllerMode::kGoodput;
  throw std::invalid_argument("controller mode \"" + name +
                              "\" is not one of static, load-level, slo, goodput");
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
  }
  auto clamp = [&](int32_t n) {
    return std::clamp(n, options_.min_num_seqs, options_.max_num_seqs);
  };
  switch (options_.mode) {
    case ControllerMode::kStatic: num_seqs_ = options_.max_num_seqs; break;
    case ControllerMode::kLoadLevel: {
      // The level nearest a quarter of the bound (slo's start) until the model has data.
      const auto& levels = options_.load.levels;
      for (level_ = 0; level_ + 1 < levels.size() && levels[level_ + 1].num_seqs <= options_.max_num_seqs / 4;) ++level_;
      num_seqs_ = clamp(levels[level_].num_seqs);
      break;
    }
    case ControllerMode::kSlo:
    case ControllerMode::kGoodput:
      num_seqs_ = clamp(options_.initial_num_seqs > 0 ? options_.initial_num_seqs
                                                      : options_.max_num_seqs / 4);
      break;
  }
}

void Controller::OnCompletion(const RequestCompletion& done) {
  if (options_.mode != ControllerMode::kSlo && !UsesModel()) return;
  if (done.num_output_tokens > 0) outputs_.push_back({done.now_s, static_cast<double>(done.num_output_tokens)});
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
  if (UsesModel() && done.num_output_tokens > 0) {
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
    ++steps_since_change_;
  }
  preemptions_since_adjust_ += obs.num_preemptions;
  Expire(obs.now_s);
  switch (options_.mode) {
    case ControllerMode::kStatic: break;
    case ControllerMode::kLoadLevel: StepLoadLevel(obs); break;
    case ControllerMode::kSlo: StepSlo(obs); break;
    case ControllerMode::kGoodput: StepGoodput(obs); break;
  }
  return num_seqs_;
}

void Controller::Expire(double now_s) {
  // The model reads the other lanes' arrivals over a longer window.
  const double rate_from = now_s - (UsesModel()
                                        ? std::max(options_.load.rate_window_s, options_.goodput.other_rate_window_s)
                                        : options_.load.rate_window_s);
  for (auto* d : {&arrivals_, &slo_arrivals_}) {
    while (!d->empty() && d->front().time_s < rate_from) d->pop_front();
  }
  const double slo_from = now_s - options_.slo.window_s;
  steps_.Expire(slo_from);
  for (auto* d : {&ttft_, &tpot_, &outputs_, &slo_outputs_, &held_weighted_, &held_weights_}) {
    while (!d->empty() && d->front().time_s < slo_from) d->pop_front();
  }
}

double Controller::PercentileOf(const std::deque<TimedValue>& d, double pct) {
  return Percentile(Values(d), pct);
}

double Controller::ArrivalRate(double now_s) const {
  return RateOver(arrivals_, now_s, options_.load.rate_window_s);
}

double Controller::RateOver(const std::deque<TimedValue>& d, double now_s, double window_s) const {
  // Until a whole window has passed, over the time observed (at least one
  // time unit: 1 s, or the model modes' TTFT target): a rate over the full
  // window would start near zero and climb for its first window_s.
  double n = 0;
  for (auto it = d.rbegin(); it != d.rend() && it->time_s >= now_s - window_s; ++it) n += it->value;
  return n / std::clamp(now_s - first_step_s_, time_unit_s_, window_s);
}

double Controller::SeatsFor(const Batch& batch, double target_s, double now_s) const {
  if (now_s <= 0) return options_.max_num_seqs;
  // The fitted cost of one more sequence when the window supports a fit;
  // otherwise step time in proportion to the batch (an upper bound: a fixed
  // part of the step does not grow at all).
  const double seats = batch.per_seq_s ? batch.running + (target_s - now_s) / *batch.per_seq_s
                                       : batch.running * target_s / now_s;
  return std::min<double>(seats, options_.max_num_seqs);
}

void Controller::ForgetPastCap() {
  ttft_.clear();
  tpot_.clear();
  steps_since_change_ = 0;
}

void Controller::StepSlo(const StepObservation& obs) {
  const SloOptions& o = options_.slo;
  if (obs.now_s - last_adjust_s_ < o.adjust_interval_s) return;
  // Too few steps under the current cap to judge it (idle, or just changed).
  if (steps_since_change_ < kMinStepsToJudge) return;
  const bool has_samples = static_cast<int32_t>(ttft_.size()) >= o.min_samples;
  ttft_p_s_ = has_samples ? Percentile(Values(ttft_), o.percentile) : 0.0;
  tpot_p_s_ = has_samples ? Percentile(Values(tpot_), o.percentile) : 0.0;
  // The mean of the latest steps under the current cap leads per-request
  // TPOT (a request's TPOT averages its steps). Not a percentile of steps:
  // one step that carries a long prefill chunk is several decode steps long,
  // yet it adds only one token's delay to each running request.
  const int32_t num_recent = std::min(steps_since_change_, std::max(1, o.step_window));
  const Batch batch{std::max(1, std::min(num_seqs_, obs.num_running)),
                    steps_.RecentMean(static_cast<size_t>(num_recent)), steps_.MarginalSeqCost()};
  const double step_mean = batch.step_mean_s;
  const int32_t preempted = preemptions_since_adjust_;
  preemptions_since_adjust_ = 0;
  last_adjust_s_ = obs.now_s;
  const size_t changes_before = changes_.size();
  bool is_backlog_raise = false;
  // A full pool costs nothing by itself when a preempted sequence resumes
  // from the cache; without the cache, high usage foretells recomputes.
  const bool is_pool_full = !obs.resumes_from_cache && obs.kv_usage > o.kv_high_usage;
  if (preempted > 0 || is_pool_full) {
    // KV pressure: preemption by recompute is the pool's normal overflow
    // valve, so step down gently (a multiplicative cut here oscillates
    // around the cap that fits and starves queued work).
    const int32_t kv_cut = std::max(options_.min_num_seqs, num_seqs_ - std::max(1, num_seqs_ / 8));
    if (kv_cut < num_seqs_) {
      Change(obs.now_s, kv_cut, "cut",
             Fmt("kv pressure: %.0f preemptions, kv usage %.2f (limit %.2f)", preempted,
                 obs.kv_usage, o.kv_high_usage));
    }
  } else if (IsBacklogged(obs) && RaiseLimit(obs, batch) <= num_seqs_) {
    RaiseForBacklog(obs, batch);
    is_backlog_raise = true;
  } else if (tpot_p_s_ > o.tpot_target_s || step_mean > o.tpot_target_s) {
    // Cut to the seats whose predicted step time meets the target, by at
    // least one seat and at most down to decrease_factor of the cap. (Of the
    // cap, not of the batch running now: between bursts one sequence may
    // run, and a TPOT percentile of the burst before would cut to 1.)
    const double fit = SeatsFor(batch, o.tpot_target_s, std::max(step_mean, tpot_p_s_));
    const int32_t cut = std::max(
        {options_.min_num_seqs, KeepUpFloor(obs.now_s),
         std::clamp(static_cast<int32_t>(std::floor(fit)),
                    static_cast<int32_t>(std::floor(num_seqs_ * o.decrease_factor)), num_seqs_ - 1)});
    if (cut < num_seqs_) {
      Change(obs.now_s, cut, "cut",
             Fmt("tpot p%.0f %.1f ms (steps %.1f ms) > target", o.percentile,
                 1e3 * tpot_p_s_, 1e3 * step_mean) +
                 Fmt(" %.1f ms", 1e3 * o.tpot_target_s));
    }
  } else {
    MaybeRaise(obs, batch);
  }
  // Completions and steps so far ran under the old cap; judging the new one
  // by them would repeat a cut (or a raise) that has already been made.
  if (changes_.size() != changes_before) ForgetPastCap();
  in_backlog_ = is_backlog_raise;
}

bool Controller::IsBacklogged(const StepObservation& obs) const {
  if (obs.num_running < num_seqs_ || obs.num_waiting == 0) return false;
  return ttft_p_s_ > options_.slo.ttft_target_s || obs.oldest_wait_s > options_.slo.ttft_target_s;
}

bool Controller::IsQueueBuilding(const StepObservation& obs) const {
  const SloOptions& o = options_.slo;
  if (obs.oldest_wait_s >= 0) return obs.oldest_wait_s > o.queue_wait_share * o.ttft_target_s;
  return ttft_p_s_ > o.ttft_target_s;
}

int32_t Controller::KeepUpFloor(double now_s) const {
  if (keep_up_seats_ == 0 || keep_up_rate_ <= 0) return 0;
  // The seats a queue needs to keep up grow with the arrival rate (Little's
  // law at a given step time), so the floor follows the rate down.
  const double share = std::min(1.0, ArrivalRate(now_s) / keep_up_rate_);
  return static_cast<int32_t>(std::floor(keep_up_seats_ * share));
}

void Controller::RaiseForBacklog(const StepObservation& obs, const Batch& batch) {
  // Requests miss TTFT in the queue behind a full cap: the cap that holds the
  // TPOT target does not keep up with the arrivals, and the queue grows until
  // every request misses. Keeping up comes first: a sequence a little over
  // the TPOT target may still meet it, one that waits in a growing queue
  // cannot. Only the KV pool bounds this raise. Its steps drain the backlog
  // (they overshoot: TTFT lags the queue); the seat after the cap where the
  // queue grew (the first raise of a run, not the overshoot) becomes a floor
  // for TPOT cuts, scaled with the arrival rate, so the cap does not fall
  // back to where the queue grew (docs/benchmarks/scheduler.md 3f, 3g).
  const int32_t limit = KvRaiseLimit(obs);
  if (num_seqs_ >= limit) return;
  int32_t step = std::max(1, num_seqs_ / 8);
  if (obs.num_waiting > num_seqs_) step = std::max(step, num_seqs_ / 4);  // deep queue: faster
  const int32_t to = std::min(limit, num_seqs_ + step);
  if (!in_backlog_ && num_seqs_ + 1 > KeepUpFloor(obs.now_s)) {
    keep_up_seats_ = num_seqs_ + 1;
    keep_up_rate_ = ArrivalRate(obs.now_s);
  }
  Change(obs.now_s, to, "raise",
         Fmt("backlog: %.0f waiting, ", obs.num_waiting) +
             (obs.oldest_wait_s >= 0 ? Fmt("oldest waited %.0f ms", 1e3 * obs.oldest_wait_s)
                                     : std::string("oldest wait not measured")) +
             Fmt(", ttft p%.0f", options_.slo.percentile) +
             Fmt(" %.0f ms (target %.0f ms)", 1e3 * ttft_p_s_, 1e3 * options_.slo.ttft_target_s) +
             Fmt("; keeping up before tpot %.1f ms", 1e3 * std::max(tpot_p_s_, batch.step_mean_s)));
}

int32_t Controller::KvRaiseLimit(const StepObservation& obs) const {
  const SloOptions& o = options_.slo;
  int32_t limit = options_.max_num_seqs;
  if (obs.resumes_from_cache && obs.kv_capacity_tokens > 0 && obs.num_running > 0 && obs.kv_usage > 0) {
    // What the whole pool holds at the KV each running sequence holds now.
    // The rule below undercounts seats here: shared prefix blocks are held
    // once. On a long-context trace at saturation that rule (then on final
    // contexts) held slo at 0.70-0.97 of the best static cap
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

int32_t Controller::RaiseLimit(const StepObservation& obs, const Batch& batch) const {
  const SloOptions& o = options_.slo;
  int32_t limit = KvRaiseLimit(obs);
  // Never past the seats whose predicted mean step time reaches the aim
  // (raise_headroom of the target), nor those whose predicted TPOT
  // percentile reaches half that headroom: a percentile already includes
  // most of the spread the headroom on the mean allows for. So a raise does
  // not overshoot the target on its own.
  const double headroom = IsQueueBuilding(obs) ? o.queue_headroom : o.raise_headroom;
  double fit = SeatsFor(batch, headroom * o.tpot_target_s, batch.step_mean_s);
  if (tpot_p_s_ > 0) {
    const double percentile_aim = 0.5 * (1.0 + headroom) * o.tpot_target_s;
    fit = std::min(fit, SeatsFor(batch, percentile_aim, tpot_p_s_));
  }
  limit = std::min(limit, static_cast<int32_t>(std::floor(std::max(0.0, fit))));
  return std::max(limit, options_.min_num_seqs);
}

void Controller::MaybeRaise(const StepObservation& obs, const Batch& batch) {
  const SloOptions& o = options_.slo;
  // Work waiting behind a full cap: more seats. (A TTFT miss with a full cap
  // and a queue is queueing, which more seats relieve; with seats free, a
  // smaller cap would not help TTFT either.)
  const bool is_cap_full = obs.num_running >= num_seqs_ && obs.num_waiting > 0;
  if (!is_cap_full || (!obs.resumes_from_cache && obs.kv_usage >= o.kv_raise_limit)) return;
  const int32_t limit = RaiseLimit(obs, batch);
  if (num_seqs_ >= limit) return;
  int32_t step = o.increase_step > 0 ? o.increase_step : std::max(1, num_seqs_ / 8);
  if (obs.num_waiting > num_seqs_) step = std::max(step, num_seqs_ / 2);  // deep queue: faster
  const int32_t to = std::min(limit, num_seqs_ + step);
  std::string why = Fmt("%.0f waiting behind a full cap; ttft p%.0f %.0f ms", obs.num_waiting,
                        o.percentile, 1e3 * ttft_p_s_);
  if (IsQueueBuilding(obs) && obs.oldest_wait_s >= 0) {
    why += Fmt(", oldest waited %.0f ms (aim %.0f%% of tpot)", 1e3 * obs.oldest_wait_s,
               100 * o.queue_headroom);
  }
  Change(obs.now_s, to, "raise",
         why + Fmt(", tpot %.1f ms <= %.1f ms", 1e3 * std::max(tpot_p_s_, batch.step_mean_s),
                   1e3 * o.tpot_target_s));
}

void Controller::Set(int32_t num_seqs, double now_s) {
  const int32_t to = std::clamp(num_seqs, options_.min_num_seqs, options_.max_num_seqs);
  last_adjust_s_ = now_s;
  Change(now_s, to, "admin", "Set(" + std::to_string(num_seqs) + ")");
  keep_up_seats_ = 0;  // the operator's cap replaces what a backlog taught
  ForgetPastCap();
}

void Controller::Change(double now_s, int32_t to, std::string level, std::string reason) {
  if (to == num_seqs_) return;
  changes_.push_back(CapChange{now_s, num_seqs_, to, std::move(level), std::move(reason)});
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
  s.num_changes = changes_.size();
  return s;
}

std::vector<CapChange> Controller::TakeChanges() {
  std::vector<CapChange> out(changes_.begin() + static_cast<ptrdiff_t>(num_taken_), changes_.end());
  num_taken_ = changes_.size();
  return out;
}

}  // namespace ferry::scheduler
