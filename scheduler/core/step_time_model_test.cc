#include "scheduler/core/step_time_model.h"

#include <gtest/gtest.h>

namespace ferry::scheduler {
namespace {

// step = 1 ms + 0.1 ms a sequence + 5 us a token.
double Cost(int32_t seqs, int32_t tokens) { return 1e-3 + 1e-4 * seqs + 5e-6 * tokens; }

TEST(StepTimeModelTest, SeparatesSequenceAndTokenCosts) {
  StepTimeModel m;
  // Decode steps of 10..40 sequences, every fourth with a prefill chunk.
  for (int i = 0; i < 400; ++i) {
    const int32_t seqs = 10 + i % 31;
    const int32_t tokens = seqs + (i % 4 == 0 ? 500 + 7 * (i % 13) : 0);
    m.Add(0.01 * i, Cost(seqs, tokens), seqs, tokens);
  }
  ASSERT_TRUE(m.MarginalSeqCost().has_value());
  // One more decoding sequence: a seat and a token.
  EXPECT_NEAR(*m.MarginalSeqCost(), 1e-4 + 5e-6, 1e-9);
}

TEST(StepTimeModelTest, PureDecodeWindowUsesTheSlopeOnSequences) {
  StepTimeModel m;
  for (int i = 0; i < 100; ++i) m.Add(0.01 * i, Cost(8 + i % 9, 8 + i % 9), 8 + i % 9, 8 + i % 9);
  ASSERT_TRUE(m.MarginalSeqCost().has_value());
  EXPECT_NEAR(*m.MarginalSeqCost(), 1e-4 + 5e-6, 1e-9);
}

TEST(StepTimeModelTest, NoFitWithoutVarietyOrSamples) {
  StepTimeModel m;
  for (int i = 0; i < 10; ++i) m.Add(0.01 * i, Cost(8 + i, 8 + i), 8 + i, 8 + i);
  EXPECT_FALSE(m.MarginalSeqCost().has_value());  // fewer than 64 steps
  StepTimeModel flat;
  for (int i = 0; i < 200; ++i) flat.Add(0.01 * i, Cost(16, 16 + i), 16, 16 + i);
  EXPECT_FALSE(flat.MarginalSeqCost().has_value());  // the sequence count never moves
  StepTimeModel falling;  // longer steps with fewer sequences: no positive cost to fit
  for (int i = 0; i < 200; ++i) falling.Add(0.01 * i, 0.01 - 1e-4 * (i % 20), 1 + i % 20, 1 + i % 20);
  EXPECT_FALSE(falling.MarginalSeqCost().has_value());
}

TEST(StepTimeModelTest, RecentMeanAndExpiry) {
  StepTimeModel m;
  EXPECT_EQ(m.RecentMean(10), 0.0);
  for (int i = 0; i < 10; ++i) m.Add(i, 0.001 * (i + 1), 1, 1);  // 1..10 ms at t = 0..9
  EXPECT_NEAR(m.RecentMean(2), 0.0095, 1e-12);
  EXPECT_NEAR(m.RecentMean(100), 0.0055, 1e-12);
  m.Expire(8.0);
  EXPECT_EQ(m.size(), 2u);
  EXPECT_NEAR(m.RecentMean(100), 0.0095, 1e-12);
}

}  // namespace
}  // namespace ferry::scheduler
