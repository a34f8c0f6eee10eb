// Acceptance: the CPU engine reproduces Hugging Face transformers on tiny random models written
// by transformers itself (logits within 1e-4, identical greedy tokens), through the full
// ModelRunner path: paged KV cache with block size 16 and scattered blocks, generation one Step
// at a time. Qwen2: tests/fixtures/make_hf_tiny_qwen2.py; Llama, Qwen3 and Mistral (each
// architecture's traits: llama3 rope scaling and tied embeddings, q/k norm with a head_dim wider
// than hidden / heads, no biases): tests/fixtures/make_hf_tiny_families.py.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <fstream>
#include <nlohmann/json.hpp>

#include "worker/model/bf16_test_util.h"
#include "worker/model/quant_eval.h"
#include "worker/model/cpu_model.h"
#include "worker/model/cpu_runner.h"
#include "worker/model/runner_test_util.h"

namespace ferry::worker {
namespace {

using testing::MaxAbsDiff;
using testing::MiniScheduler;

constexpr float kLogitTolerance = 1e-4f;

std::string FixtureDir(const std::string& name) {
  return std::string(FERRY_SOURCE_DIR) + "/tests/fixtures/" + name;
}

nlohmann::json Expected(const std::string& name) {
  std::ifstream in(FixtureDir(name) + "/expected.json");
  EXPECT_TRUE(in.good()) << "missing fixture " << name;
  return nlohmann::json::parse(in);
}

// Measured 9.5e-6 on the W8A8 fixture (max |logit| 18.6): see Int8CheckpointMatchesItsReference.
constexpr float kInt8LogitTolerance = 1e-4f;

std::unique_ptr<CpuRunner> MakeRunner(const std::string& name,
                                        const std::string& dtype = "float32") {
  RunnerOptions options;
  options.model_dir = FixtureDir(name);
  options.dtype = dtype;  // parity at 1e-4 needs the exact path
  options.block_size = 16;
  options.num_kv_blocks = 32;
  options.keep_logits = true;  // the test reads the logits
  return std::make_unique<CpuRunner>(options);
}

// Every prompt position's logits from the fixture's checkpoint (default options: fp32, and a
// quantized checkpoint's own int8 layers), in one Forward over scattered blocks: [len, vocab].
std::vector<float> PromptLogits(const std::string& name, const std::vector<int32_t>& prompt) {
  auto model = CpuModel::Load(FixtureDir(name));
  KvCache cache(model->config(), /*num_blocks=*/8, /*block_size=*/16);
  ForwardBatch batch;
  batch.AddSequence(prompt.data(), static_cast<int32_t>(prompt.size()), 0, {5, 2}, 16, false);
  for (int32_t i = 0; i < static_cast<int32_t>(prompt.size()); ++i) batch.logits_rows.push_back(i);
  return model->Forward(batch, cache);
}

TEST(HfParityTest, PromptLogitsAtEveryPosition) {
  const auto expected = Expected("hf_tiny_qwen2");
  const auto prompt = expected["prompt_token_ids"].get<std::vector<int32_t>>();
  const auto want = expected["prompt_logits"].get<std::vector<std::vector<float>>>();
  const std::vector<float> logits = PromptLogits("hf_tiny_qwen2", prompt);
  const auto vocab = static_cast<int32_t>(want.at(0).size());  // transformers' row length
  ASSERT_EQ(logits.size(), prompt.size() * vocab);
  for (size_t pos = 0; pos < prompt.size(); ++pos) {
    const std::vector<float> row(logits.begin() + pos * vocab, logits.begin() + (pos + 1) * vocab);
    EXPECT_LT(MaxAbsDiff(row, want[pos]), kLogitTolerance) << "position " << pos;
  }
}

// Greedy generation through Step(): logits of the first sample and of the one after the
// reference's last token, and all 32 tokens.
void CheckGreedyGeneration(const std::string& name, int32_t prefill_chunk) {
  SCOPED_TRACE(name + ", prefill chunk " + std::to_string(prefill_chunk));
  const auto expected = Expected(name);
  const auto prompt = expected["prompt_token_ids"].get<std::vector<int32_t>>();
  const auto want_tokens = expected["generated_token_ids"].get<std::vector<int32_t>>();
  auto runner = MakeRunner(name);
  MiniScheduler sched(*runner, /*seed=*/17);
  sched.Add(1, prompt);
  // One sample beyond the reference: its logits are the reference's final_logits.
  const int32_t num_new = static_cast<int32_t>(want_tokens.size()) + 1;
  sched.RunUntil({1}, num_new, prefill_chunk);
  std::vector<int32_t> got = sched.Generated(1);
  got.pop_back();
  EXPECT_EQ(got, want_tokens);
  const auto& logits = sched.Logits(1);
  ASSERT_EQ(logits.size(), static_cast<size_t>(num_new));
  EXPECT_LT(MaxAbsDiff(logits.front(), expected["last_prompt_logits"].get<std::vector<float>>()),
            kLogitTolerance);
  EXPECT_LT(MaxAbsDiff(logits.back(), expected["final_logits"].get<std::vector<float>>()),
            kLogitTolerance);
}

TEST(HfParityTest, GreedyGenerationUntiedBf16) { CheckGreedyGeneration("hf_tiny_qwen2", 1 << 20); }

TEST(HfParityTest, GreedyGenerationTiedF16) { CheckGreedyGeneration("hf_tiny_qwen2_tied", 1 << 20); }

TEST(HfParityTest, GreedyGenerationChunkedPrefill) {
  CheckGreedyGeneration("hf_tiny_qwen2", 7);  // 7 + 7 + 6: chunks straddle nothing aligned
}

// The bf16 engine (the default) on the same fixtures, teacher-forced on the reference's prompt
// and generated tokens: every position's logits are within `relative` x max |logit| of the
// fp32 engine's (which matches transformers at 1e-4), and the argmax agrees wherever the
// fp32 top-2 margin exceeds twice that. Free-running greedy decoding may legitimately diverge
// after a near tie, so tokens are not compared free-running here.
void CheckBf16AgainstFp32(const std::string& name, float relative) {
  SCOPED_TRACE(name);
  const auto expected = Expected(name);
  auto tokens = expected["prompt_token_ids"].get<std::vector<int32_t>>();
  const auto generated = expected["generated_token_ids"].get<std::vector<int32_t>>();
  tokens.insert(tokens.end(), generated.begin(), generated.end());
  ModelOptions bf16_options;
  bf16_options.dtype = MatmulDtype::kBfloat16;
  auto fp32 = CpuModel::Load(FixtureDir(name));
  auto bf16 = CpuModel::Load(FixtureDir(name), bf16_options);
  KvCache fp32_cache(fp32->kv_layout(), 8, 16), bf16_cache(bf16->kv_layout(), 8, 16);
  ForwardBatch batch;
  batch.AddSequence(tokens.data(), static_cast<int32_t>(tokens.size()), 0, {6, 1, 3, 0}, 16,
                    false);
  for (int32_t i = 0; i < batch.num_tokens(); ++i) batch.logits_rows.push_back(i);
  const std::vector<float> want = fp32->Forward(batch, fp32_cache);
  const std::vector<float> got = bf16->Forward(batch, bf16_cache);
  const int32_t vocab = fp32->config().vocab_size;
  int32_t num_checked = 0;
  for (size_t pos = 0; pos < tokens.size(); ++pos) {
    const std::vector<float> a(want.begin() + pos * vocab, want.begin() + (pos + 1) * vocab);
    const std::vector<float> b(got.begin() + pos * vocab, got.begin() + (pos + 1) * vocab);
    std::vector<float> top = a;
    std::partial_sort(top.begin(), top.begin() + 2, top.end(), std::greater<>());
    float scale = 0.f;
    for (float v : a) scale = std::max(scale, std::abs(v));
    const float tolerance = relative * scale;
    EXPECT_LT(MaxAbsDiff(a, b), tolerance) << "position " << pos;
    if (top[0] - top[1] > 2 * tolerance) {
      ++num_checked;
      EXPECT_EQ(std::max_element(a.begin(), a.end()) - a.begin(),
                std::max_element(b.begin(), b.end()) - b.begin()) << "position " << pos;
    }
  }
  std::printf("%s: argmax compared at %d of %zu positions\n", name.c_str(), num_checked,
              tokens.size());
}

// bf16 weights on disk convert exactly: only activations and K/V are rounded (measured <= 1.1%).
TEST(HfParityTest, Bf16EngineCloseToFp32) {
  FERRY_SKIP_WITHOUT_BF16("bfloat16");
  CheckBf16AgainstFp32("hf_tiny_qwen2", 0.02f);
}

// fp16 weights lose 3 mantissa bits more; this tiny random model amplifies that to ~14% at
// its worst position (measured; 10% with an fp32 KV cache), so only a loose bound holds.
TEST(HfParityTest, Bf16EngineCloseToFp32FromF16Weights) {
  FERRY_SKIP_WITHOUT_BF16("bfloat16");
  CheckBf16AgainstFp32("hf_tiny_qwen2_tied", 0.2f);
}

// An int8 W8A8 checkpoint in compressed-tensors' format (tests/fixtures/make_hf_tiny_qwen2.py)
// against transformers in fp32 with the same int8 weights dequantized and every quantized
// Linear's input quantized per token: the only differences left are fp32 summation order and
// the rare activation that rounds the other way after those. (A reference that divided by the
// scale instead of multiplying by 127 / max, as vLLM's kernel does, differed by 0.5 from the
// first value rounded differently on: one flip moves every later position.)
TEST(HfParityTest, Int8CheckpointMatchesItsReference) {
  const auto expected = Expected("hf_tiny_qwen2_w8a8");
  const auto prompt = expected["prompt_token_ids"].get<std::vector<int32_t>>();
  const auto want = expected["prompt_logits"].get<std::vector<std::vector<float>>>();
  const std::vector<float> logits = PromptLogits("hf_tiny_qwen2_w8a8", prompt);
  const auto vocab = static_cast<int32_t>(want.at(0).size());  // transformers' row length
  ASSERT_EQ(logits.size(), prompt.size() * vocab);
  // The fixture keeps the last positions' logits (each attends to all before it).
  const auto from = expected["prompt_logits_from"].get<size_t>();
  ASSERT_EQ(from + want.size(), prompt.size());
  float worst = 0.f, scale = 0.f;
  for (size_t i = 0; i < want.size(); ++i) {
    const size_t pos = from + i;
    const std::vector<float> row(logits.begin() + pos * vocab, logits.begin() + (pos + 1) * vocab);
    for (float v : want[i]) scale = std::max(scale, std::abs(v));
    worst = std::max(worst, MaxAbsDiff(row, want[i]));
  }
  std::printf("int8 checkpoint: max |logit - reference| %.3g (max |logit| %.3g)\n", worst, scale);
  EXPECT_LT(worst, kInt8LogitTolerance);
  auto runner = MakeRunner("hf_tiny_qwen2_w8a8");
  EXPECT_EQ(runner->info().quantization, "compressed-tensors");
  MiniScheduler sched(*runner, /*seed=*/17);
  sched.Add(1, prompt);
  const auto want_tokens = expected["generated_token_ids"].get<std::vector<int32_t>>();
  sched.RunUntil({1}, static_cast<int32_t>(want_tokens.size()), 1 << 20);
  EXPECT_EQ(sched.Generated(1), want_tokens);
}

// Every architecture beyond Qwen2, on the checks Qwen2 passes above.
class FamilyParityTest : public ::testing::TestWithParam<std::string> {};

TEST_P(FamilyParityTest, PromptLogitsAtEveryPosition) {
  const auto expected = Expected(GetParam());
  const auto prompt = expected["prompt_token_ids"].get<std::vector<int32_t>>();
  const auto want = expected["prompt_logits"].get<std::vector<std::vector<float>>>();
  const std::vector<float> logits = PromptLogits(GetParam(), prompt);
  const auto vocab = static_cast<int32_t>(want.at(0).size());
  ASSERT_EQ(logits.size(), prompt.size() * vocab);
  for (size_t pos = 0; pos < prompt.size(); ++pos) {
    const std::vector<float> row(logits.begin() + pos * vocab, logits.begin() + (pos + 1) * vocab);
    EXPECT_LT(MaxAbsDiff(row, want[pos]), kLogitTolerance) << "position " << pos;
  }
}

TEST_P(FamilyParityTest, GreedyGeneration) { CheckGreedyGeneration(GetParam(), 1 << 20); }

TEST_P(FamilyParityTest, GreedyGenerationChunkedPrefill) { CheckGreedyGeneration(GetParam(), 7); }

// bf16 weights on disk, bf16 matmuls and K/V: the bound Qwen2's bf16 fixture keeps.
TEST_P(FamilyParityTest, Bf16EngineCloseToFp32) {
  FERRY_SKIP_WITHOUT_BF16("bfloat16");
  CheckBf16AgainstFp32(GetParam(), 0.02f);
}

// --quantization int8 against the fp32 engine on the same checkpoint: the accuracy bar of
// int8_accuracy_test (cosine >= 0.99 at every position).
TEST_P(FamilyParityTest, Int8CloseToFp32) {
  auto fp32 = CpuModel::Load(FixtureDir(GetParam()));
  ModelOptions int8_options;
  int8_options.quantization = Quantization::kInt8;
  auto int8 = CpuModel::Load(FixtureDir(GetParam()), int8_options);
  const LogitAgreement a = CompareLogits(*fp32, *int8, FixedPromptSet(fp32->config().vocab_size, 4, 48, 5));
  std::printf("%s int8: min cosine %.5f, mean %.5f, top-1 %d of %d\n", GetParam().c_str(), a.min_cosine,
              a.mean_cosine, a.top1_agree, a.positions);
  EXPECT_GE(a.min_cosine, 0.99);
}

INSTANTIATE_TEST_SUITE_P(Architectures, FamilyParityTest,
                         ::testing::Values("hf_tiny_llama", "hf_tiny_qwen3", "hf_tiny_mistral"),
                         [](const auto& info) { return info.param.substr(std::string("hf_tiny_").size()); });

TEST(HfParityTest, ArchitectureTraitsFromConfig) {
  auto llama = CpuModel::Load(FixtureDir("hf_tiny_llama"));
  EXPECT_EQ(llama->config().architecture, "LlamaForCausalLM");
  EXPECT_EQ(llama->config().rope_scaling.type, RopeScaling::Type::kLlama3);
  EXPECT_FALSE(llama->config().qkv_bias);
  EXPECT_TRUE(llama->config().tie_word_embeddings);
  EXPECT_EQ(llama->config().eos_token_ids, (std::vector<int32_t>{2, 3}));
  auto qwen3 = CpuModel::Load(FixtureDir("hf_tiny_qwen3"));
  EXPECT_TRUE(qwen3->config().qk_norm);
  EXPECT_EQ(qwen3->config().head_dim, 32) << "given, and wider than hidden / heads (16)";
  auto qwen2 = CpuModel::Load(FixtureDir("hf_tiny_qwen2"));
  EXPECT_TRUE(qwen2->config().qkv_bias);
  EXPECT_FALSE(qwen2->config().qk_norm);
}

TEST(HfParityTest, InfoFromCheckpoint) {
  auto runner = MakeRunner("hf_tiny_qwen2");
  const ModelInfo& info = runner->info();
  EXPECT_EQ(info.model, "hf_tiny_qwen2");
  EXPECT_EQ(info.dtype, "float32");
  EXPECT_EQ(info.vocab_size, 512);
  EXPECT_EQ(info.max_model_len, 256);
  EXPECT_EQ(info.block_size, 16);
  EXPECT_EQ(info.num_kv_blocks, 32);
  EXPECT_EQ(info.eos_token_ids, (std::vector<int32_t>{2, 3}));  // generation_config.json list
}

}  // namespace
}  // namespace ferry::worker
