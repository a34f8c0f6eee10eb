// The sequence table both engines keep: a step is applied whole or not at all, a re-sent
// (preempted) sequence resumes its seeded stream, penalty counts and guided state from its tokens,
// and an appended sample advances every one of them.
#include "worker/engine/sequence_state.h"

#include <gtest/gtest.h>

#include <memory>
#include <stdexcept>
#include <string>
#include <vector>

namespace ferry::worker {
namespace {

// Ids 0..3 stand for "a", "b", "ab", "c"; 4 is end-of-sequence.
constexpr int32_t kEos = 4;

ModelInfo Info() {
  ModelInfo info;
  info.vocab_size = 5;
  info.num_kv_blocks = 8;
  info.block_size = 4;
  info.max_model_len = 32;
  info.eos_token_ids = {kEos};
  info.supports_guided_decoding = true;
  return info;
}

SequenceTable Table(const ModelInfo* info) {
  return SequenceTable(info, std::make_unique<GuidedVocab>(std::vector<std::string>{"a", "b", "ab", "c", ""},
                                                           std::vector<int32_t>{kEos}));
}

NewSequenceSpec New(uint64_t id, std::vector<int32_t> tokens, int32_t num_generated = 0) {
  NewSequenceSpec n;
  n.seq_id = id;
  n.token_ids = std::move(tokens);
  n.num_generated = num_generated;
  return n;
}

TEST(SequenceTableTest, StartsExtendsAndForgetsSequences) {
  const ModelInfo info = Info();
  SequenceTable table = Table(&info);
  StepSpec step;
  step.new_sequences = {New(1, {0, 1, 3}), New(2, {3, 3})};
  step.new_sequences[0].num_cached_tokens = 2;
  step.scheduled = {{1, 1, {5}}, {2, 2, {6}}};
  EXPECT_EQ(table.Validate(step), 3);
  table.Apply(step);
  ASSERT_EQ(table.size(), 2u);
  const SequenceState& one = table.at(1);
  EXPECT_EQ(one.num_computed, 2);
  EXPECT_EQ(one.block_table, std::vector<int32_t>({5}));
  EXPECT_EQ(one.prompt_len, 3);
  EXPECT_TRUE(one.ReachesEnd(1));
  EXPECT_FALSE(one.ReachesEnd(0));

  StepSpec next;
  next.finished_ids = {2, 99};  // an unknown id is ignored
  next.scheduled = {{1, 1, {7}}};
  table.at(1).num_computed = 3;
  table.at(1).Append(2);
  table.Validate(next);
  table.Apply(next);
  EXPECT_EQ(table.size(), 1u);
  EXPECT_EQ(table.at(1).block_table, std::vector<int32_t>({5, 7}));
  EXPECT_THROW(table.at(2), std::out_of_range);
}

TEST(SequenceTableTest, ARejectedStepChangesNothing) {
  const ModelInfo info = Info();
  SequenceTable table = Table(&info);
  StepSpec first;
  first.new_sequences = {New(1, {0, 1})};
  first.scheduled = {{1, 2, {0}}};
  table.Validate(first);
  table.Apply(first);

  StepSpec bad;
  bad.finished_ids = {1};
  bad.new_sequences = {New(3, {0})};
  bad.scheduled = {{3, 1, {1}}, {4, 1, {2}}};  // 4 is unknown
  try {
    table.Validate(bad);
    FAIL() << "an unknown sequence was accepted";
  } catch (const std::invalid_argument& e) {
    EXPECT_NE(std::string(e.what()).find("sequence 4"), std::string::npos) << e.what();
  }
  EXPECT_EQ(table.size(), 1u);
  EXPECT_EQ(table.at(1).block_table, std::vector<int32_t>({0}));
}

TEST(SequenceTableTest, AppendAdvancesTheStreamCountsAndGuidedState) {
  const ModelInfo info = Info();
  SequenceTable table = Table(&info);
  StepSpec step;
  step.new_sequences = {New(1, {3})};
  SamplingOptions& o = step.new_sequences[0].sampling;
  o.presence_penalty = 1.f;
  o.guided.kind = GuidedSpec::Kind::kChoice;
  o.guided.choices = {"ab"};
  step.scheduled = {{1, 1, {0}}};
  table.Validate(step);
  table.Apply(step);
  SequenceState& seq = table.at(1);
  ASSERT_NE(seq.mask(), nullptr);
  // "ab" may start with "a" or be "ab" whole; "b", "c" and the end are not allowed yet.
  EXPECT_TRUE(seq.mask()->Test(0));
  EXPECT_TRUE(seq.mask()->Test(2));
  EXPECT_FALSE(seq.mask()->Test(1));
  EXPECT_FALSE(seq.mask()->Test(kEos));

  seq.Append(0);
  EXPECT_EQ(seq.token_ids, std::vector<int32_t>({3, 0}));
  EXPECT_EQ(seq.num_generated, 1);
  ASSERT_EQ(seq.counts.entries().size(), 2u);
  EXPECT_EQ(seq.counts.entries()[1].token_id, 0);
  EXPECT_EQ(seq.counts.entries()[1].num_generated, 1);
  // After "a" only "b" continues the choice.
  EXPECT_TRUE(seq.mask()->Test(1));
  EXPECT_FALSE(seq.mask()->Test(0));
  seq.Append(1);
  EXPECT_TRUE(seq.mask()->Test(kEos));
  EXPECT_EQ(seq.mask()->Count(), 1);
}

// A preempted sequence comes back with the tokens it generated: its stream index, counts and
// guided state are those of the sequence that sampled them.
TEST(SequenceTableTest, AResentSequenceResumesFromItsGeneratedTokens) {
  const ModelInfo info = Info();
  SequenceTable table = Table(&info);
  StepSpec step;
  step.new_sequences = {New(1, {3, 0}, /*num_generated=*/1)};
  SamplingOptions& o = step.new_sequences[0].sampling;
  o.frequency_penalty = 0.5f;
  o.guided.kind = GuidedSpec::Kind::kChoice;
  o.guided.choices = {"ab"};
  step.scheduled = {{1, 2, {0}}};
  table.Validate(step);
  table.Apply(step);
  const SequenceState& seq = table.at(1);
  EXPECT_EQ(seq.num_generated, 1);
  EXPECT_EQ(seq.prompt_len, 1);
  ASSERT_EQ(seq.counts.entries().size(), 2u);
  EXPECT_TRUE(seq.counts.entries()[0].in_prompt);
  EXPECT_EQ(seq.counts.entries()[1].num_generated, 1);
  ASSERT_NE(seq.mask(), nullptr);
  EXPECT_TRUE(seq.mask()->Test(1));
  EXPECT_EQ(seq.mask()->Count(), 1);
}

TEST(SequenceTableTest, AllowedIdsMaskTheSampler) {
  const ModelInfo info = Info();
  SequenceTable table = Table(&info);
  StepSpec step;
  step.new_sequences = {New(1, {3})};
  step.new_sequences[0].sampling.allowed_token_ids = {1, 3};
  step.scheduled = {{1, 1, {0}}};
  table.Validate(step);
  table.Apply(step);
  const TokenMask* mask = table.at(1).mask();
  ASSERT_NE(mask, nullptr);
  EXPECT_EQ(mask->Count(), 2);
  EXPECT_TRUE(mask->Test(1));
  EXPECT_TRUE(mask->Test(3));
  table.Clear();
  EXPECT_EQ(table.size(), 0u);
}

}  // namespace
}  // namespace ferry::worker
