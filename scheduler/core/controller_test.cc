#include "scheduler/core/controller.h"

#include <gtest/gtest.h>

#include <cstdio>
#include <stdexcept>
#include <utility>
#include <vector>

namespace ferry::scheduler {
namespace {

StepObservation Obs(double t, int32_t running, int32_t waiting, double kv = 0.1,
                    double step_s = 0.005, int32_t arrivals = 0, int32_t preemptions = 0) {
  StepObservation o;
  o.now_s = t;
  o.num_running = running;
  o.num_waiting = waiting;
  o.kv_usage = kv;
  o.last_step_s = step_s;
  o.last_step_tokens = running;
  o.num_arrivals = arrivals;
  o.num_preemptions = preemptions;
  return o;
}

ControllerOptions Options(ControllerMode mode) {
  ControllerOptions o;
  o.mode = mode;
  o.min_num_seqs = 2;
  o.max_num_seqs = 64;
  o.initial_num_seqs = 8;
  return o;
}

TEST(ControllerTest, StaticKeepsMaxUntilSet) {
  Controller c(Options(ControllerMode::kStatic));
  for (int i = 0; i < 100; ++i) EXPECT_EQ(c.Step(Obs(i * 0.1, 64, 500, 0.99, 1.0)), 64);
  c.Set(1000, 10.0);
  EXPECT_EQ(c.num_seqs(), 64);  // clamped, no change
  c.Set(1, 11.0);
  EXPECT_EQ(c.Step(Obs(12, 2, 0)), 2);  // clamped to min
  ASSERT_EQ(c.changes().size(), 1u);
  EXPECT_EQ(c.changes()[0].level, "admin");
  EXPECT_EQ(c.TakeChanges().size(), 1u);
  EXPECT_TRUE(c.TakeChanges().empty());
}

TEST(ControllerTest, RejectsBadOptions) {
  ControllerOptions o = Options(ControllerMode::kSlo);
  o.min_num_seqs = 0;
  EXPECT_THROW(Controller{o}, std::invalid_argument);
  o = Options(ControllerMode::kSlo);
  o.max_num_seqs = 1;
  EXPECT_THROW(Controller{o}, std::invalid_argument);
  o = Options(ControllerMode::kLoadLevel);
  o.load.levels = {{"a", 32}, {"b", 8}};  // unsorted
  EXPECT_THROW(Controller{o}, std::invalid_argument);
  EXPECT_THROW(ParseControllerMode("fast"), std::invalid_argument);
}

// A fluid replica for the model-based modes: requests of one lane arrive at
// `rate`, each generates 100 tokens, a step takes 2 ms + 0.1 ms per running
// sequence (decode only), so a 4 ms TPOT target holds up to 20 seats and 30
// requests/s need about 9.
struct Replica {
  double rate = 30;
  double now = 0, due = 0;
  int32_t waiting = 0;
  std::vector<int32_t> left;  // tokens still to generate, per running sequence
  std::vector<double> first_token;

  void Run(Controller& c, double until) {
    double last_step = 0;
    int32_t last_seqs = 0, arrivals = 0;
    while (now < until) {
      for (; due <= now; due += 1.0 / rate) ++waiting, ++arrivals;
      StepObservation o;
      o.now_s = now;
      o.num_running = static_cast<int32_t>(left.size());
      o.num_waiting = waiting;
      o.kv_usage = 0.1;
      o.last_step_s = last_step;
      o.last_step_tokens = o.last_step_seqs = last_seqs;
      o.num_arrivals = std::exchange(arrivals, 0);
      const int32_t cap = c.Step(o);
      while (static_cast<int32_t>(left.size()) < cap && waiting > 0) {
        left.push_back(100), first_token.push_back(-1), --waiting;
      }
      last_seqs = static_cast<int32_t>(left.size());
      last_step = 0.002 + 0.0001 * last_seqs;
      now += last_step;
      for (size_t i = left.size(); i-- > 0;) {
        if (first_token[i] < 0) first_token[i] = now;
        if (--left[i] > 0) continue;
        c.OnCompletion({now, 0.01, (now - first_token[i]) / 99, "default", 200, 100});
        left.erase(left.begin() + static_cast<ptrdiff_t>(i));
        first_token.erase(first_token.begin() + static_cast<ptrdiff_t>(i));
      }
    }
  }
};

ControllerOptions ModelOptions(ControllerMode mode) {
  ControllerOptions o = Options(mode);
  o.slo.tpot_target_s = 0.004;
  return o;
}

TEST(ControllerTest, GoodputSettlesOnTheLargestCapWhoseTpotHoldsWhenFull) {
  Controller c(ModelOptions(ControllerMode::kGoodput));
  Replica r;
  r.Run(c, 20);
  // 20 seats take exactly the 4 ms target (rounding may put it a hair over): 20 or 19.
  EXPECT_GE(c.num_seqs(), 19);
  EXPECT_LE(c.num_seqs(), 20);
  ASSERT_FALSE(c.changes().empty());
  EXPECT_NE(c.changes().back().reason.find("TPOT"), std::string::npos) << c.changes().back().reason;
  EXPECT_LE(c.changes().size(), 3u);  // no flapping at the bound
  // Idle: once the arrivals have left the rate window, no demand and no change.
  r.rate = 1e-9;
  r.Run(c, 30);
  const size_t changes = c.changes().size();
  r.Run(c, 60);
  EXPECT_EQ(c.changes().size(), changes);
}

TEST(ControllerTest, RefusesAnObservationThatBreaksItsInvariants) {
  Controller c(ModelOptions(ControllerMode::kGoodput));
  StepObservation o = Obs(1, 4, 2);
  o.last_step_seqs = 4;
  o.num_arrivals = 1, o.num_arrivals_slo = 2;
  EXPECT_THROW(c.Step(o), std::invalid_argument);
  o.num_arrivals_slo = 1, o.num_waiting_slo = 3;
  EXPECT_THROW(c.Step(o), std::invalid_argument);
  o.num_waiting_slo = 1, o.last_step_tokens = 3;  // fewer tokens than sequences
  EXPECT_THROW(c.Step(o), std::invalid_argument);
  o.last_step_tokens = 4, o.last_step_seqs = 0;  // the model needs the step's batch
  EXPECT_THROW(c.Step(o), std::invalid_argument);
  o.last_step_seqs = 4;
  EXPECT_NO_THROW(c.Step(o));
}

TEST(ControllerTest, LoadLevelTakesOnlyItsLevelsChosenByTheModel) {
  Controller c(ModelOptions(ControllerMode::kLoadLevel));
  std::string names;
  for (const LoadLevel& l : c.options().load.levels) names += l.name + " ";
  EXPECT_EQ(names, "seqs-2 seqs-3 seqs-4 seqs-5 seqs-6 seqs-7 seqs-8 seqs-10 seqs-11 seqs-13 seqs-16 seqs-19 seqs-23 "
                   "seqs-27 seqs-32 seqs-38 seqs-45 seqs-54 seqs-64 ");
  EXPECT_EQ(c.num_seqs(), 16);  // the level nearest a quarter of the bound, until the model has data
  Replica r;
  r.Run(c, 20);
  EXPECT_EQ(c.num_seqs(), 19);  // the largest level within the 20 seats that hold the TPOT
  EXPECT_EQ(c.status().level, "seqs-19");
  for (const CapChange& ch : c.changes()) EXPECT_EQ(ch.level, "seqs-" + std::to_string(ch.to));
}

TEST(ControllerTest, SloRaisesWhileWorkWaitsBehindAFullCap) {
  Controller c(Options(ControllerMode::kSlo));
  EXPECT_EQ(c.num_seqs(), 8);
  double t = 0;
  for (int i = 0; i < 3000 && c.num_seqs() < 64; ++i, t += 0.01) c.Step(Obs(t, c.num_seqs(), 4));
  EXPECT_EQ(c.num_seqs(), 64);
  EXPECT_EQ(c.changes().front().level, "raise");
  // Seats free: no raise needed.
  Controller d(Options(ControllerMode::kSlo));
  for (int i = 0; i < 100; ++i) d.Step(Obs(i * 0.1, 3, 0));
  EXPECT_EQ(d.num_seqs(), 8);
}

// Feeds `n` steps of `step_s` from `t` (the controller judges a cap only
// after 16 steps under it); the first reports `preemptions`. Returns the time
// after them.
double Feed(Controller& c, double t, int n, int32_t running, int32_t waiting, double kv,
            double step_s, int32_t preemptions = 0) {
  for (int i = 0; i < n; ++i, t += step_s) {
    c.Step(Obs(t, running, waiting, kv, step_s, 0, i == 0 ? preemptions : 0));
  }
  return t;
}

TEST(ControllerTest, SloCutsOnTpotViolationAndKvPressure) {
  ControllerOptions o = Options(ControllerMode::kSlo);
  o.initial_num_seqs = 32;
  Controller c(o);
  // Steps of 80 ms > 50 ms target: 32 * 50 / 80 = 20 seats would meet it, but
  // one cut goes no lower than 0.75 * 32.
  double t = Feed(c, 0, 16, 32, 10, 0.5, 0.080);
  EXPECT_EQ(c.num_seqs(), 24);
  EXPECT_NE(c.changes().back().reason.find("tpot"), std::string::npos);
  t = Feed(c, t, 60, 24, 10, 0.5, 0.010, 3);  // preemptions: a gentle step down, 24 - 24/8
  EXPECT_EQ(c.num_seqs(), 21);
  EXPECT_NE(c.changes().back().reason.find("kv pressure"), std::string::npos);
  // Within the adjust interval (and before 16 steps under the new cap) nothing changes.
  t = Feed(c, t, 5, 21, 10, 0.99, 0.01);
  EXPECT_EQ(c.num_seqs(), 21);
  // Never below min.
  for (int i = 0; i < 50; ++i) t = Feed(c, t, 16, c.num_seqs(), 10, 0.99, 0.05);
  EXPECT_EQ(c.num_seqs(), 2);
}

// Raises stop at the sequences the pool holds at the mean KV a running
// sequence holds, from recent completions (every lane): its prompt and half
// its output, weighted by its output (the steps it runs); the final context
// when the output is not reported. Seats beyond it only buy preemptions.
TEST(ControllerTest, SloRaisesOnlyUpToWhatTheKvPoolHolds) {
  ControllerOptions o = Options(ControllerMode::kSlo);
  o.max_num_seqs = 256;
  o.initial_num_seqs = 8;
  o.slo.min_samples = 5;
  o.slo.lanes = {"interactive"};
  Controller c(o);
  // 1,000-token requests in a 20,000-token pool: 0.85 * 20 = 17 fit.
  for (int i = 0; i < 10; ++i) c.OnCompletion({0.01 * i, 0.1, 0.005, "batch", 1000});
  for (int i = 0; i < 3000; ++i) {
    StepObservation obs = Obs(0.05 * (i + 1), c.num_seqs(), 500, 0.5);
    obs.kv_capacity_tokens = 20000;
    if (i % 10 == 0) c.OnCompletion({obs.now_s, 0.1, 0.005, "batch", 1000});
    c.Step(obs);
  }
  EXPECT_EQ(c.num_seqs(), 17);
  // Half of them 400 tokens of output, half 50: held on average
  // (400 * 800 + 50 * 975) / 450 = 819.4 tokens, 0.85 * 20,000 / 819.4 = 20.7.
  Controller e(o);
  for (int i = 0; i < 3000; ++i) {
    StepObservation obs = Obs(0.05 * (i + 1), e.num_seqs(), 500, 0.5);
    obs.kv_capacity_tokens = 20000;
    if (i % 10 == 0) e.OnCompletion({obs.now_s, 0.1, 0.005, "batch", 1000, i % 20 == 0 ? 400 : 50});
    e.Step(obs);
  }
  EXPECT_EQ(e.num_seqs(), 20);
  // Without a pool size the same queue raises to the maximum.
  Controller d(o);
  for (int i = 0; i < 3000; ++i) d.Step(Obs(0.05 * (i + 1), d.num_seqs(), 500, 0.5));
  EXPECT_EQ(d.num_seqs(), 256);
}

// With prefix caching a preempted sequence resumes from its cached blocks:
// raises go up to what the whole pool holds at the KV the running sequences
// hold now (here 600 tokens each: a shared prefix and half an answer, against
// 1,000-token final contexts), a full pool alone cuts nothing, and a
// preemption still does.
TEST(ControllerTest, SloWithPrefixCachingFillsThePool) {
  ControllerOptions o = Options(ControllerMode::kSlo);
  o.max_num_seqs = 256;
  o.slo.min_samples = 5;
  auto run = [&](bool cached, int32_t steps, Controller& c, double t0) {
    for (int i = 0; i < 10; ++i) c.OnCompletion({t0 + 0.01 * i, 0.1, 0.005, "batch", 1000});
    for (int i = 0; i < steps; ++i) {
      const double now = t0 + 0.05 * (i + 1);
      StepObservation obs = Obs(now, c.num_seqs(), 500, c.num_seqs() * 600.0 / 20000);
      obs.kv_capacity_tokens = 20000;
      obs.resumes_from_cache = cached;
      if (i % 10 == 0) c.OnCompletion({now, 0.1, 0.005, "batch", 1000});
      c.Step(obs);
    }
    return t0 + 0.05 * steps;
  };
  Controller cached(o);
  const double t = run(true, 3000, cached, 0);
  EXPECT_EQ(cached.num_seqs(), 33);  // 20,000 / 600, usage 0.99
  Controller uncached(o);
  run(false, 3000, uncached, 0);
  EXPECT_LE(uncached.num_seqs(), 17);  // 0.85 * 20,000 / 1,000, below usage 0.85
  // A preemption is still pressure: one step down by cap / 8.
  StepObservation obs = Obs(t + 1, 33, 500, 0.99, 0.005, 0, 2);
  obs.kv_capacity_tokens = 20000;
  obs.resumes_from_cache = true;
  for (int i = 0; i < 20 && cached.num_seqs() == 33; ++i, obs.now_s += 0.05) cached.Step(obs);
  EXPECT_EQ(cached.num_seqs(), 29);
  EXPECT_NE(cached.changes().back().reason.find("kv pressure"), std::string::npos);
}

TEST(ControllerTest, SloUsesCompletionsOfItsLanesOnly) {
  ControllerOptions o = Options(ControllerMode::kSlo);
  o.slo.lanes = {"interactive"};
  o.slo.min_samples = 5;
  o.initial_num_seqs = 32;
  Controller c(o);
  for (int i = 0; i < 10; ++i) c.OnCompletion({0.1 * i, 0.2, 0.500, "batch"});
  Feed(c, 1, 16, 32, 5, 0.5, 0.005);
  EXPECT_GT(c.num_seqs(), 32);  // batch TPOT does not count: raised
  for (int i = 0; i < 10; ++i) c.OnCompletion({1.1 + 0.1 * i, 0.2, 0.080, "interactive"});
  const int32_t before = c.num_seqs();
  Feed(c, 3, 16, before, 5, 0.5, 0.005);
  EXPECT_LT(c.num_seqs(), before);
  EXPECT_NEAR(c.status().tpot_p_s, 0.080, 1e-12);
  // The completions that caused the cut do not count against the new cap.
  const int32_t after = c.num_seqs();
  Feed(c, 100, 16, after, 0, 0.5, 0.005);
  EXPECT_EQ(c.num_seqs(), after);
}

// A step that carries a long prefill chunk is many decode steps long, yet
// adds one token's delay to each running request: the mean of the latest
// steps, not their percentile, is what per-request TPOT follows.
TEST(ControllerTest, SloDoesNotCutForOneLongPrefillStep) {
  ControllerOptions o = Options(ControllerMode::kSlo);
  o.initial_num_seqs = 16;
  o.slo.tpot_target_s = 0.005;
  Controller c(o);
  // 63 decode steps of 3 ms and one 13 ms prefill step in every 64: p95 of
  // steps is 13 ms, their mean 3.2 ms.
  for (int i = 0; i < 640; ++i) c.Step(Obs(0.004 * i, 16, 0, 0.1, i % 64 == 63 ? 0.013 : 0.003));
  EXPECT_TRUE(c.changes().empty()) << c.changes().front().reason;
  // A batch whose steps average 6 ms (0.375 ms a sequence) is cut to the
  // seats that meet 5 ms, 13, and holds there.
  for (int i = 0; i < 2000; ++i) {
    const int32_t cap = c.num_seqs();
    c.Step(Obs(3 + 0.006 * i, cap, 0, 0.1, 0.000375 * cap));
  }
  ASSERT_FALSE(c.changes().empty());
  EXPECT_EQ(c.changes().front().level, "cut");
  EXPECT_EQ(c.num_seqs(), 13);
}

// A raise never takes the predicted step time past the TPOT target: step
// time grows at most in proportion to the batch.
TEST(ControllerTest, SloRaisesOnlyUpToTheTpotTarget) {
  ControllerOptions o = Options(ControllerMode::kSlo);
  o.initial_num_seqs = 20;
  o.slo.tpot_target_s = 0.005;
  Controller c(o);
  // 20 running at 3 ms a step, a deep queue: the aim 0.85 * 5 ms allows
  // 20 * 4.25 / 3 = 28 seats, though the deep queue asks for +10.
  Feed(c, 0, 16, 20, 100, 0.1, 0.003);
  EXPECT_EQ(c.num_seqs(), 28);
  // At 4.5 ms a step (above the aim, below the target) it holds.
  for (int i = 0; i < 600; ++i) c.Step(Obs(1 + 0.0045 * i, 28, 100, 0.1, 0.0045));
  EXPECT_EQ(c.num_seqs(), 28);
  EXPECT_EQ(c.changes().size(), 1u);
}

// slo from 20 seats, a 5 ms TPOT target, percentiles from 5 completions.
ControllerOptions BacklogOptions() {
  ControllerOptions o = Options(ControllerMode::kSlo);
  o.initial_num_seqs = 20;
  o.slo.min_samples = 5;
  o.slo.tpot_target_s = 0.005;
  return o;
}

// Drives a controller through steps of `step_s` at `rate_per_s` arrivals, a
// completion every 4 steps, a full cap and `waiting` requests of which the
// oldest has waited `oldest_s`.
struct Timeline {
  Controller& c;
  double t = 0;
  double due = 0;  // arrivals owed
  void Run(double until_s, int32_t waiting, double oldest_s, double step_s, double rate_per_s,
           double ttft_s, double tpot_s) {
    for (int i = 0; t < until_s; ++i, t += step_s) {
      due += rate_per_s * step_s;
      const auto arrivals = static_cast<int32_t>(due);
      due -= arrivals;
      if (i % 4 == 0) c.OnCompletion({t, ttft_s, tpot_s, "interactive"});
      StepObservation o = Obs(t, c.num_seqs(), waiting, 0.1, step_s, arrivals);
      o.oldest_wait_s = oldest_s;
      c.Step(o);
    }
  }
};

// While the queue builds (its oldest request has waited past half the TTFT
// target), raises aim at 0.95 of the TPOT target instead of 0.85: a queue
// that keeps building costs TTFT misses, the headroom only margin.
TEST(ControllerTest, SloRaisesToTheTpotTargetWhileTheQueueBuilds) {
  Controller c(BacklogOptions());
  Timeline run{c};
  // 20 running at 4.4 ms a step (above 0.85 * 5 ms), TPOT p95 4.5 ms: no
  // raise while the oldest request has waited 0.2 s.
  run.Run(2, 30, 0.2, 0.0044, 100, 0.3, 0.0045);
  EXPECT_EQ(c.num_seqs(), 20);
  // It has waited 0.6 s: up to 20 * 4.75 / 4.4 = 21 seats (one adjustment).
  run.Run(2.4, 30, 0.6, 0.0044, 100, 0.3, 0.0045);
  EXPECT_EQ(c.num_seqs(), 21);
  // At 4.8 ms a step (past the queue's aim, within the target) it holds.
  run.Run(4, 30, 0.6, 0.0048, 100, 0.3, 0.0048);
  EXPECT_EQ(c.num_seqs(), 21);
  ASSERT_EQ(c.changes().size(), 1u);
  EXPECT_NE(c.changes()[0].reason.find("oldest waited 600 ms"), std::string::npos)
      << c.changes()[0].reason;
}

// When the cap that holds the TPOT target does not keep up with the
// arrivals, requests miss TTFT in a growing queue: slo raises past the TPOT
// limit to keep up, and later TPOT cuts stop one seat above the cap where the
// queue grew (not above the raises that followed it), until the arrival rate
// falls.
TEST(ControllerTest, SloKeepsUpWithABacklogBeforeItsTpotTarget) {
  Controller c(BacklogOptions());
  Timeline run{c};
  // 20 running at 4.9 ms a step, above even the queue's aim (0.95 * 5 ms).
  // 30 wait, the oldest for 1.5 s (target 1 s): a backlog, and a deep queue
  // (30 > 20): a quarter more, at each of two adjustments. (After 2 s
  // without a queue, so the arrival rate is known.)
  run.Run(2, 0, 0, 0.0049, 100, 0.3, 0.0049);
  ASSERT_TRUE(c.changes().empty());
  run.Run(2.6, 30, 1.5, 0.0049, 100, 2.0, 0.0049);
  ASSERT_EQ(c.changes().size(), 2u);
  EXPECT_NE(c.changes()[0].reason.find("backlog"), std::string::npos) << c.changes()[0].reason;
  EXPECT_EQ(c.num_seqs(), 31);
  // The queue drains, and the larger batch runs over the target (6 ms): the
  // cut stops at 21, one above where the queue grew, not at 26.
  run.Run(20, 0, 0, 0.006, 100, 0.1, 0.006);
  EXPECT_EQ(c.num_seqs(), 21);
  // Arrivals halve: the floor follows them down, and TPOT cuts resume.
  run.Run(40, 0, 0, 0.006, 50, 0.1, 0.006);
  EXPECT_LT(c.num_seqs(), 21);
  EXPECT_EQ(c.changes().back().level, "cut");
}

// A TPOT cut goes at most to decrease_factor of the cap, even when few
// sequences run: between two bursts one may run alone, and the TPOT
// percentile of the burst before would cut the cap to 1.
TEST(ControllerTest, SloCutsFromTheCapNotFromTheBatchBetweenBursts) {
  ControllerOptions o = BacklogOptions();
  o.initial_num_seqs = 16;
  Controller c(o);
  for (int i = 0; i < 10; ++i) c.OnCompletion({0.01 * i, 0.1, 0.008, "interactive"});
  Feed(c, 0.1, 16, 1, 0, 0.1, 0.001);  // one sequence at 1 ms a step
  EXPECT_EQ(c.num_seqs(), 12);
}

// An operator's Set replaces the floor a backlog left: TPOT cuts go below it.
TEST(ControllerTest, SloSetClearsTheKeepUpFloor) {
  Controller c(BacklogOptions());
  Timeline run{c};
  run.Run(0.1, 30, 1.5, 0.0049, 1, 2.0, 0.0049);
  ASSERT_EQ(c.num_seqs(), 25);  // the backlog raise; floor 21
  c.Set(24, run.t);
  run.Run(10, 0, 0, 0.006, 1, 0.1, 0.006);
  EXPECT_LT(c.num_seqs(), 21);
}

// After a cut, completions of requests that ran under the old cap do not
// cut again: only completions after a change count.
TEST(ControllerTest, SloJudgesANewCapOnlyByCompletionsAfterIt) {
  ControllerOptions o = Options(ControllerMode::kSlo);
  o.initial_num_seqs = 32;
  o.slo.min_samples = 5;
  o.slo.tpot_target_s = 0.005;
  Controller c(o);
  for (int i = 0; i < 10; ++i) c.OnCompletion({0.01 * i, 0.1, 0.008, "interactive"});
  double t = Feed(c, 1, 16, 32, 10, 0.1, 0.003);
  EXPECT_EQ(c.num_seqs(), 24);  // cut once for TPOT p95 8 ms (no lower than 0.75 * 32)
  t = Feed(c, t, 400, 24, 0, 0.1, 0.003);
  EXPECT_EQ(c.num_seqs(), 24);
  EXPECT_EQ(c.status().tpot_p_s, 0.0);  // no completions since the cut
  for (int i = 0; i < 10; ++i) c.OnCompletion({t + 0.01 * i, 0.1, 0.008, "interactive"});
  Feed(c, t + 0.1, 200, 24, 10, 0.1, 0.003);
  EXPECT_EQ(c.num_seqs(), 18);  // fresh evidence: cut again
}

}  // namespace
}  // namespace ferry::scheduler
