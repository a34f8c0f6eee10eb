#include "scheduler/cap/step_time_model.h"

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
  const std::optional<StepFit> fit = m.Fit();
  ASSERT_TRUE(fit.has_value());
  // One more decoding sequence: a seat and a token.
  EXPECT_NEAR(fit->Seconds(21, 21) - fit->Seconds(20, 20), 1e-4 + 5e-6, 1e-9);
}

TEST(StepTimeModelTest, PureDecodeWindowUsesTheSlopeOnSequences) {
  StepTimeModel m;
  for (int i = 0; i < 100; ++i) m.Add(0.01 * i, Cost(8 + i % 9, 8 + i % 9), 8 + i % 9, 8 + i % 9);
  // Seqs and tokens are collinear: the slope goes to the sequences.
  const std::optional<StepFit> fit = m.Fit();
  ASSERT_TRUE(fit.has_value());
  EXPECT_NEAR(fit->per_seq_s, 1e-4 + 5e-6, 1e-9);
  EXPECT_EQ(fit->per_token_s, 0.0);
}

TEST(StepTimeModelTest, NoFitWithoutVarietyOrSamples) {
  StepTimeModel m;
  for (int i = 0; i < 10; ++i) m.Add(0.01 * i, Cost(8 + i, 8 + i), 8 + i, 8 + i);
  EXPECT_FALSE(m.Fit().has_value());  // fewer than 64 steps
  StepTimeModel flat;
  for (int i = 0; i < 200; ++i) flat.Add(0.01 * i, Cost(16, 16 + i), 16, 16 + i);
  EXPECT_FALSE(flat.Fit().has_value());  // the sequence count never moves
  StepTimeModel falling;  // longer steps with fewer sequences: no positive cost to fit
  for (int i = 0; i < 200; ++i) falling.Add(0.01 * i, 0.01 - 1e-4 * (i % 20), 1 + i % 20, 1 + i % 20);
  const std::optional<StepFit> fit = falling.Fit();  // the mean: a seat costs nothing, never less
  ASSERT_TRUE(fit.has_value());
  EXPECT_EQ(fit->per_seq_s, 0.0);
  EXPECT_EQ(fit->per_token_s, 0.0);
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

TEST(StepTimeModelTest, FitRecoversTheCoefficientsAndStaysNonNegative) {
  StepTimeModel m;  // 2 ms + 50 us a sequence + 5 us a token, prefill chunks on some steps
  double all_seqs = 0, all_tokens = 0;
  for (int i = 0; i < 300; ++i) {
    const int seqs = 1 + i % 17, tokens = seqs + (i % 5 == 0 ? 512 : 0);
    m.Add(0.001 * i, 0.002 + 50e-6 * seqs + 5e-6 * tokens, seqs, tokens);
    all_seqs += seqs, all_tokens += tokens;
  }
  const std::optional<StepFit> fit = m.Fit();
  ASSERT_TRUE(fit.has_value());
  EXPECT_NEAR(fit->fixed_s, 0.002, 1e-9);
  EXPECT_NEAR(fit->per_seq_s, 50e-6, 1e-10);
  EXPECT_NEAR(fit->per_token_s, 5e-6, 1e-11);
  EXPECT_NEAR(m.TokensPerSeq(), all_tokens / all_seqs, 1e-9);
  StepTimeModel decode;  // tokens == seqs: the slope goes to the sequences alone
  for (int i = 0; i < 300; ++i) decode.Add(0.001 * i, 0.002 + 1e-4 * (1 + i % 17), 1 + i % 17, 1 + i % 17);
  const std::optional<StepFit> d = decode.Fit();
  ASSERT_TRUE(d.has_value());
  EXPECT_NEAR(d->per_seq_s, 1e-4, 1e-10);
  EXPECT_EQ(d->per_token_s, 0.0);
  StepTimeModel falling;  // no non-negative fit explains it
  for (int i = 0; i < 200; ++i) falling.Add(0.01 * i, 0.01 - 1e-4 * (i % 20), 1 + i % 20, 1 + i % 20);
  const std::optional<StepFit> f = falling.Fit();
  if (f) {
    EXPECT_GE(f->per_seq_s, 0.0);
    EXPECT_GE(f->per_token_s, 0.0);
  }
}

TEST(StepTimeModelTest, ANegativeConstantIsRefittedThroughTheOrigin) {
  // Steps that grow faster than linearly from 4 to 20 sequences: the free
  // line through them has a negative constant. The fit is the least-squares
  // line through the origin, not that line with its constant cut to 0.
  StepTimeModel m;
  double sxy = 0, sxx = 0;
  for (int i = 0; i < 200; ++i) {
    const int seqs = 4 + i % 17;
    const double y = 2e-4 * seqs + 1e-5 * seqs * seqs;
    m.Add(0.001 * i, y, seqs, seqs);
    sxy += seqs * y, sxx += double(seqs) * seqs;
  }
  const std::optional<StepFit> fit = m.Fit();
  ASSERT_TRUE(fit.has_value());
  EXPECT_EQ(fit->fixed_s, 0.0);
  EXPECT_EQ(fit->per_token_s, 0.0);  // tokens == seqs: the slope goes to the sequences
  EXPECT_NEAR(fit->per_seq_s, sxy / sxx, 1e-12);
}

// One sequence at a time (a cap of 1): Fit() has no batch variety, but the
// prefill and decode steps separate the constant (here the fixed cost and one
// seat's) from the per-token cost.
TEST(StepTimeModelTest, AtOneBatchSizeTheTokensGiveTheConstantAndTheTokenCost) {
  StepTimeModel m;
  for (int i = 0; i < 200; ++i) {
    const int32_t tokens = i % 20 == 0 ? 2000 : 1;  // a 2,000-token prefill, then decodes
    m.Add(0.01 * i, Cost(1, tokens), 1, tokens);
  }
  EXPECT_FALSE(m.Fit().has_value());
  const std::optional<StepFit> fit = m.FitAtOneBatchSize();
  ASSERT_TRUE(fit.has_value());
  EXPECT_NEAR(fit->fixed_s, 1e-3 + 1e-4, 1e-9);
  EXPECT_EQ(fit->per_seq_s, 0.0);
  EXPECT_NEAR(fit->per_token_s, 5e-6, 1e-12);
  // Pure decode at one batch size: nothing separates a constant from a token.
  StepTimeModel decode;
  for (int i = 0; i < 200; ++i) decode.Add(0.01 * i, Cost(4, 4), 4, 4);
  EXPECT_FALSE(decode.FitAtOneBatchSize().has_value());
  StepTimeModel few;
  for (int i = 0; i < 10; ++i) few.Add(0.01 * i, Cost(1, 1 + 100 * (i % 2)), 1, 1 + 100 * (i % 2));
  EXPECT_FALSE(few.FitAtOneBatchSize().has_value());  // fewer than 64 steps
}

}  // namespace
}  // namespace ferry::scheduler
