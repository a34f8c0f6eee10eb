// Model-based choice of max_num_seqs (the `goodput` controller mode): for
// every candidate cap, predict from a fitted step-time model and the measured
// workload how long a step takes, how many requests per second the batch
// completes, and whether the SLO lanes' TPOT holds; pick the cap with the most
// expected goodput. Pure arithmetic on what the caller measured: no clocks,
// no state.
//
// The model, for a cap C when the queue keeps it full, each request
// computing P prompt tokens (after the prefix cache) and O output tokens:
//   tokens per step   T(C) = min(C * (P + O) / O, B)   (B: the step's token
//                                   budget; past it prefills queue for it)
//   step time         s(C) = fixed + per_seq * C + per_token * T(C)
//   completions/s     mu(C) = T(C) / ((P + O) * s(C))
// Below saturation only n(C) = min(C, n*) sequences run, n* the batch at
// which mu(n*) meets the demand, except while requests wait (the scheduler
// fills every free seat from the queues) and when arrivals take every seat
// (Erlang C with n* busy of C): then C run, and a reply's TPOT is the full
// cap's. A request of the SLO lanes that generates o
// tokens decodes for o steps of d = fixed + (per_seq + per_token) * n(C)
// each, plus the prefill chunks that land meanwhile: requests start at
// lambda = min(demand, mu(C)) per second, each bringing P tokens in chunks
// of min(P, B), so over its life L = o * s(n(C)) the chunks that land are
// Poisson with mean lambda * L * P / chunk (with every seat taken, only the
// other C - 1 seats turn over: (C - 1) / C of it), and its TPOT is
// d + per_token * chunk * chunks / o. The share meeting the target averages
// that Poisson tail over the SLO lanes' recent output lengths: a short reply
// that one long prefill lands in misses, a long one averages it away.
// The SLO lanes are served first (they have priority), in arrival order, so
// their queue decides their TTFT: over a horizon H, with the queue q0 now,
// arrivals at lambda and completions at mu, it moves as q0 + (lambda - mu) t
// and a request meets the TTFT target T while the queue ahead of it is under
// mu * T (a queue already past that costs every request behind it, until it
// drains). A cap's goodput is
//   (SLO-lane arrivals in H that meet T + the queue's first min(q0, mu * T))
//     / H * share meeting the TPOT target
//   + min(demand_other, mu - SLO-lane completions)   (other lanes: throughput)
// The other lanes' demand is their arrival rate plus their queue drained
// over the caller's horizon for them.
//
// Regimes (PlanRegime): the cap with the most goodput is the choice only
// while some cap can serve a fair share of the SLO lanes' work in view
// within the targets (reach_share). Below that every cap fails most, and
// goodput is a contest of a handful: the cap that protects TPOT for a few
// (1 on the CPU engine, where every step above one sequence passes a 50 ms
// TPOT) serves the rest so slowly that the queue, and every later TTFT,
// grows without bound (issue #52: 5x less throughput than a fixed cap). The
// planner then clears the queue as fast as it can: the most completions.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "scheduler/cap/step_time_model.h"

namespace ferry::scheduler {

// What the planner optimises (PlannerChoice::regime).
enum class PlanRegime {
  kGoodput,      // the targets are within reach: the most expected goodput
  kUnreachable,  // no cap serves reach_share of the SLO lanes' work within the targets: the most completions
  kNoTargets,    // no targets were stated: the largest cap the bound allows, as a fixed cap (vLLM's)
};
// "goodput", "unreachable", "no-targets": the metric's label and the log's word.
const char* PlanRegimeName(PlanRegime regime);

struct PlannerInputs {
  StepFit step;                   // fitted step time
  double prompt_tokens = 0;       // P above: prompt tokens computed per request
  // One prompt as computed at its admission (after the prefix cache): the
  // size of its prefill, landing in chunks of min(this, B). P also counts
  // prompts computed again after a preemption, which add chunks, not size.
  // 0: P.
  double prompt_chunk_tokens = 0;
  double output_tokens = 1;       // O above: mean output tokens per completed request, >= 1
  double step_token_budget = 0;   // B above (max_num_batched_tokens); 0: unbounded
  double slo_rate_per_s = 0;      // SLO lanes: arrivals per second
  double slo_queue = 0;           // SLO lanes: requests waiting now
  // SLO lanes: requests waiting past their TTFT target, served after the
  // others (late_last); not in slo_queue. Work in view for reach_share.
  double slo_late_queue = 0;
  // SLO lanes: requests running now. Work in view for reach_share: a cap
  // below them stalls the rest (a closed loop of clients shows its demand
  // only here while every client is served: no queue, bursty arrivals).
  double slo_running = 0;
  double other_demand_per_s = 0;  // every other lane: arrivals/s plus their queue over a horizon
  double other_rate_per_s = 0;    // every other lane: arrivals per second
  // SLO lanes: arrivals per second over the other lanes' (longer) rate window.
  // What they take of the completions while the other lanes wait is the
  // lesser of this and slo_rate_per_s (GoodPerSecond). 0: slo_rate_per_s.
  double slo_rate_long_per_s = 0;
  // Requests waiting behind the SLO lanes' on-time queue: the other lanes'
  // and, served late last, the SLO lanes' late ones. The scheduler fills every
  // free seat from them, so while any wait the cap runs full.
  double waiting_behind = 0;
  double ttft_target_s = 1;       // T above
  double horizon_s = 5;           // H above
  // Output tokens of recent SLO-lane requests (the spread of reply lengths).
  // Empty: each generates output_tokens.
  std::vector<double> slo_output_tokens;
  double tpot_target_s = 0;
  int32_t min_num_seqs = 1;
  int32_t max_num_seqs = 1;  // candidates: min..max (already bounded by KV)
  // The only caps to choose from (load-level's levels), ascending; those
  // outside min..max are skipped. Empty: every cap in min..max.
  std::vector<int32_t> candidates;
  // The cap in force (0: none yet). The SLO-lane requests running under it
  // (by Little's law, their completions times their life) were admitted at
  // its TPOT; a cap that would run more and lower that share costs them too,
  // beyond the horizon's arrivals. Without it the planner alternated, every
  // 0.5 s, between a cap that holds TPOT and one that drains the batch lane
  // at no TPOT, forecast within 5% of each other: each short burst failed the
  // requests it overlapped, before as well as after (scheduler.md 7i, 7j).
  int32_t current_cap = 0;
  // A cap whose expected goodput is within this share of the best counts as
  // best; among those the choice prefers TPOT safety at full load.
  double tie_share = 0.02;
  // The previous choice drained (PlannerChoice::drains). Draining goes on
  // until a cap keeps every SLO-lane arrival of the horizon within the TTFT
  // target: back at a cap that holds TPOT while the queue regrows past the
  // target, the requests it admits lose their TPOT when the drain resumes.
  bool draining = false;
  // The scheduler serves SLO-lane requests already past the TTFT target after
  // the rest, and slo_queue counts only those still within it: a queue past
  // mu * T then costs the excess arrivals, not every one behind it (the queue
  // stays at mu * T and mu a second meet the target), so nothing drains.
  bool late_last = false;
  // The targets are within reach when some cap is expected to serve at least
  // this share of the SLO lanes' work in view (their arrivals over the
  // horizon, every request of theirs waiting now, late ones included, and
  // those running now, of which a cap keeps at most its seats, at its TPOT
  // share) within both targets, or when at least this share of their recent
  // completions met them (measured_good_share); else PlanRegime::kUnreachable
  // (was_unreachable: hysteresis). A quarter: the cases on either side are
  // the CPU engine at 1 s and 50 ms (forecast 0.10-0.30 of the work, ~0
  // measured: out of reach) and a closed loop at its TPOT knee that every
  // request meets (forecast down to 0.29 just after an exploration at the
  // largest cap, 0.3-0.5 measured); at a half that knee flapped into the
  // regime and stayed at 64 (CpuEngineTest.*). 0: always within reach
  // (goodput alone, as before issue #52). First come, first served only:
  // there the queue a small cap leaves behind makes every later request late
  // too, which the horizon does not see. Served late last, the on-time
  // requests still meet their targets ahead of that queue, and the late ones
  // wait for their queue timeout, the trade the operator made by stating the
  // lane's target: goodput stays the objective (on the held-out evaluation's
  // CPU-speed cells, where a cap of 1 is often the best static one, the
  // fallback cost goodput there: docs/benchmarks/scheduler.md section 8).
  double reach_share = 0.25;
  // The share of the SLO lanes' recent completions that met both targets
  // (negative: none yet; the forecast alone decides). The targets are out of reach only when this too is
  // under reach_share: the forecast alone, pessimistic at a TPOT knee and
  // just after a drain (arrivals measured at another cap), flapped a closed
  // loop that every request met at its knee between it and the most
  // completions (CpuEngineTest.ReachableTargetsKeepTheGoodputRegimeInAClosedLoop).
  double measured_good_share = -1;
  // The previous choice found the targets out of reach. Leaving that regime
  // takes both the forecast and the measured share at reach_share or more,
  // as entering it takes both under: one alone flips with the window
  // (a closed loop's cohorts, a knee's rounding) and the cap flapped
  // between a small cap and the most completions every 0.5 s.
  bool was_unreachable = false;
  // The share of the SLO lanes' recent completions whose TTFT met the target
  // (negative: none yet, taken as all). The requests running now count as
  // work served within the targets only in this share: one that started
  // late is not made good by a TPOT-safe cap (the CPU engine at 1 s and
  // 50 ms through the real stack: 16 clients at cap 6-9 met the TPOT and
  // none the TTFT, and the running ones held the regime in goodput).
  double ttft_good_share = -1;
  // The operator stated no TTFT or TPOT target: nothing to trade
  // throughput for, so the cap is the largest candidate (kNoTargets).
  bool has_targets = true;
};

struct CapForecast {
  int32_t cap = 0;
  double step_s = 0;             // at the batch that runs under this cap
  double full_step_s = 0;        // with the cap full
  double completions_per_s = 0;  // mu with the cap full
  double good_per_s = 0;
  double slo_good_per_s = 0;     // of which the SLO lanes' (within both targets)
  double tpot_share = 0;       // SLO-lane requests meeting the TPOT target, at the batch that runs
  double full_good_per_s = 0;  // goodput with the cap full (in a burst)
};

struct PlannerChoice {
  int32_t cap = 1;
  double best_good_per_s = 0;
  CapForecast chosen;
  bool drains = false;  // no cap meets the targets now: the most completions, whatever the TPOT
  PlanRegime regime = PlanRegime::kGoodput;
  std::string reason;  // with the numbers behind the choice, for the change log
};

// What one plan works in, kept from plan to plan by a caller that plans at
// every adjustment (the controller): the forecasts and the choice, whose
// reason string keeps its room, so that a plan allocates nothing once they
// have grown (issue #53).
struct PlanWorkspace {
  std::vector<CapForecast> forecasts;  // of every candidate cap, in candidate order
  PlannerChoice choice;
};

// Throws std::invalid_argument when min/max are out of order, an input is
// not finite, or no candidate lies in min..max. The choice is ws.choice, and
// ws.forecasts holds every candidate's forecast.
const PlannerChoice& PlanCap(const PlannerInputs& in, PlanWorkspace& ws);
// The same in a workspace of its own (tests, tools); forecasts for every
// candidate go to `forecasts` when given.
PlannerChoice PlanCap(const PlannerInputs& in, std::vector<CapForecast>* forecasts = nullptr);

}  // namespace ferry::scheduler
