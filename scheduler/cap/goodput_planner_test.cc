#include "scheduler/cap/goodput_planner.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <stdexcept>

namespace ferry::scheduler {
namespace {

// Pure decode (no prompt to compute): 2 ms fixed + 0.1 ms per sequence.
PlannerInputs DecodeOnly() {
  PlannerInputs in;
  in.step = StepFit{0.002, 0.0001, 0};
  in.prompt_tokens = 0;
  in.output_tokens = 100;
  in.tpot_target_s = 0.004;  // holds up to 20 sequences
  in.min_num_seqs = 1;
  in.max_num_seqs = 64;
  return in;
}

TEST(GoodputPlannerTest, KeepsTheLargestCapWhoseTpotHoldsWhenFull) {
  PlannerInputs in = DecodeOnly();
  in.slo_rate_per_s = 20;  // needs ~4.4 sequences at 2.44 ms a step
  std::vector<CapForecast> f;
  const PlannerChoice c = PlanCap(in, &f);
  EXPECT_EQ(c.cap, 20) << c.reason;
  EXPECT_LE(c.chosen.full_step_s, in.tpot_target_s);
  EXPECT_GT(f[20].full_step_s, in.tpot_target_s);  // f[i] is cap i + 1
  EXPECT_DOUBLE_EQ(c.best_good_per_s, 20);
}

TEST(GoodputPlannerTest, ServesTheOtherLanesWhenTheTpotTargetCannotHold) {
  PlannerInputs in = DecodeOnly();
  in.tpot_target_s = 0.0015;  // below the fixed 2 ms: no SLO-lane request can meet it
  in.output_tokens = 10;
  in.slo_rate_per_s = 10;
  in.other_demand_per_s = 200;
  const PlannerChoice c = PlanCap(in);
  // Every seat is throughput now: the cap keeps up with all the demand.
  EXPECT_GE(c.chosen.completions_per_s, 0.98 * 210) << c.reason;
  EXPECT_NEAR(c.best_good_per_s, 200, 1e-9);
}

TEST(GoodputPlannerTest, TradesTheSloLanesForThroughputOnlyWhenItPays) {
  PlannerInputs in = DecodeOnly();
  // 20 seats (the TPOT bound) complete 20 / (100 * 4 ms) = 50 requests/s.
  in.slo_rate_per_s = 40;
  in.other_demand_per_s = 20;  // 10 more than 20 seats serve: not worth 40 missed
  EXPECT_EQ(PlanCap(in).cap, 20);
  in.slo_rate_per_s = 5;
  in.other_demand_per_s = 60;  // serving these needs ~37 seats: worth the 5
  const PlannerChoice c = PlanCap(in);
  EXPECT_GE(c.cap, 37) << c.reason;
  EXPECT_GE(c.chosen.completions_per_s, 0.98 * 65);
  EXPECT_NEAR(c.best_good_per_s, 60, 1e-9);
}

TEST(GoodputPlannerTest, TheOtherLanesWaitOutABurstOfTheSloLanes) {
  PlannerInputs in = DecodeOnly();
  // 20 seats (the TPOT bound) complete 50 requests/s. A burst of the SLO
  // lanes at 40/s, whose rate over the other lanes' window is 10/s: over
  // their wait those leave 40/s of the 50 to the other lanes, not 10.
  in.slo_rate_per_s = 40;
  in.slo_rate_long_per_s = 10;
  in.other_demand_per_s = 30;
  std::vector<CapForecast> f;
  PlanCap(in, &f);
  EXPECT_NEAR(f[19].good_per_s, 40 + 30, 1e-9);  // f[i] is cap i + 1
  EXPECT_NEAR(f[19].slo_good_per_s, 40, 1e-9);
  // Without the long window (or in a trough, the lesser rate), the burst's
  // rate: what it leaves now.
  in.slo_rate_long_per_s = 0;
  PlanCap(in, &f);
  EXPECT_NEAR(f[19].good_per_s, 40 + 10, 1e-9);
  in.slo_rate_long_per_s = 60;
  PlanCap(in, &f);
  EXPECT_NEAR(f[19].good_per_s, 40 + 10, 1e-9);
}

TEST(GoodputPlannerTest, ShortRepliesMissWhenLongPrefillsLandInThem) {
  PlannerInputs in = DecodeOnly();
  in.step = StepFit{0.001, 0.00005, 0.000005};  // 5 us per computed token
  in.prompt_tokens = 2000;                       // a 10 ms chunk each
  in.step_token_budget = 2048;
  in.tpot_target_s = 0.003;
  in.slo_rate_per_s = 50;
  auto share_at_cap_8 = [&](double output) {
    in.slo_output_tokens = {output};
    std::vector<CapForecast> f;
    PlanCap(in, &f);
    return f[7].tpot_share;
  };
  // A 10-token reply can absorb one 10 ms chunk within its 3 ms x 10 budget:
  // a second one landing in its life (0.8 expected) breaks it. A 1,000-token
  // reply averages the chunks away; a one-token reply has no TPOT.
  const double short_reply = share_at_cap_8(10);
  EXPECT_GT(short_reply, 0.6);
  EXPECT_LT(short_reply, 0.95);
  EXPECT_GT(share_at_cap_8(1000), 0.99);
  EXPECT_DOUBLE_EQ(share_at_cap_8(1), 1.0);
}

TEST(GoodputPlannerTest, DrainsAtTheMostCompletionsWhenNothingCanMeetTheTargets) {
  PlannerInputs in = DecodeOnly();
  in.tpot_target_s = 0.001;  // nothing meets it
  in.slo_rate_per_s = 1000;
  std::vector<CapForecast> f;
  const PlannerChoice c = PlanCap(in, &f);
  EXPECT_EQ(c.best_good_per_s, 0);
  EXPECT_TRUE(c.drains);
  EXPECT_GE(c.chosen.completions_per_s, 0.98 * f.back().completions_per_s) << c.reason;
}

TEST(GoodputPlannerTest, KeepsDrainingWhileTheQueueWouldRegrowPastTheTtftTarget) {
  PlannerInputs in = DecodeOnly();
  in.ttft_target_s = 1;
  // Cap 20 holds TPOT and completes 50/s, under the 60/s arriving: 20 waiting
  // reach the 50 that drain in a second after 3 s, so 3 of the horizon's 5 s
  // of arrivals meet TTFT there, and no larger cap meets TPOT. The 20 waiting
  // meet it too: (60 * 3 + 20) / 5 = 40 a second.
  in.slo_rate_per_s = 60;
  in.slo_queue = 20;
  const PlannerChoice fresh = PlanCap(in);
  EXPECT_EQ(fresh.cap, 20) << fresh.reason;
  EXPECT_FALSE(fresh.drains);
  EXPECT_NEAR(fresh.best_good_per_s, 40, 1e-9);
  // After a drain the same cap would admit requests whose TPOT the next
  // drain (in 3 s) breaks: draining goes on at the most completions.
  in.draining = true;
  std::vector<CapForecast> f;
  const PlannerChoice still = PlanCap(in, &f);
  EXPECT_TRUE(still.drains) << still.reason;
  EXPECT_GE(still.chosen.completions_per_s, 0.98 * f.back().completions_per_s) << still.reason;
  // Once cap 20 keeps up (45/s arriving) with the queue drained, it ends.
  in.slo_rate_per_s = 45;
  in.slo_queue = 0;
  const PlannerChoice done = PlanCap(in);
  EXPECT_FALSE(done.drains) << done.reason;
  EXPECT_EQ(done.cap, 20) << done.reason;
}

TEST(GoodputPlannerTest, ServedLateLastAnOverloadKeepsTheCapThatHoldsTpot) {
  PlannerInputs in = DecodeOnly();
  in.ttft_target_s = 1;
  in.late_last = true;
  // As above, 60/s arriving at a cap that completes 50/s, 20 on time waiting. Late requests go
  // to the back: the on-time queue fills to the 50 that drain in a second after 3 s, and then
  // 50 of the 60 arriving each second still meet TTFT, and so do the 20 waiting:
  // (60 * 3 + 50 * 2 + 20) / 5 = 60 a second.
  in.slo_rate_per_s = 60;
  in.slo_queue = 20;
  in.draining = true;  // nothing to drain: the queue in front never outgrows the target
  const PlannerChoice c = PlanCap(in);
  EXPECT_EQ(c.cap, 20) << c.reason;
  EXPECT_FALSE(c.drains) << c.reason;
  EXPECT_NEAR(c.best_good_per_s, 60, 1e-9);
  // An on-time queue already past what drains in time: its first 50 meet, and 50 a second of
  // the arrivals: (50 + 50 * 5) / 5 = 60.
  in.slo_queue = 80;
  EXPECT_NEAR(PlanCap(in).best_good_per_s, 60, 1e-9);
}

TEST(GoodputPlannerTest, TheSloLanesWaitingRequestsCountAgainstACapThatFailsThem) {
  PlannerInputs in = DecodeOnly();
  in.output_tokens = 1000;  // 20 seats complete 20 / (1000 * 4 ms) = 5 a second
  in.horizon_s = 1;
  in.ttft_target_s = 1;
  in.late_last = true;
  in.other_demand_per_s = 6;
  in.slo_queue = 3;  // no more arriving (a burst's tail)
  // At 20 seats the 3 waiting start within the target and hold TPOT, and the other lanes get the
  // 2 completions left: 5 a second. 64 seats complete 64 / (1000 * 8.4 ms) = 7.6 a second, 4.6
  // of them the other lanes', and fail the 3 (TPOT). Counting only arrivals, the 3 took seats
  // at 20 for nothing and 64 won, 4.6 to 2.
  std::vector<CapForecast> f;
  const PlannerChoice c = PlanCap(in, &f);
  EXPECT_EQ(c.cap, 20) << c.reason;
  EXPECT_NEAR(c.best_good_per_s, 5, 1e-9);
  EXPECT_NEAR(f.back().good_per_s, 64 / 8.4 - 3, 1e-9);
  // A queue larger than what drains within the target: only its head counts (5 of 8).
  in.slo_queue = 8;
  EXPECT_NEAR(PlanCap(in, &f).best_good_per_s, 5, 1e-9);
  EXPECT_NEAR(f[19].good_per_s, 5, 1e-9);  // cap 20: 5 on time, nothing left for the others
}

TEST(GoodputPlannerTest, ACapRunsFullWhileRequestsWaitAndWhenArrivalsTakeEverySeat) {
  PlannerInputs in = DecodeOnly();  // TPOT holds up to 20 seats
  in.slo_rate_per_s = 19 / 0.39;    // 19 seats at 3.9 ms a step complete this
  std::vector<CapForecast> f;
  PlanCap(in, &f);
  // Nothing waits: 19 seats are busy on average. At 64 seats the 64 are
  // almost never all taken; at 21 they often are (Erlang C), and then each
  // step takes 4.1 ms, over the target.
  EXPECT_GT(f[63].tpot_share, 0.99);
  EXPECT_LT(f[20].tpot_share, 0.7);
  EXPECT_GT(f[20].tpot_share, 0.1);
  // 100 requests of the other lanes waiting: the scheduler fills every free
  // seat from them, so 64 seats run full until the queue is gone. 64 seats
  // complete 64 / (100 * 8.4 ms) = 76.2 a second, 48.7 arrive: 100 / 27.5 =
  // 3.6 s of the 5 s horizon at 8.4 ms a step, every reply then failed.
  in.waiting_behind = 100;
  PlanCap(in, &f);
  const double queued = 100 / (64 / 0.84 - in.slo_rate_per_s) / in.horizon_s;
  EXPECT_NEAR(f[63].tpot_share, 1 - queued, 0.01);
  EXPECT_EQ(f[19].tpot_share, 1.0);  // 20 seats hold TPOT full
}

TEST(GoodputPlannerTest, TheRequestsRunningAtTheCapInForceCountAgainstACapThatFailsThem) {
  PlannerInputs in = DecodeOnly();
  in.output_tokens = 1000;  // 20 seats complete 20 / (1000 * 4 ms) = 5 a second
  in.horizon_s = 1;
  in.slo_rate_per_s = 1;
  in.other_demand_per_s = 6;
  // Over the horizon alone, a cap that serves the other lanes' 6 a second and fails the SLO lanes'
  // one (TPOT) beats 20 seats, which hold TPOT: 1 + 4 a second.
  const PlannerChoice fresh = PlanCap(in);
  EXPECT_GT(fresh.cap, 20) << fresh.reason;
  EXPECT_NEAR(fresh.best_good_per_s, 6, 1e-9);
  // At 20, 1/s x 1000 tokens x 4 ms = 4 SLO-lane requests are running, admitted at its TPOT; the
  // larger cap would fail them too: 4 over the 1 s horizon, more than it gains.
  in.current_cap = 20;
  const PlannerChoice held = PlanCap(in);
  EXPECT_EQ(held.cap, 20) << held.reason;
  EXPECT_NEAR(held.best_good_per_s, 5, 1e-9);
  // Already at the larger cap its running requests are failed anyway: nothing against staying.
  in.current_cap = fresh.cap;
  EXPECT_EQ(PlanCap(in).cap, fresh.cap);
  in.current_cap = -1;
  EXPECT_THROW(PlanCap(in), std::invalid_argument);
}

// The SLO-lane requests running now count against a cap that fails them even
// when no SLO-lane request arrived in the rate's window: Little's law from
// the arrival rate saw none of them, every cap tied on the other lanes'
// throughput, and the "largest as good even when full" took 64 beside a
// running interactive request and a queue of the batch lane's long prompts
// (cpu-0.5b tuning seed 61: 1 -> 64 -> 1 in a trough, its TPOT lost).
TEST(GoodputPlannerTest, RunningSloRequestsCountWhenNoneArrivedInTheWindow) {
  PlannerInputs in = DecodeOnly();
  in.other_demand_per_s = 0.1;
  in.other_rate_per_s = 0.05;
  in.waiting_behind = 8;  // the batch lane's queue: a large cap runs full, past 20 its TPOT fails
  in.slo_running = 1;
  in.current_cap = 1;
  const PlannerChoice choice = PlanCap(in);
  EXPECT_LE(choice.cap, 20) << choice.reason;
}

TEST(GoodputPlannerTest, RefusesInputsItCannotPlanWith) {
  PlannerInputs in = DecodeOnly();
  in.max_num_seqs = 0;
  EXPECT_THROW(PlanCap(in), std::invalid_argument);
  in = DecodeOnly();
  in.output_tokens = -1;
  EXPECT_THROW(PlanCap(in), std::invalid_argument);
}

}  // namespace
}  // namespace ferry::scheduler

namespace ferry::scheduler {
namespace {

// The CPU engine on the 0.5B shape (issue #52): a step of one sequence takes
// ~40 ms and each more adds ~2.2 ms, a prompt token 2 ms; 16 clients in a
// closed loop of 128-token prompts and 64-token replies at the default
// targets (1 s, 50 ms). No cap above 2 keeps a reply's TPOT under 50 ms, and
// no cap keeps the queue's TTFT under 1 s: the targets are out of reach.
PlannerInputs CpuClosedLoop(int32_t cap_now) {
  PlannerInputs in;
  in.step = StepFit{0.038, 0.0022, 0.002};
  in.prompt_tokens = 128;
  in.output_tokens = 64;
  in.step_token_budget = 8192;
  in.ttft_target_s = 1;
  in.tpot_target_s = 0.050;
  in.slo_rate_per_s = 3.4;
  in.slo_queue = 16 - cap_now;
  in.max_num_seqs = 16;
  in.current_cap = cap_now;
  return in;
}

TEST(GoodputPlannerTest, ClearsTheQueueWhenNoCapCanMeetTheTargets) {
  for (int32_t cap_now : {1, 2, 4, 16}) {
    SCOPED_TRACE(cap_now);
    std::vector<CapForecast> f;
    const PlannerChoice c = PlanCap(CpuClosedLoop(cap_now), &f);
    // Before issue #52 the planner kept the cap that protected the TPOT of a
    // handful (0.1 good/s of 3.4) and fell to 1, a fifth of the throughput.
    EXPECT_EQ(c.regime, PlanRegime::kUnreachable) << c.reason;
    EXPECT_TRUE(c.drains);
    double most = 0;
    for (const CapForecast& x : f) most = std::max(most, x.completions_per_s);
    EXPECT_GE(c.chosen.completions_per_s, (1 - CpuClosedLoop(cap_now).tie_share) * most) << c.reason;
    EXPECT_GE(c.cap, 15) << c.reason;
    EXPECT_NE(c.reason.find("[unreachable]"), std::string::npos) << c.reason;
  }
}

TEST(GoodputPlannerTest, TargetsWithinReachKeepTheGoodputChoice) {
  // The same replica with targets it can meet for most of the demand: the
  // goodput choice, not the throughput one.
  PlannerInputs in = CpuClosedLoop(16);
  in.slo_queue = 0;
  in.slo_rate_per_s = 0.5;
  in.tpot_target_s = 0.100;
  in.ttft_target_s = 10;
  const PlannerChoice c = PlanCap(in);
  EXPECT_EQ(c.regime, PlanRegime::kGoodput) << c.reason;
  EXPECT_FALSE(c.drains);
  // reach_share 0 is the planner before #52: goodput whatever the share.
  PlannerInputs old = CpuClosedLoop(4);
  old.reach_share = 0;
  EXPECT_LE(PlanCap(old).cap, 2);
}

TEST(GoodputPlannerTest, TheRegimeChangesOnlyWhenTheForecastAndTheMeasuredShareAgree) {
  PlannerInputs in = CpuClosedLoop(16);
  // Recent completions met the targets: the forecast alone does not enter the regime.
  in.measured_good_share = 0.9;
  EXPECT_EQ(PlanCap(in).regime, PlanRegime::kGoodput);
  in.measured_good_share = 0.1;
  EXPECT_EQ(PlanCap(in).regime, PlanRegime::kUnreachable);
  // In the regime, a forecast within reach (a closed loop between its cohorts: few arrivals, none
  // waiting) does not leave it while what was measured still misses.
  PlannerInputs gap = CpuClosedLoop(16);
  gap.slo_queue = 0;
  gap.slo_running = 0;
  gap.slo_rate_per_s = 0.3;
  gap.measured_good_share = 0.1;
  EXPECT_EQ(PlanCap(gap).regime, PlanRegime::kGoodput);
  gap.was_unreachable = true;
  EXPECT_EQ(PlanCap(gap).regime, PlanRegime::kUnreachable);
  gap.measured_good_share = 0.9;
  EXPECT_EQ(PlanCap(gap).regime, PlanRegime::kGoodput);
  // Served late last the regime never applies: the on-time requests go ahead of the late queue.
  in.late_last = true;
  EXPECT_EQ(PlanCap(in).regime, PlanRegime::kGoodput);
}

TEST(GoodputPlannerTest, RunningRequestsThatStartedLateDoNotKeepTheTargetsInReach) {
  // The real stack's fit on a faster CPU (25 ms + 0.88 ms a token): caps up to ~9 keep a 50 ms TPOT,
  // 16 clients wait seconds for a seat. The running ones meet the TPOT but started late.
  PlannerInputs in = CpuClosedLoop(8);
  in.step = StepFit{0.025, 0, 0.00088};
  in.slo_running = 8;
  in.slo_queue = 8;
  in.slo_rate_per_s = 1.6;
  in.measured_good_share = 0;
  in.ttft_good_share = 1;  // as if they had started in time: the running ones hold the goodput regime
  EXPECT_EQ(PlanCap(in).regime, PlanRegime::kGoodput);
  in.ttft_good_share = 0;  // none did
  EXPECT_EQ(PlanCap(in).regime, PlanRegime::kUnreachable);
}

TEST(GoodputPlannerTest, NoTargetsTakeTheLargestCapTheBoundAllows) {
  PlannerInputs in = CpuClosedLoop(4);
  in.has_targets = false;
  const PlannerChoice c = PlanCap(in);
  EXPECT_EQ(c.regime, PlanRegime::kNoTargets);
  EXPECT_EQ(c.cap, 16) << c.reason;
  in.candidates = {1, 2, 4, 8, 12};  // load-level: the top level within the bound
  EXPECT_EQ(PlanCap(in).cap, 12);
  in.reach_share = 1.5;
  EXPECT_THROW(PlanCap(in), std::invalid_argument);
}

}  // namespace
}  // namespace ferry::scheduler
