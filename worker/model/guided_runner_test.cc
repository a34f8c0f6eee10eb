// Guided decoding through the runner on a random tiny Qwen2 checkpoint with a byte-level
// tokenizer.json: every generated text stays within its constraint, ends only when accepted,
// and a sequence preempted and resent rebuilds its constraint's state, so its tokens are those
// of an uninterrupted run.
#include <gtest/gtest.h>

#include <fstream>
#include <set>

#include "structured/regex_dfa.h"
#include "worker/arch/random_checkpoint.h"
#include "worker/engine/guided_automata.h"
#include "worker/engine/guided_schema.h"
#include "worker/model/runner_test_util.h"

namespace ferry::worker {
namespace {

using testing::MiniScheduler;
using testing::TempDir;

constexpr int32_t kEos = 2;
// Tokens past the 256 single bytes, so that texts mix one- and many-byte tokens.
const std::vector<std::string> kMultiByte = {"{\"", "\":", "\"}", "true", "null", "\", \"", "  ", "alpha",
                                             "al", "pha", "beta", "gamma", " gamma", "12", "}\n", "[1,"};

std::string Bytes(int32_t id) {
  return id < 256 ? std::string(1, static_cast<char>(id)) : kMultiByte.at(static_cast<size_t>(id - 256));
}

class GuidedRunnerTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    dir_ = new TempDir("guided_runner_test");
    WriteRandomCheckpoint(TinyShape(), /*seed=*/31, "bfloat16", dir_->str(), {kEos},
                               /*num_live_tokens=*/256 + static_cast<int32_t>(kMultiByte.size()));
    WriteByteLevelTokenizerJson(dir_->str(), kMultiByte);
  }
  static void TearDownTestSuite() {
    delete dir_;
    dir_ = nullptr;
  }
  static std::unique_ptr<CpuRunner> MakeRunner(const std::string& dir) {
    RunnerOptions options;
    options.model_dir = dir;
    options.dtype = "float32";
    options.block_size = 4;
    options.num_kv_blocks = 256;
    options.keep_logits = true;  // the test reads the logits
    return std::make_unique<CpuRunner>(options);
  }
  static std::vector<int32_t> Prompt(int32_t salt) { return {40 + salt, 71, 9 + salt, 300 % 256, 33}; }

  static TempDir* dir_;
};
TempDir* GuidedRunnerTest::dir_ = nullptr;

SamplingOptions Json(float temperature, uint64_t seed) {
  SamplingOptions o;
  o.temperature = temperature;
  o.seed = seed;
  o.guided.kind = GuidedSpec::Kind::kJsonObject;
  return o;
}

// The text of generated tokens up to the first end-of-sequence id; checks that every prefix is
// taken by the automaton and that the end comes only once the text is accepted.
template <class Automaton>
std::string CheckedText(Automaton a, const std::vector<int32_t>& generated) {
  std::string text;
  for (int32_t id : generated) {
    if (id == kEos) {
      EXPECT_TRUE(a.Accepted()) << "ended on an unaccepted text: " << text;
      return text;
    }
    for (char c : Bytes(id)) EXPECT_TRUE(a.Feed(static_cast<uint8_t>(c))) << "rejected after: " << text;
    text += Bytes(id);
  }
  return text;
}

TEST_F(GuidedRunnerTest, JsonTextsStayJsonAndResumeIdenticallyAfterPreemption) {
  auto runner = MakeRunner(dir_->str());
  ASSERT_TRUE(runner->info().supports_guided_decoding);
  for (float temperature : {0.f, 1.f}) {
    std::vector<int32_t> whole;
    {
      MiniScheduler sched(*runner, 1);
      sched.Add(1, Prompt(1), Json(temperature, 5));
      sched.Add(2, Prompt(2));  // an unguided neighbour in the same batch
      sched.RunUntil({1, 2}, 40, 3);
      whole = sched.Generated(1);
    }
    MiniScheduler sched(*runner, 2);
    sched.Add(1, Prompt(1), Json(temperature, 5));
    sched.RunUntil({1}, 9, 2);
    sched.Preempt(1);
    sched.RunUntil({1}, 40, 4);
    EXPECT_EQ(sched.Generated(1), whole) << "temperature " << temperature;
    const std::string text = CheckedText(JsonAutomaton{}, whole);
    EXPECT_FALSE(text.empty());
  }
}

TEST_F(GuidedRunnerTest, SchemaTextsStayInTheSchemaAndResumeIdenticallyAfterPreemption) {
  const std::string schema = R"({"type": "object", "required": ["a", "b"], "properties": {
      "a": {"enum": [true, null, 12]}, "b": {"type": "array", "items": {"type": "integer"}}, "c": {"type": "string"}}})";
  const SchemaGraph graph = CompileJsonSchema(schema);
  auto runner = MakeRunner(dir_->str());
  for (uint64_t seed : {1u, 2u, 3u}) {
    SamplingOptions o;
    o.temperature = 1.f;
    o.seed = seed;
    o.guided = {GuidedSpec::Kind::kJsonSchema, {}, schema};
    std::vector<int32_t> whole;
    {
      MiniScheduler sched(*runner, 1);
      sched.Add(1, Prompt(3), o);
      sched.RunUntil({1}, 40, 3);
      whole = sched.Generated(1);
    }
    MiniScheduler sched(*runner, 2);
    sched.Add(1, Prompt(3), o);
    sched.Add(2, Prompt(4), o);  // a neighbour with the same schema shares its masks
    sched.RunUntil({1, 2}, 7, 2);
    sched.Preempt(1);
    sched.RunUntil({1, 2}, 40, 4);
    EXPECT_EQ(sched.Generated(1), whole) << "seed " << seed;
    CheckedText(SchemaAutomaton(&graph), whole);
  }
}

TEST_F(GuidedRunnerTest, RegexTextsMatchAndResumeIdenticallyAfterPreemption) {
  const std::string pattern = R"([ab]{1,3}(c|de|alpha)\.)";
  const RegexDfa dfa = CompileRegex(pattern);
  auto runner = MakeRunner(dir_->str());
  for (uint64_t seed : {4u, 5u, 6u, 7u}) {
    SamplingOptions o;
    o.temperature = 1.f;
    o.seed = seed;
    o.guided = {GuidedSpec::Kind::kRegex, {}, {}, pattern};
    std::vector<int32_t> whole;
    {
      MiniScheduler sched(*runner, 1);
      sched.Add(1, Prompt(5), o);
      sched.RunUntil({1}, 12, 3);  // at most 10 bytes, then the end
      whole = sched.Generated(1);
    }
    MiniScheduler sched(*runner, 2);
    sched.Add(1, Prompt(5), o);
    sched.RunUntil({1}, 2, 2);
    sched.Preempt(1);
    sched.RunUntil({1}, 12, 4);
    EXPECT_EQ(sched.Generated(1), whole) << "seed " << seed;
    std::string text;
    int32_t state = dfa.start;
    for (int32_t id : whole) {
      if (id == kEos) break;
      for (char c : Bytes(id)) state = state < 0 ? -1 : dfa.Step(state, static_cast<uint8_t>(c));
      text += Bytes(id);
    }
    ASSERT_NE(std::find(whole.begin(), whole.end(), kEos), whole.end()) << text;
    EXPECT_TRUE(state >= 0 && dfa.accepting[static_cast<size_t>(state)]) << text;
  }
}

// Guided decoding with speculation: a draft is verified under the same constraint state as a plain
// decode at its position (the matcher advanced over the drafts accepted before it), so JSON and regex
// texts are the plain run's token for token, greedy and seeded, by prompt lookup and by a draft model
// (the target itself, whose unconstrained argmax the constraint often rejects).
TEST_F(GuidedRunnerTest, SpeculationLeavesGuidedTokensUnchanged) {
  const std::string pattern = R"((alpha|beta|gamma| |al|pha)+\.)";
  auto make = [&](const SpeculativeConfig& speculative) {
    RunnerOptions options;
    options.model_dir = dir_->str();
    options.dtype = "float32";
    options.block_size = 4;
    options.num_kv_blocks = 256;
    options.speculative = speculative;
    return std::make_unique<CpuRunner>(options);
  };
  std::vector<SamplingOptions> cases;
  for (float temperature : {0.f, 0.9f}) {
    cases.push_back(Json(temperature, 17));
    SamplingOptions regex;
    regex.temperature = temperature;
    regex.seed = 23;
    regex.guided = {GuidedSpec::Kind::kRegex, {}, {}, pattern};
    cases.push_back(regex);
  }
  auto run = [&](CpuRunner& runner, const SamplingOptions& o, int32_t lookahead, SpeculativeMethod method,
                 SpeculationCounts* counts) {
    MiniScheduler sched(runner, 3);
    sched.Add(1, Prompt(1), o, lookahead, method);
    sched.Add(2, Prompt(2), o, lookahead, method);
    sched.RunUntil({1, 2}, 40, 3);
    if (counts != nullptr) *counts = sched.speculation();
    std::vector<std::vector<int32_t>> out = {sched.Generated(1), sched.Generated(2)};
    for (auto& g : out) g.resize(40);  // a last speculative step may overshoot; a scheduler caps it
    return out;
  };
  auto plain_runner = make({});
  auto ngram_runner = make({SpeculativeMethod::kNgram, 4, 1, 2});
  auto draft_runner = make({SpeculativeMethod::kDraftModel, 3, 1, 4, dir_->str()});
  int64_t drafts = 0, accepted = 0;
  for (size_t i = 0; i < cases.size(); ++i) {
    const auto plain = run(*plain_runner, cases[i], 0, SpeculativeMethod::kNone, nullptr);
    for (auto* runner : {ngram_runner.get(), draft_runner.get()}) {
      const SpeculativeMethod method =
          runner == ngram_runner.get() ? SpeculativeMethod::kNgram : SpeculativeMethod::kDraftModel;
      SpeculationCounts counts;
      EXPECT_EQ(run(*runner, cases[i], runner == ngram_runner.get() ? 4 : 3, method, &counts), plain)
          << "case " << i << (method == SpeculativeMethod::kNgram ? " ngram" : " draft model");
      drafts += counts.num_draft_tokens;
      accepted += counts.num_accepted_tokens;
    }
  }
  // Drafts were both accepted and rejected, so the equality above covers both paths.
  EXPECT_GT(accepted, 0);
  EXPECT_LT(accepted, drafts);
}

TEST_F(GuidedRunnerTest, ChoiceTextsAreExactlyAChoice) {
  auto runner = MakeRunner(dir_->str());
  const std::vector<std::string> choices = {"alpha", "beta gamma", "beta", "{\"x\": null}"};
  std::vector<std::string> sorted = choices;
  std::sort(sorted.begin(), sorted.end());
  std::set<std::string> seen;
  for (uint64_t seed = 0; seed < 24; ++seed) {
    SamplingOptions o;
    o.temperature = 1.5f;
    o.seed = seed;
    o.guided = {GuidedSpec::Kind::kChoice, choices};
    MiniScheduler sched(*runner, static_cast<uint32_t>(seed));
    sched.Add(7, Prompt(static_cast<int32_t>(seed % 3)), o);
    sched.RunUntil({7}, 14, 5);  // the longest choice is 12 bytes: ended by its 13th token
    const std::vector<int32_t> generated = sched.Generated(7);
    ASSERT_NE(std::find(generated.begin(), generated.end(), kEos), generated.end()) << "seed " << seed;
    const std::string text = CheckedText(ChoiceAutomaton(&sorted), generated);
    EXPECT_NE(std::find(choices.begin(), choices.end(), text), choices.end()) << text;
    seen.insert(text);
  }
  EXPECT_GE(seen.size(), 2u) << "sampling should reach more than one choice";
}

TEST_F(GuidedRunnerTest, WithoutATokenizerJsonGuidedRequestsAreRefused) {
  TempDir bare("guided_runner_test_bare");
  WriteRandomCheckpoint(TinyShape(), /*seed=*/31, "bfloat16", bare.str(), {kEos});
  auto runner = MakeRunner(bare.str());
  EXPECT_FALSE(runner->info().supports_guided_decoding);
  StepSpec step;
  step.new_sequences.push_back({.seq_id = 1, .token_ids = Prompt(0), .sampling = Json(0.f, 0)});
  step.scheduled.push_back({1, 5, {0, 1}});
  EXPECT_THROW(runner->Step(step), std::invalid_argument);
  EXPECT_EQ(runner->num_sequences(), 0);
}

}  // namespace
}  // namespace ferry::worker
