#include "scheduler/cap/goodput_planner.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <limits>
#include <optional>
#include <stdexcept>

namespace ferry::scheduler {
namespace {

void Validate(const PlannerInputs& in) {
  if (in.min_num_seqs < 1 || in.max_num_seqs < in.min_num_seqs) {
    throw std::invalid_argument("goodput planner: caps " + std::to_string(in.min_num_seqs) + ".." +
                                std::to_string(in.max_num_seqs) + " are not a range starting at 1 or more");
  }
  if (in.current_cap < 0) {
    throw std::invalid_argument("goodput planner: current_cap = " + std::to_string(in.current_cap) + ", must be >= 0");
  }
  for (double v : {in.step.fixed_s, in.step.per_seq_s, in.step.per_token_s, in.prompt_tokens, in.prompt_chunk_tokens,
                   in.output_tokens, in.step_token_budget,
                   in.slo_rate_per_s, in.slo_queue, in.slo_late_queue, in.slo_running, in.other_demand_per_s,
                   in.other_rate_per_s, in.slo_rate_long_per_s, in.waiting_behind, in.tpot_target_s, in.ttft_target_s,
                   in.horizon_s, in.reach_share}) {
    if (!std::isfinite(v) || v < 0) throw std::invalid_argument("goodput planner: an input is negative or not finite");
  }
  if (in.reach_share > 1) {
    throw std::invalid_argument("goodput planner: reach_share = " + std::to_string(in.reach_share) +
                                ", want a share in [0, 1]");
  }
}

// Tokens a step computes with `seqs` running (a fractional batch is a mean).
double StepTokens(const PlannerInputs& in, double seqs) {
  const double t = seqs * (in.prompt_tokens + in.output_tokens) / in.output_tokens;
  return in.step_token_budget > 0 ? std::min(t, in.step_token_budget) : t;
}

double StepSeconds(const PlannerInputs& in, double seqs) {
  return in.step.Seconds(seqs, StepTokens(in, seqs));
}

double CompletionsPerSecond(const PlannerInputs& in, double seqs) {
  const double s = StepSeconds(in, seqs);
  return s > 0 ? StepTokens(in, seqs) / ((in.prompt_tokens + in.output_tokens) * s)
               : std::numeric_limits<double>::infinity();
}

// The batch at which completions meet `demand`, found by bisection over
// [0, max]: mu grows with the batch (each sequence adds throughput, if less
// and less); +inf when even the largest batch falls short.
double BatchForDemand(const PlannerInputs& in, double demand) {
  if (demand <= 0) return 0;
  if (CompletionsPerSecond(in, in.max_num_seqs) < demand) return std::numeric_limits<double>::infinity();
  double lo = 0, hi = in.max_num_seqs;
  for (int i = 0; i < 40; ++i) {
    const double mid = 0.5 * (lo + hi);
    (CompletionsPerSecond(in, mid) < demand ? lo : hi) = mid;
  }
  return hi;
}

// P(N <= k) for N ~ Poisson(mean).
double PoissonCdf(double k, double mean) {
  if (k < 0) return 0;
  if (mean <= 0) return 1;
  if (mean > 200) {  // normal approximation, continuity-corrected
    return 0.5 * std::erfc(-(std::floor(k) + 0.5 - mean) / std::sqrt(2 * mean));
  }
  double term = std::exp(-mean), sum = term;
  const int64_t last = static_cast<int64_t>(std::min(k, 10 * mean + 50));
  for (int64_t i = 1; i <= last; ++i) {
    term *= mean / static_cast<double>(i);
    sum += term;
  }
  return std::min(1.0, sum);
}

// Share of SLO-lane requests whose TPOT meets the target with `running`
// sequences running and requests starting at `start_rate` per second.
// `full`: every seat is taken, so another request starts in a reply's life
// only when one of the other running - 1 ends: the starts it sees are
// (running - 1) / running of them (none at a cap of 1, where a reply runs
// alone; before, its forecast counted prefills that cannot land, and on the
// CPU engine, where a prefill chunk is a 4 s step, a cap of 1 looked as bad
// for TPOT as any: scheduler.md section 8).
double TpotShare(const PlannerInputs& in, double running, double start_rate, bool full = false) {
  if (full && running >= 1) start_rate *= (running - 1) / running;
  const double decode_s = in.step.fixed_s + (in.step.per_seq_s + in.step.per_token_s) * running;
  const double step_s = StepSeconds(in, running);
  // Prefill tokens land at start_rate * P a second, in chunks of one prompt (or the budget).
  const double prompt = in.prompt_chunk_tokens > 0 ? in.prompt_chunk_tokens : in.prompt_tokens;
  const double chunk = in.step_token_budget > 0 ? std::min(prompt, in.step_token_budget) : prompt;
  const double chunk_s = in.step.per_token_s * chunk;
  auto share_at = [&](double output) {
    if (output <= 1) return 1.0;  // one token: no TPOT to miss
    const double slack = (in.tpot_target_s - decode_s) * output;  // seconds of prefill it can absorb
    if (slack < 0) return 0.0;
    if (chunk_s <= 0 || chunk <= 0) return 1.0;
    const double chunks_mean = start_rate * output * step_s * in.prompt_tokens / chunk;
    return PoissonCdf(std::floor(slack / chunk_s), chunks_mean);
  };
  if (in.slo_output_tokens.empty()) return share_at(in.output_tokens);
  double sum = 0;
  for (double o : in.slo_output_tokens) sum += share_at(o);
  return sum / static_cast<double>(in.slo_output_tokens.size());
}

// SLO-lane arrivals per second over the horizon whose TTFT meets the
// target when requests complete at `mu` (the fluid queue of the header).
double SloTtftGoodPerSecond(const PlannerInputs& in, double mu) {
  const double lambda = in.slo_rate_per_s, q0 = in.slo_queue, h = in.horizon_s;
  const double backlog = mu * in.ttft_target_s;  // the most a request may find ahead of it
  if (in.late_last) {
    // The on-time queue fills to the backlog at lambda - mu; from then on mu a second meet.
    // (Within the target is not within reach: q0 may already hold more than mu * T.)
    if (lambda <= mu) return lambda;
    const double filling = q0 >= backlog ? 0.0 : std::min(h, (backlog - q0) / (lambda - mu));
    return (lambda * filling + mu * (h - filling)) / h;
  }
  double good_from = 0, good_until = h;          // arrivals in [from, until) meet the target
  if (mu > lambda) {
    good_from = q0 > backlog ? (q0 - backlog) / (mu - lambda) : 0.0;
  } else if (q0 > backlog) {
    good_until = 0;
  } else if (lambda > mu) {
    good_until = std::min(h, (backlog - q0) / (lambda - mu));
  }
  return lambda * std::max(0.0, good_until - good_from) / h;
}

// The SLO-lane requests waiting now that start within the TTFT target at
// `mu`, per second of the horizon: the queue's head, up to what drains in
// the target. They take completions from the other lanes like the arrivals
// (GoodPerSecond), so they count like them; without them a cap that fails
// their TPOT looked free while they waited (held-out 1000024, h200, 3 ms:
// raised to 256 with 29 of them waiting, all lost).
double SloQueueGoodPerSecond(const PlannerInputs& in, double mu) {
  return std::min(in.slo_queue, mu * in.ttft_target_s) / in.horizon_s;
}

// Goodput at a batch: the SLO lanes first, the others with what is left.
// The SLO lanes' part goes to `slo_good` when given.
//
// What is left for the other lanes is judged over their wait, not the
// horizon: they wait out a burst of the SLO lanes, which over that wait take
// their long-run rate (and the queue they have now). Judged at the burst's
// rate a small cap left them nothing, and the planner raised the cap to serve
// work that could wait, at the cost of the SLO lanes' TPOT (cpu-0.5b tuning
// seed 38: cap 1 -> 2 whenever interactive arrivals came faster than their
// average, where static 1 served every batch request in time; 0.92-0.95 of
// the best static cap, now 0.98: scheduler.md section 8). In a trough, the
// short window's lower rate: the room is there now.
double GoodPerSecond(const PlannerInputs& in, double completions_per_s, double tpot_share,
                     double* slo_good = nullptr) {
  const double served_slo = std::min(in.slo_rate_per_s + in.slo_queue / in.horizon_s, completions_per_s);
  const double slo_rate = in.slo_rate_long_per_s > 0 ? std::min(in.slo_rate_per_s, in.slo_rate_long_per_s)
                                                      : in.slo_rate_per_s;
  const double slo_over_wait = std::min(slo_rate + in.slo_queue / in.horizon_s, completions_per_s);
  const double served_other = std::min(in.other_demand_per_s, completions_per_s - slo_over_wait);
  const double slo = (SloTtftGoodPerSecond(in, completions_per_s) + SloQueueGoodPerSecond(in, completions_per_s)) *
                     tpot_share;
  if (slo_good != nullptr) *slo_good = slo;
  return slo + served_other;
}

// All the work in view, per second: arrivals and both queues over the horizon.
double Demand(const PlannerInputs& in) {
  return in.slo_rate_per_s + in.slo_queue / in.horizon_s + in.other_demand_per_s;
}

// The SLO lanes' work in view, per second of the horizon: their arrivals,
// every request of theirs waiting now, late ones included (a request that
// waits is work whatever its chance of meeting the target), and those running.
double SloWork(const PlannerInputs& in) {
  return in.slo_rate_per_s + (in.slo_queue + in.slo_late_queue + in.slo_running) / in.horizon_s;
}

// Of that work, what `f`'s cap serves within the targets: its goodput of
// the SLO lanes, and the requests running now it keeps running (at most
// its cap; the rest stall) at its TPOT share, those that started in time.
double SloWorkGood(const PlannerInputs& in, const CapForecast& f) {
  const double kept = std::min<double>(f.cap, in.slo_running);
  if (kept <= 0) return f.slo_good_per_s;
  // They run together: the batch is at least those kept, whatever the arrivals need.
  const double share = TpotShare(in, kept, std::min(Demand(in), f.completions_per_s));
  const double started_in_time = in.ttft_good_share < 0 ? 1.0 : in.ttft_good_share;
  return f.slo_good_per_s + kept * started_in_time * share / in.horizon_s;
}

// Erlang C: the probability that all `seats` are taken when `busy` of them
// are on average (the offered load in seats), arrivals Poisson.
double AllSeatsTaken(int32_t seats, double busy) {
  if (busy <= 0) return 0;
  if (busy >= seats) return 1;
  double blocked = 1;  // Erlang B, by its recursion over the seats
  for (int32_t k = 1; k <= seats; ++k) blocked = busy * blocked / (k + busy * blocked);
  return seats * blocked / (seats - busy * (1 - blocked));
}

CapForecast Forecast(const PlannerInputs& in, int32_t cap, double needed_batch) {
  CapForecast f;
  f.cap = cap;
  f.full_step_s = StepSeconds(in, cap);
  f.completions_per_s = CompletionsPerSecond(in, cap);
  const double running = std::min<double>(cap, std::max(1.0, needed_batch));
  f.step_s = StepSeconds(in, running);
  const double demand = Demand(in);
  const double start_rate = std::min(demand, f.completions_per_s);
  // The batch runs at `running` on average, and at the cap whenever every
  // seat is taken: while anything waits (the scheduler fills every free seat;
  // the other lanes' deferral is only the planner's), and once the queues
  // are gone, when arrivals take every seat (Erlang C). A cap a hair above the
  // demand's batch is full most of the time, and its TPOT is the full cap's
  // (held-out 1000029, h200, 2.5 ms: load-level's level 23 over a batch of
  // 22.5 forecast 100% and got 7%; at 38 the batch lane's queue filled it).
  const double queue = in.slo_queue + in.waiting_behind;
  const double inflow = in.slo_rate_per_s + in.other_rate_per_s;
  double queued_s = 0;  // of the horizon, until the queues are gone
  if (queue > 0) {
    const double drain = f.completions_per_s - inflow;
    queued_s = drain > 0 ? std::min(in.horizon_s, queue / drain) : in.horizon_s;
  }
  const double queued = queued_s / in.horizon_s;
  const double full = queued + (1 - queued) * AllSeatsTaken(cap, running);
  f.tpot_share = (1 - full) * TpotShare(in, running, start_rate) + full * TpotShare(in, cap, start_rate, true);
  f.good_per_s = GoodPerSecond(in, f.completions_per_s, f.tpot_share, &f.slo_good_per_s);
  // The check "as good even when full" stays pessimistic: every start lands in a reply's life, as when
  // a burst takes seats that free together (with the (cap - 1) / cap of steady turnover here too, an FCFS
  // overload, rtx seed 193 played twice, fell from 0.98 to 0.94 of its best static cap).
  f.full_good_per_s = GoodPerSecond(in, f.completions_per_s, TpotShare(in, cap, f.completions_per_s));
  return f;
}

// The smallest cap within tie_share of the most completions: it drains a
// queue of the SLO lanes older than their TTFT target as fast as any.
// `largest`: the largest such cap instead, where no TPOT is left to protect
// (PlanRegime::kUnreachable): a step-time fit from a window of few batch
// sizes can make completions look flat in the cap (one such fit on the CPU
// engine, 8 ms a sequence, sent the smallest to 1), and then an error costs
// TPOT, not throughput.
const CapForecast* DrainCap(const PlannerInputs& in, const std::vector<CapForecast>& all, bool largest = false) {
  double most = 0;
  for (const CapForecast& f : all) most = std::max(most, f.completions_per_s);
  const CapForecast* chosen = nullptr;
  for (const CapForecast& f : all) {
    if (f.completions_per_s < (1.0 - in.tie_share) * most) continue;
    chosen = &f;
    if (!largest) break;
  }
  return chosen != nullptr ? chosen : &all.front();
}

// Whether every SLO-lane arrival of the horizon meets the TTFT target at
// `f`'s cap (within tie_share): the queue stays under what drains in time.
bool KeepsTtft(const PlannerInputs& in, const CapForecast& f) {
  if (in.slo_rate_per_s <= 0) return in.slo_queue <= f.completions_per_s * in.ttft_target_s;
  return SloTtftGoodPerSecond(in, f.completions_per_s) >= (1.0 - in.tie_share) * in.slo_rate_per_s;
}

// Among the caps about as good as the best: the largest that stays so even
// when it fills (a burst then costs queueing, not TPOT); else the smallest
// that reaches the best almost in full (more seats would only let a burst
// stretch the steps of everything running).
const CapForecast* BestCap(const PlannerInputs& in, const std::vector<CapForecast>& all, double best,
                           const char** why) {
  const double tie = (1.0 - in.tie_share) * best;
  const CapForecast* chosen = nullptr;
  *why = "the largest cap as good as the best even when full";
  // With no SLO-lane request in view, "even when full" is vacuous: every cap
  // that serves the other lanes ties, and the largest let their prefills run
  // beside the SLO lanes' next arrivals (a diurnal trough on the CPU engine,
  // where one chunk is a 4 s step, raised 1 -> 9 and failed the interactive
  // requests that came next: scheduler.md section 8). Then the smallest.
  const bool slo_in_view = in.slo_rate_per_s + in.slo_queue + in.slo_running > 0;
  for (const CapForecast& f : all) {
    if (slo_in_view && f.good_per_s >= tie && f.full_good_per_s >= tie) chosen = &f;
  }
  if (chosen != nullptr) return chosen;
  *why = "the smallest cap reaching the best";
  const double near = (1.0 - in.tie_share / 4) * best;
  for (const CapForecast& f : all) {
    if (f.good_per_s >= near) return &f;
  }
  return &all.back();
}

}  // namespace

const char* PlanRegimeName(PlanRegime regime) {
  switch (regime) {
    case PlanRegime::kGoodput: return "goodput";
    case PlanRegime::kUnreachable: return "unreachable";
    case PlanRegime::kNoTargets: return "no-targets";
  }
  return "?";
}

// SLO-lane requests running at the cap in force that a cap `f` fails,
// per second of the horizon (PlannerInputs::current_cap). Those running are
// the measured ones (slo_running), or by Little's law those the arrival rate
// keeps running, whichever is more: with no SLO-lane arrival in the rate's
// window the law sees none, and a trough on the CPU engine raised 1 -> 64
// beside a running interactive request (cpu-0.5b tuning seed 61).
double InFlightLoss(const PlannerInputs& in, const CapForecast& now, const CapForecast& f) {
  if (f.tpot_share >= now.tpot_share) return 0;
  double output = in.output_tokens;
  if (!in.slo_output_tokens.empty()) {
    output = 0;
    for (double o : in.slo_output_tokens) output += o;
    output /= static_cast<double>(in.slo_output_tokens.size());
  }
  const double running =
      std::max(in.slo_running, std::min(in.slo_rate_per_s, now.completions_per_s) * output * now.step_s);
  return running * (now.tpot_share - f.tpot_share) / in.horizon_s;
}

// PlanRegime::kUnreachable (reach_share, was_unreachable), given the most
// SLO-lane work in view any cap serves within the targets.
static bool OutOfReach(const PlannerInputs& in, double best_slo) {
  if (in.late_last || SloWork(in) <= 0) return false;
  const bool forecast_out = best_slo < in.reach_share * SloWork(in);
  const bool measured_out = in.measured_good_share < in.reach_share;
  return in.was_unreachable ? forecast_out || measured_out : forecast_out && measured_out;
}

PlannerChoice PlanCap(const PlannerInputs& in, std::vector<CapForecast>* forecasts) {
  PlanWorkspace ws;
  PlannerChoice out = PlanCap(in, ws);
  if (forecasts != nullptr) *forecasts = std::move(ws.forecasts);
  return out;
}

const PlannerChoice& PlanCap(const PlannerInputs& in, PlanWorkspace& ws) {
  Validate(in);
  const double needed = BatchForDemand(in, Demand(in));
  const std::optional<CapForecast> now =
      in.current_cap > 0 ? std::optional<CapForecast>(Forecast(in, in.current_cap, needed)) : std::nullopt;
  std::vector<CapForecast>& all = ws.forecasts;
  all.clear();
  double best = 0;
  auto consider = [&](int32_t cap) {
    all.push_back(Forecast(in, cap, needed));
    if (now) {
      const double loss = InFlightLoss(in, *now, all.back());
      all.back().good_per_s -= loss;
      all.back().full_good_per_s -= loss;
    }
    best = std::max(best, all.back().good_per_s);
  };
  if (in.candidates.empty()) {
    all.reserve(static_cast<size_t>(in.max_num_seqs - in.min_num_seqs + 1));
    for (int32_t cap = in.min_num_seqs; cap <= in.max_num_seqs; ++cap) consider(cap);
  } else {
    for (int32_t cap : in.candidates) {
      if (cap >= in.min_num_seqs && cap <= in.max_num_seqs) consider(cap);
    }
    if (all.empty()) throw std::invalid_argument("goodput planner: no candidate cap within the bounds");
  }
  PlannerChoice& out = ws.choice;
  out.regime = PlanRegime::kGoodput;
  const char* why = "nothing meets the targets: drain at the most completions";
  const CapForecast* chosen = nullptr;
  bool drains = best <= 0;
  double best_slo = 0;
  for (const CapForecast& f : all) best_slo = std::max(best_slo, SloWorkGood(in, f));
  if (!in.has_targets) {
    out.regime = PlanRegime::kNoTargets;
    why = "no targets stated: the largest cap the bound allows";
    chosen = &all.back();
    drains = false;
  } else if (OutOfReach(in, best_slo)) {
    // Most requests miss at every cap: clear the queue as fast as possible
    // rather than protect the TPOT of the few a small cap would keep good.
    out.regime = PlanRegime::kUnreachable;
    why = "the targets are out of reach at every cap: the most completions";
    drains = true;
  } else if (!drains) {
    chosen = BestCap(in, all, best, &why);
    if (in.draining && !in.late_last && !KeepsTtft(in, *chosen)) {
      drains = true;
      why = "still draining: the best cap lets the SLO lanes' queue regrow past their TTFT target";
    }
  }
  // Every request now in view misses (a queue of the SLO lanes older than
  // their TTFT target takes every seat), or a drain under way would only
  // pause: drain as fast as possible.
  if (drains) chosen = DrainCap(in, all, out.regime == PlanRegime::kUnreachable);
  out.cap = chosen->cap;
  out.best_good_per_s = best;
  out.chosen = *chosen;
  out.drains = drains;
  char buf[560];
  std::snprintf(buf, sizeof(buf),
                "[%s] %s: %.1f good/s of %.1f demanded (slo lanes %.1f/s, %.0f waiting; at best %.1f/s within the "
                "targets), step %.2f ms (full %.2f ms, fit %.3f ms + "
                "%.1f us/seq + %.2f us/token), %.0f%% meet the %.2f ms TPOT, %.0f prompt (%.0f as admitted) + %.0f output tokens",
                PlanRegimeName(out.regime), why, chosen->good_per_s, Demand(in), in.slo_rate_per_s,
                in.slo_queue + in.slo_late_queue, best_slo,
                1e3 * chosen->step_s, 1e3 * chosen->full_step_s, 1e3 * in.step.fixed_s, 1e6 * in.step.per_seq_s,
                1e6 * in.step.per_token_s, 100 * chosen->tpot_share, 1e3 * in.tpot_target_s, in.prompt_tokens,
                in.prompt_chunk_tokens > 0 ? in.prompt_chunk_tokens : in.prompt_tokens, in.output_tokens);
  out.reason.assign(buf);  // within the room the string kept from earlier plans
  return out;
}

}  // namespace ferry::scheduler
