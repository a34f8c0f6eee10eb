#include "scheduler/cap/controller.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <stdexcept>
#include <utility>

#include "scheduler/cap/cap_mode.h"
#include "scheduler/cap/goodput_planner.h"

namespace ferry::scheduler {
namespace {

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

const char* ControllerModeName(ControllerMode mode) { return CapModeFor(mode).name.data(); }

ControllerMode ParseControllerMode(const std::string& name) {
  std::string known;
  for (const CapModeEntry& entry : CapModes()) {
    if (name == entry.name || (!entry.alias.empty() && name == entry.alias)) return entry.mode;
    known += (known.empty() ? "" : ", ") + std::string(entry.name);
    if (!entry.alias.empty()) known += " (" + std::string(entry.alias) + ": the same)";
  }
  throw std::invalid_argument("controller mode \"" + name + "\" is not one of " + known);
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

namespace {

// ControllerView::RateOver, for the controller's own reads too.
double RateOverWindow(const Ring<TimedValue>& d, double now_s, double window_s, double first_step_s,
                      double time_unit_s) {
  double n = 0;
  for (size_t i = d.size(); i > 0 && d[i - 1].time_s >= now_s - window_s; --i) n += d[i - 1].value;
  return n / std::clamp(now_s - first_step_s, time_unit_s, window_s);
}

}  // namespace

double ControllerView::RateOver(const Ring<TimedValue>& d, double now_s, double window_s) const {
  return RateOverWindow(d, now_s, window_s, first_step_s, time_unit_s);
}

// The controller's side of CapSetter: a mode's changes land in its record.
class Controller::Setter final : public CapSetter {
 public:
  explicit Setter(Controller& c) : c_(c) {}
  void Change(double now_s, int32_t to, std::string_view level, std::string_view reason) override {
    c_.Change(now_s, to, level, reason);
  }

 private:
  Controller& c_;
};

Controller::Controller(ControllerOptions options) : Controller(std::move(options), nullptr, false) {}

Controller::Controller(ControllerOptions options, std::unique_ptr<CapMode> mode, bool models_steps)
    : options_(std::move(options)), models_steps_(models_steps) {
  if (options_.load.levels.empty() && options_.min_num_seqs >= 1 && options_.max_num_seqs >= options_.min_num_seqs) {
    options_.load.levels = DefaultLoadLevels(options_.min_num_seqs, options_.max_num_seqs);
  }
  Validate(options_);
  const CapModeEntry* entry = mode ? nullptr : &CapModeFor(options_.mode);
  if (entry != nullptr) models_steps_ = entry->models_steps;
  if (models_steps_) {  // GoodputOptions: the model modes' times scale with the TTFT target
    time_unit_s_ = options_.slo.ttft_target_s / kReferenceTtftS;
    GoodputOptions& g = options_.goodput;
    for (double* t : {&g.rate_window_s, &g.adjust_interval_s, &g.other_wait_s, &g.other_rate_window_s, &g.horizon_s,
                      &options_.load.rate_window_s, &options_.slo.window_s}) {
      *t *= time_unit_s_;
    }
    // A target the other lanes state is their own, in seconds: it does not scale.
    if (g.other_ttft_target_s > 0) g.other_wait_s = g.other_wait_share * g.other_ttft_target_s;
  }
  mode_ = entry != nullptr ? entry->make(options_) : std::move(mode);
  num_seqs_ = std::clamp(mode_->InitialCap(), options_.min_num_seqs, options_.max_num_seqs);
  changes_.Reserve(kKeptChanges, [](CapChange& c) {
    c.reason.reserve(kCapReasonRoom);
    c.level.reserve(32);  // a load level's name
  });
}

Controller::~Controller() = default;
Controller::Controller(Controller&&) noexcept = default;

void Controller::OnCompletion(const RequestCompletion& done) { mode_->OnCompletion(done); }

bool Controller::ReadsQueueAt(double now_s) const { return mode_->ReadsQueueAt(now_s); }

// The model modes subtract the SLO lanes' counts from the totals and read
// tokens per sequence-step: an observation that breaks these is a bug in the
// caller, refused by name rather than clamped.
static void CheckObservation(const StepObservation& obs, bool models_steps) {
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
  if (models_steps && obs.last_step_tokens > 0 && obs.last_step_seqs <= 0) {
    refuse("last_step_seqs is not given for a step of " + std::to_string(obs.last_step_tokens) +
           " tokens (the goodput and load-level modes need it)");
  }
}

int32_t Controller::Step(const StepObservation& obs) {
  CheckObservation(obs, models_steps_);
  if (!seen_step_) first_step_s_ = obs.now_s, seen_step_ = true;
  last_step_s_ = obs.now_s;
  if (obs.num_arrivals > 0) arrivals_.push_back({obs.now_s, static_cast<double>(obs.num_arrivals)});
  // Kept as long as the longest window a mode reads them over (the model modes' other lanes' rate).
  const double rate_from = obs.now_s - std::max(options_.load.rate_window_s, options_.goodput.other_rate_window_s);
  while (!arrivals_.empty() && arrivals_.front().time_s < rate_from) arrivals_.pop_front();
  if (obs.last_step_s > 0 && obs.last_step_tokens > 0) {
    step_cost_.Add(obs.now_s, obs.last_step_s, obs.last_step_seqs > 0 ? obs.last_step_seqs : obs.num_running,
                   obs.last_step_tokens);
  }
  step_cost_.Expire(obs.now_s - options_.slo.window_s);
  // The model modes refresh the fit when they plan; for the others, every adjust interval.
  if (!models_steps_ && obs.now_s - last_fit_s_ >= options_.goodput.adjust_interval_s) {
    step_cost_.FitOfTheWindow();
    last_fit_s_ = obs.now_s;
  }
  const ControllerView view{options_, arrivals_, first_step_s_, time_unit_s_, num_seqs_, step_cost_};
  mode_->Observe(obs, view);
  if (held_) return num_seqs_;  // observed above, so the model is current when released
  Setter setter(*this);
  mode_->Decide(obs, view, setter);
  return num_seqs_;
}

double Controller::ArrivalRate(double now_s) const {
  return RateOverWindow(arrivals_, now_s, options_.load.rate_window_s, first_step_s_, time_unit_s_);
}

void Controller::Set(int32_t num_seqs, double now_s, bool hold) {
  const int32_t to = std::clamp(num_seqs, options_.min_num_seqs, options_.max_num_seqs);
  held_ = hold;
  Change(now_s, to, "admin", "Set(" + std::to_string(num_seqs) + (hold ? ", held)" : ")"));
  mode_->OnSet(now_s);
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
  s.level = ControllerModeName(options_.mode);
  s.arrival_rate_per_s = ArrivalRate(last_step_s_);
  s.num_changes = num_changes_;
  s.held = held_;
  mode_->Report(s);
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
