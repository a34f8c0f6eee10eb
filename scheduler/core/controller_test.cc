#include "scheduler/core/controller.h"

#include <gtest/gtest.h>

#include <stdexcept>

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
  o.load.levels = {{"a", 32}, {"b", 8}};
  EXPECT_THROW(Controller{o}, std::invalid_argument);
  EXPECT_THROW(ParseControllerMode("fast"), std::invalid_argument);
}

TEST(ControllerTest, LoadLevelClimbsAtOnceAndDescendsAfterDwellWithHysteresis) {
  Controller c(Options(ControllerMode::kLoadLevel));  // low 8, medium 16 (queue 4), high 32 (queue 16)
  EXPECT_EQ(c.Step(Obs(0, 2, 0)), 8);
  EXPECT_EQ(c.Step(Obs(1, 8, 20)), 32);  // straight to high
  EXPECT_EQ(c.status().level, "high");
  // Queue 12: below high's 16 but above 16 * 0.7: stays high even after the dwell.
  EXPECT_EQ(c.Step(Obs(10, 32, 12)), 32);
  // Queue 5: below high x0.7 and the 5 s dwell since t=1 has passed: down to medium.
  EXPECT_EQ(c.Step(Obs(10.5, 32, 5)), 16);
  EXPECT_EQ(c.Step(Obs(11, 16, 0)), 16);  // dwell: medium entered at 10.5
  EXPECT_EQ(c.Step(Obs(16, 16, 0)), 8);
  ASSERT_EQ(c.changes().size(), 3u);
  EXPECT_NE(c.changes()[0].reason.find("queue depth"), std::string::npos) << c.changes()[0].reason;
}

TEST(ControllerTest, LoadLevelDoesNotFlapOnAnOscillatingQueue) {
  Controller c(Options(ControllerMode::kLoadLevel));
  for (int i = 0; i < 200; ++i) c.Step(Obs(i * 0.1, 16, i % 2 ? 5 : 3));  // around medium's 4
  // Up once to medium; never down (3 >= 4 * 0.7 keeps it).
  EXPECT_EQ(c.changes().size(), 1u);
}

TEST(ControllerTest, LoadLevelUsesArrivalRateAndKv) {
  Controller c(Options(ControllerMode::kLoadLevel));
  for (int i = 0; i < 100; ++i) c.Step(Obs(i * 0.1, 4, 0, 0.1, 0.005, 3));  // 30/s
  EXPECT_EQ(c.num_seqs(), 16);
  c.Step(Obs(10.1, 4, 0, 0.85));
  EXPECT_EQ(c.num_seqs(), 32);
}

TEST(ControllerTest, SloRaisesWhileWorkWaitsBehindAFullCap) {
  Controller c(Options(ControllerMode::kSlo));
  EXPECT_EQ(c.num_seqs(), 8);
  double t = 0;
  for (int i = 0; i < 200 && c.num_seqs() < 64; ++i, t += 0.1) c.Step(Obs(t, c.num_seqs(), 4));
  EXPECT_EQ(c.num_seqs(), 64);
  EXPECT_EQ(c.changes().front().level, "raise");
  // Seats free: no raise needed.
  Controller d(Options(ControllerMode::kSlo));
  for (int i = 0; i < 100; ++i) d.Step(Obs(i * 0.1, 3, 0));
  EXPECT_EQ(d.num_seqs(), 8);
}

TEST(ControllerTest, SloCutsOnTpotViolationAndKvPressure) {
  ControllerOptions o = Options(ControllerMode::kSlo);
  o.initial_num_seqs = 32;
  Controller c(o);
  c.Step(Obs(0, 32, 10, 0.5, 0.080));  // steps of 80 ms > 50 ms target
  EXPECT_EQ(c.num_seqs(), 24);
  EXPECT_NE(c.changes().back().reason.find("tpot"), std::string::npos);
  c.Step(Obs(1, 24, 10, 0.5, 0.010, 0, 3));  // preemptions: a gentle step down, 24 - 24/8
  EXPECT_EQ(c.num_seqs(), 21);
  EXPECT_NE(c.changes().back().reason.find("kv pressure"), std::string::npos);
  // Within the adjust interval nothing changes.
  c.Step(Obs(1.1, 21, 10, 0.99, 0.2));
  EXPECT_EQ(c.num_seqs(), 21);
  // Never below min.
  for (int i = 0; i < 50; ++i) c.Step(Obs(2 + i, 18, 10, 0.99, 0.2));
  EXPECT_EQ(c.num_seqs(), 2);
}

// Raises stop at the sequences the pool holds at the mean final context of
// recent completions (every lane): seats beyond it only buy preemptions.
TEST(ControllerTest, SloRaisesOnlyUpToWhatTheKvPoolHolds) {
  ControllerOptions o = Options(ControllerMode::kSlo);
  o.max_num_seqs = 256;
  o.initial_num_seqs = 8;
  o.slo.min_samples = 5;
  o.slo.lanes = {"interactive"};
  Controller c(o);
  // 1,000-token requests in a 20,000-token pool: 0.85 * 20 = 17 fit.
  for (int i = 0; i < 10; ++i) c.OnCompletion({0.01 * i, 0.1, 0.005, "batch", 1000});
  for (int i = 0; i < 100; ++i) {
    StepObservation obs = Obs(0.5 * (i + 1), c.num_seqs(), 500, 0.5);
    obs.kv_capacity_tokens = 20000;
    for (int j = 0; j < 5; ++j) c.OnCompletion({obs.now_s, 0.1, 0.005, "batch", 1000});
    c.Step(obs);
  }
  EXPECT_EQ(c.num_seqs(), 17);
  // Without a pool size the same queue raises to the maximum.
  Controller d(o);
  for (int i = 0; i < 100; ++i) d.Step(Obs(0.5 * (i + 1), d.num_seqs(), 500, 0.5));
  EXPECT_EQ(d.num_seqs(), 256);
}

TEST(ControllerTest, SloUsesCompletionsOfItsLanesOnly) {
  ControllerOptions o = Options(ControllerMode::kSlo);
  o.slo.lanes = {"interactive"};
  o.slo.min_samples = 5;
  o.initial_num_seqs = 32;
  Controller c(o);
  for (int i = 0; i < 10; ++i) c.OnCompletion({0.1 * i, 0.2, 0.500, "batch"});
  c.Step(Obs(1, 32, 5, 0.5, 0.005));
  EXPECT_GT(c.num_seqs(), 32);  // batch TPOT does not count: raised
  for (int i = 0; i < 10; ++i) c.OnCompletion({1 + 0.1 * i, 0.2, 0.080, "interactive"});
  const int32_t before = c.num_seqs();
  c.Step(Obs(3, before, 5, 0.5, 0.005));
  EXPECT_LT(c.num_seqs(), before);
  EXPECT_NEAR(c.status().tpot_p_s, 0.080, 1e-12);
  // Old completions leave the window: no more cuts for them.
  const int32_t after = c.num_seqs();
  c.Step(Obs(100, after, 0, 0.5, 0.005));
  EXPECT_EQ(c.num_seqs(), after);
}

}  // namespace
}  // namespace ferry::scheduler
