// ModelRunner behaviour on a random tiny Qwen2 checkpoint: batching, chunked prefill,
// preemption and recompute, seeded sampling, spec validation, random checkpoint writing.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>

#include "worker/arch/random_checkpoint.h"
#include "worker/model/bf16_test_util.h"
#include "worker/model/runner_test_util.h"

namespace ferry::worker {
namespace {

using ::testing::HasSubstr;
using testing::MaxAbsDiff;
using testing::MiniScheduler;
using testing::TempDir;

// One tiny checkpoint shared by every test in this file.
class RunnerTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    dir_ = new TempDir("runner_test");
    ModelShape shape = TinyShape();
    shape.name = "tiny-random";
    WriteRandomCheckpoint(shape, /*seed=*/5, "bfloat16", dir_->str(), {2, 7});
  }
  static void TearDownTestSuite() {
    delete dir_;
    dir_ = nullptr;
  }

  static std::unique_ptr<CpuRunner> MakeRunner(int32_t max_model_len = 0) {
    RunnerOptions options;
    options.model_dir = dir_->str();
    options.dtype = "float32";  // exact: batched and chunked runs compare at 1e-4
    options.block_size = 4;  // small blocks so short prompts span several
    options.num_kv_blocks = 256;
    options.max_model_len = max_model_len;
    options.keep_logits = true;  // the test reads the logits
    return std::make_unique<CpuRunner>(options);
  }

  static std::vector<int32_t> Prompt(int32_t len, int32_t salt) {
    std::vector<int32_t> p(len);
    for (int32_t i = 0; i < len; ++i) p[i] = (i * 131 + salt * 977 + 3) % 2048;
    return p;
  }

  static TempDir* dir_;
};
TempDir* RunnerTest::dir_ = nullptr;

// Each prompt generated alone, as the reference for batched runs.
struct Solo {
  std::vector<int32_t> tokens;
  std::vector<std::vector<float>> logits;
};
Solo RunSolo(CpuRunner& runner, const std::vector<int32_t>& prompt, int32_t num_new,
             SamplingOptions sampling = {}) {
  MiniScheduler sched(runner, 1);
  sched.Add(1, prompt, sampling);
  sched.RunUntil({1}, num_new, 1 << 20);
  return {sched.Generated(1), sched.Logits(1)};
}

TEST_F(RunnerTest, InfoAndEos) {
  auto runner = MakeRunner();
  EXPECT_EQ(runner->info().model, "tiny-random");
  EXPECT_EQ(runner->info().vocab_size, 2048);
  EXPECT_EQ(runner->info().max_model_len, 2048);
  EXPECT_EQ(runner->info().eos_token_ids, (std::vector<int32_t>{2, 7}));
  // Derived from the byte budget: 2 (K, V) * 2 layers * 16 slots * 2 heads * 16 dims * 4 bytes
  // for an fp32 cache; bf16 stores K/V in 2 bytes, so twice the blocks. The default, auto, is
  // bf16 where the CPU runs it.
  RunnerOptions options;
  options.model_dir = dir_->str();
  options.kv_cache_bytes = 8192 * 10 + 5;
  const bool bf16 = Bf16MatmulAvailable();
  EXPECT_EQ(ModelRunner::Create(options)->info().num_kv_blocks, bf16 ? 20 : 10);
  EXPECT_EQ(ModelRunner::Create(options)->info().dtype, bf16 ? "bfloat16" : "float32");
  if (bf16) {
    options.dtype = "bfloat16";
    EXPECT_EQ(ModelRunner::Create(options)->info().num_kv_blocks, 20);
  }
  options.dtype = "float32";
  EXPECT_EQ(ModelRunner::Create(options)->info().num_kv_blocks, 10);
  options.dtype = "float16";
  EXPECT_THROW(ModelRunner::Create(options), std::runtime_error);
}

TEST_F(RunnerTest, MixedBatchMatchesEachSequenceAlone) {
  auto runner = MakeRunner();
  const std::vector<std::vector<int32_t>> prompts = {Prompt(5, 1), Prompt(17, 2), Prompt(1, 3),
                                                     Prompt(33, 4)};
  const int32_t num_new = 10;
  std::vector<Solo> solo;
  for (const auto& p : prompts) solo.push_back(RunSolo(*runner, p, num_new));
  // Staggered arrivals so prefills share steps with other sequences' decodes.
  MiniScheduler sched(*runner, 2);
  for (size_t i = 0; i < prompts.size(); ++i) sched.Add(10 + i, prompts[i]);
  for (int32_t step = 0; step < 40; ++step) {
    std::vector<std::pair<uint64_t, int32_t>> work;
    for (size_t i = 0; i < prompts.size(); ++i) {
      const bool arrived = step >= static_cast<int32_t>(3 * i);
      if (arrived && sched.Generated(10 + i).size() < size_t(num_new)) work.push_back({10 + i, 64});
    }
    if (!work.empty()) sched.Step(work);
  }
  for (size_t i = 0; i < prompts.size(); ++i) {
    SCOPED_TRACE("prompt " + std::to_string(i));
    EXPECT_EQ(sched.Generated(10 + i), solo[i].tokens);
    for (int32_t k = 0; k < num_new; ++k) {
      EXPECT_LT(MaxAbsDiff(sched.Logits(10 + i)[k], solo[i].logits[k]), 1e-4f) << "sample " << k;
    }
  }
}

TEST_F(RunnerTest, ChunkedPrefillMatchesWholePrompt) {
  auto runner = MakeRunner();
  const auto prompt = Prompt(29, 5);
  const Solo whole = RunSolo(*runner, prompt, 8);
  for (int32_t chunk : {1, 3, 4, 10}) {
    SCOPED_TRACE("chunk " + std::to_string(chunk));
    MiniScheduler sched(*runner, chunk);
    sched.Add(1, prompt);
    sched.RunUntil({1}, 8, chunk);
    EXPECT_EQ(sched.Generated(1), whole.tokens);
    for (int32_t k = 0; k < 8; ++k) {
      EXPECT_LT(MaxAbsDiff(sched.Logits(1)[k], whole.logits[k]), 1e-4f) << "sample " << k;
    }
  }
}

TEST_F(RunnerTest, PreemptThenResendContinuesIdentically) {
  auto runner = MakeRunner();
  const auto prompt = Prompt(11, 6);
  for (SamplingOptions sampling :
       {SamplingOptions{}, SamplingOptions{.temperature = 0.9f, .top_p = 0.95f, .top_k = 50,
                                           .seed = 77}}) {
    SCOPED_TRACE("temperature " + std::to_string(sampling.temperature));
    const Solo ref = RunSolo(*runner, prompt, 14, sampling);
    MiniScheduler sched(*runner, 3);
    sched.Add(1, prompt, sampling);
    sched.Add(2, Prompt(6, 7));
    sched.RunUntil({1, 2}, 5, 1 << 20);
    sched.Preempt(1);
    // Recompute the prompt and the 5 generated tokens in chunks, alongside the other sequence.
    sched.RunUntil({1, 2}, 14, 4);
    EXPECT_EQ(sched.Generated(1), ref.tokens);
  }
}

TEST_F(RunnerTest, SeededSamplingIndependentOfBatchMix) {
  auto runner = MakeRunner();
  const SamplingOptions sampling{.temperature = 1.0f, .seed = 1234};
  const auto prompt = Prompt(9, 8);
  const Solo alone = RunSolo(*runner, prompt, 12, sampling);
  {
    MiniScheduler sched(*runner, 4);
    sched.Add(1, Prompt(20, 9), SamplingOptions{.temperature = 0.7f, .top_p = 0.9f, .seed = 1});
    sched.Add(2, prompt, sampling);
    sched.Add(3, Prompt(3, 10), SamplingOptions{.temperature = 1.2f, .top_k = 5, .seed = 99});
    sched.Add(4, prompt, sampling);  // same prompt and seed in the same batch
    sched.RunUntil({1, 2, 3, 4}, 12, 6);
    EXPECT_EQ(sched.Generated(2), alone.tokens);
    EXPECT_EQ(sched.Generated(4), alone.tokens);
  }
  // A different seed gives a different stream (12 draws at temperature 1 over 2048 tokens).
  EXPECT_NE(RunSolo(*runner, prompt, 12, {.temperature = 1.0f, .seed = 4321}).tokens, alone.tokens);
}

TEST_F(RunnerTest, TopKSamplesStayInTopK) {
  auto runner = MakeRunner();
  MiniScheduler sched(*runner, 5);
  const int32_t k = 3;
  sched.Add(1, Prompt(7, 11), SamplingOptions{.temperature = 2.0f, .top_k = k, .seed = 42});
  sched.RunUntil({1}, 40, 1 << 20);
  const auto tokens = sched.Generated(1);
  for (size_t i = 0; i < tokens.size(); ++i) {
    const auto& row = sched.Logits(1)[i];
    int32_t num_greater = 0;
    for (float v : row) num_greater += v > row[tokens[i]];
    EXPECT_LT(num_greater, k) << "sample " << i << " token " << tokens[i];
  }
}

TEST_F(RunnerTest, FinishedAndEmptySteps) {
  auto runner = MakeRunner();
  MiniScheduler sched(*runner, 6);
  sched.Add(1, Prompt(4, 12));
  sched.RunUntil({1}, 2, 16);
  EXPECT_EQ(runner->num_sequences(), 1);
  sched.Finish(1);
  EXPECT_TRUE(sched.Step({}).empty());
  EXPECT_EQ(runner->num_sequences(), 0);
}

// Every malformed step throws std::invalid_argument naming the sequence and leaves the runner
// as it was: the good sequence then continues exactly like an untouched reference.
TEST_F(RunnerTest, InvalidSpecsRejectedWithoutSideEffects) {
  auto runner = MakeRunner(/*max_model_len=*/24);
  auto reference = MakeRunner(24);
  const auto prompt = Prompt(6, 13);
  const Solo ref = RunSolo(*reference, prompt, 6);
  ASSERT_EQ(runner->Step({{{7, prompt, 0, {}}}, {{7, 6, {0, 1}}}, {}, {}})[0].token_id,
            ref.tokens[0]);
  auto expect_invalid = [&](const StepSpec& spec, const std::string& needle) {
    EXPECT_THAT([&] { runner->Step(spec); },
                ::testing::ThrowsMessage<std::invalid_argument>(HasSubstr(needle)));
  };
  expect_invalid({{}, {{99, 1, {}}}, {}, {}}, "sequence 99: scheduled but unknown");
  expect_invalid({{}, {{7, 2, {}}}, {}, {}}, "sequence 7: num_tokens 2");
  expect_invalid({{}, {{7, 0, {}}}, {}, {}}, "num_tokens 0");
  expect_invalid({{}, {{7, 1, {256}}}, {}, {}}, "block id 256");
  expect_invalid({{}, {{7, 1, {}}, {7, 1, {}}}, {}, {}}, "scheduled twice");
  expect_invalid({{{7, prompt, 0, {}}}, {}, {}, {}}, "already known");
  expect_invalid({{{8, {1, 5000}, 0, {}}}, {}, {}, {}}, "token id 5000");
  expect_invalid({{{8, Prompt(25, 1), 0, {}}}, {}, {}, {}}, "exceed max_model_len 24");
  expect_invalid({{{8, {1, 2}, 0, {-1.f, 1.f, 0, 0}}}, {}, {}, {}}, "bad sampling");
  // A new sequence that is fine, batched with a bad one, must not be admitted either.
  expect_invalid({{{8, {1, 2, 3, 4, 5}, 0, {}}}, {{8, 5, {2}}, {7, 1, {}}}, {}, {}},
                 "sequence 8: 1 blocks cannot hold positions up to 5");
  expect_invalid({{}, {{8, 1, {}}}, {}, {}}, "sequence 8: scheduled but unknown");
  // Context beyond max_model_len: a 24-token prompt fills it; its sample would be the 25th.
  ASSERT_EQ(runner->Step({{{9, Prompt(24, 2), 0, {}}}, {{9, 24, {3, 4, 5, 6, 7, 8}}}, {}, {}})
                .size(), 1u);
  expect_invalid({{}, {{9, 1, {9}}}, {}, {}}, "sequence 9: context 25 exceeds max_model_len 24");
  // Sequence 7 continues as if nothing had happened (and 9 may be finished alongside).
  std::vector<int32_t> got{ref.tokens[0]};
  std::vector<int32_t> spare{2, 10, 11};
  for (int32_t computed = 6, held = 2; got.size() < ref.tokens.size(); ++computed) {
    ScheduledSpec s{7, 1, {}};
    if ((computed + 1 + 3) / 4 > held) {
      s.new_block_ids.push_back(spare[held - 2]);
      ++held;
    }
    const auto out = runner->Step({{}, {s}, {9}, {}});
    ASSERT_EQ(out.size(), 1u);
    got.push_back(out[0].token_id);
  }
  EXPECT_EQ(got, ref.tokens);
}

// The bf16 engine (oneDNN, bf16 weights and KV cache) generates the same greedy tokens as the
// exact fp32 engine on this checkpoint (bf16 on disk, logits well separated by construction),
// alone and batched, with logits within a bf16-sized tolerance.
TEST_F(RunnerTest, Bf16GreedyMatchesFp32) {
  FERRY_SKIP_WITHOUT_BF16("bfloat16");
  auto fp32 = MakeRunner();
  RunnerOptions options;
  options.model_dir = dir_->str();
  options.block_size = 4;
  options.num_kv_blocks = 256;
  options.dtype = "bfloat16";
  options.keep_logits = true;  // the test reads the logits
  CpuRunner bf16(options);
  const std::vector<std::vector<int32_t>> prompts = {Prompt(5, 1), Prompt(30, 2), Prompt(1, 3)};
  std::vector<std::vector<int32_t>> batched_tokens;
  {
    MiniScheduler batched(bf16, 7);
    for (size_t i = 0; i < prompts.size(); ++i) batched.Add(10 + i, prompts[i]);
    batched.RunUntil({10, 11, 12}, 12, 8);
    for (size_t i = 0; i < prompts.size(); ++i) batched_tokens.push_back(batched.Generated(10 + i));
  }
  for (size_t i = 0; i < prompts.size(); ++i) {
    SCOPED_TRACE("prompt " + std::to_string(i));
    const Solo want = RunSolo(*fp32, prompts[i], 12);
    const Solo got = RunSolo(bf16, prompts[i], 12);
    EXPECT_EQ(got.tokens, want.tokens);
    EXPECT_EQ(batched_tokens[i], want.tokens);
    for (size_t k = 0; k < want.logits.size(); ++k) {
      float scale = 0.f;
      for (float v : want.logits[k]) scale = std::max(scale, std::abs(v));
      EXPECT_LT(MaxAbsDiff(got.logits[k], want.logits[k]), 0.03f * scale) << "sample " << k;
    }
  }
}

TEST(RandomCheckpointTest, ConfigLooksLikeHuggingFace) {
  TempDir dir("random_ckpt_config");
  WriteConfigFiles(Qwen2_5_0_5BShape(), "bfloat16", dir.str(), {151645, 151643});
  std::ifstream in(dir.str() + "/config.json");
  const auto config = nlohmann::json::parse(in);
  EXPECT_EQ(config["architectures"], nlohmann::json::array({"Qwen2ForCausalLM"}));
  EXPECT_EQ(config["model_type"], "qwen2");
  EXPECT_EQ(config["torch_dtype"], "bfloat16");
  EXPECT_EQ(config["hidden_size"], 896);
  EXPECT_EQ(config["num_hidden_layers"], 24);
  EXPECT_EQ(config["num_key_value_heads"], 2);
  EXPECT_EQ(config["vocab_size"], 151936);
  EXPECT_EQ(config["rope_theta"], 1000000.0);
  EXPECT_EQ(config["rms_norm_eps"], 1e-6);
  EXPECT_EQ(config["tie_word_embeddings"], true);
  EXPECT_EQ(config["eos_token_id"], 151645);
  for (const char* key : {"attention_dropout", "hidden_act", "initializer_range",
                          "max_window_layers", "rope_scaling", "sliding_window",
                          "use_sliding_window", "use_cache", "transformers_version"}) {
    EXPECT_TRUE(config.contains(key)) << key;
  }
  std::ifstream gen_in(dir.str() + "/generation_config.json");
  const auto gen = nlohmann::json::parse(gen_in);
  EXPECT_EQ(gen["eos_token_id"], nlohmann::json::array({151645, 151643}));
}

// Same seed -> same bytes; each on-disk dtype loads and computes nearly the same logits.
TEST(RandomCheckpointTest, DeterministicAndEveryDtypeLoads) {
  TempDir dir("random_ckpt_dtypes");
  ModelShape shape = TinyShape();
  shape.tie_word_embeddings = false;  // cover the separate lm_head in writer and loader
  std::map<std::string, std::vector<float>> logits;
  for (const std::string dtype : {"float32", "float16", "bfloat16"}) {
    const std::string sub = dir.str() + "/" + dtype;
    WriteRandomCheckpoint(shape, 3, dtype, sub, {});
    auto model = CpuModel::Load(sub);
    KvCache cache(model->config(), 4, 16);
    ForwardBatch batch;
    const std::vector<int32_t> prompt{5, 900, 17, 2047, 3};
    batch.AddSequence(prompt.data(), 5, 0, {3}, 16, true);
    logits[dtype] = model->Forward(batch, cache);
  }
  WriteRandomCheckpoint(shape, 3, "bfloat16", dir.str() + "/again", {});
  auto slurp = [](const std::string& path) {
    std::ifstream in(path, std::ios::binary);
    return std::string(std::istreambuf_iterator<char>(in), {});
  };
  EXPECT_EQ(slurp(dir.str() + "/again/model.safetensors"),
            slurp(dir.str() + "/bfloat16/model.safetensors"));
  EXPECT_LT(MaxAbsDiff(logits["float16"], logits["float32"]), 0.02f);
  EXPECT_LT(MaxAbsDiff(logits["bfloat16"], logits["float32"]), 0.2f);
  EXPECT_EQ(Argmax(logits["float16"].data(), 2048), Argmax(logits["float32"].data(), 2048));
}

// The runner reserves the workspace for its largest step at start (RunnerOptions::
// reserve_tokens), so serving never grows it: a step of that size allocates nothing more, and
// a larger one still runs (it grows the buffers).
TEST(RandomCheckpointTest, AReservedWorkspaceHoldsItsLargestStep) {
  TempDir dir("reserved_workspace");
  WriteRandomCheckpoint(TinyShape(), 3, "float32", dir.str(), {});
  auto model = CpuModel::Load(dir.str());
  KvCache cache(model->config(), 8, 16);
  model->Reserve(/*num_tokens=*/32, /*logits_rows=*/4);
  const size_t reserved = model->workspace_bytes();
  ASSERT_GT(reserved, 0u);
  std::vector<int32_t> prompt(33);
  for (int32_t i = 0; i < 33; ++i) prompt[i] = 7 * i + 1;
  ForwardBatch full;
  full.AddSequence(prompt.data(), 32, 0, {0, 1}, 16, /*num_last_logits=*/0);
  full.logits_rows = {28, 29, 30, 31};
  EXPECT_EQ(model->Forward(full, cache).size(), 4u * model->config().vocab_size);
  EXPECT_EQ(model->workspace_bytes(), reserved);
  ForwardBatch larger;
  larger.AddSequence(prompt.data(), 33, 0, {2, 3, 4}, 16, /*num_last_logits=*/1);
  EXPECT_EQ(model->Forward(larger, cache).size(), size_t{1} * model->config().vocab_size);
  EXPECT_GT(model->workspace_bytes(), reserved);
}

}  // namespace
}  // namespace ferry::worker
