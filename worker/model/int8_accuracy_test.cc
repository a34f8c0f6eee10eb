// --quantization int8 against the unquantized engine on the same checkpoint: logits by cosine
// similarity at every position of a fixed prompt set (the accuracy bar is >= 0.99), top-1
// agreement reported; and greedy tokens independent of batching and chunking.
#include <gtest/gtest.h>

#include <cstdio>

#include "worker/arch/random_checkpoint.h"
#include "worker/model/bf16_test_util.h"
#include "worker/model/quant_eval.h"
#include "worker/model/runner_test_util.h"

namespace ferry::worker {
namespace {

using testing::MiniScheduler;
using testing::TempDir;

// Qwen2.5-0.5B's proportions at a test's size: head_dim 64, GQA 7:1 would need 14 heads, so
// 4 / 2 here; MLP 4x wider than hidden (0.5B: 5.4x); tied embeddings.
ModelShape SmallShape() {
  ModelShape s;
  s.hidden_size = 256;
  s.intermediate_size = 1024;
  s.num_hidden_layers = 4;
  s.num_attention_heads = 4;
  s.num_key_value_heads = 2;
  s.vocab_size = 8192;
  return s;
}

class Int8AccuracyTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    dir_ = new TempDir("int8_accuracy");
    WriteRandomCheckpoint(SmallShape(), /*seed=*/11, "bfloat16", dir_->str(), {});
  }
  static void TearDownTestSuite() {
    delete dir_;
    dir_ = nullptr;
  }
  static std::unique_ptr<CpuModel> Load(MatmulDtype dtype, Quantization q, bool quantize_lm_head = true) {
    ModelOptions options;
    options.dtype = dtype;
    options.quantization = q;
    options.quantize_lm_head = quantize_lm_head;
    return CpuModel::Load(dir_->str(), options);
  }
  static void Report(const char* what, const LogitAgreement& a) {
    std::printf("%s: %d positions, cosine min %.5f mean %.5f, top-1 agreement %.1f%%\n", what, a.positions,
                a.min_cosine, a.mean_cosine, 100.0 * a.top1_agree / a.positions);
  }
  static TempDir* dir_;
};
TempDir* Int8AccuracyTest::dir_ = nullptr;

TEST_F(Int8AccuracyTest, LogitsCloseToFloat32AndBfloat16AtEveryPosition) {
  const auto prompts = FixedPromptSet(SmallShape().vocab_size, 4, 96, 7);
  auto int8 = Load(MatmulDtype::kFloat32, Quantization::kInt8);
  auto fp32 = Load(MatmulDtype::kFloat32, Quantization::kNone);
  const LogitAgreement vs_fp32 = CompareLogits(*fp32, *int8, prompts);
  Report("int8 vs float32", vs_fp32);
  EXPECT_EQ(vs_fp32.positions, 4 * 96);
  EXPECT_GE(vs_fp32.min_cosine, 0.99);
  FERRY_SKIP_WITHOUT_BF16("bfloat16");
  auto bf16 = Load(MatmulDtype::kBfloat16, Quantization::kNone);
  const LogitAgreement vs_bf16 = CompareLogits(*bf16, *int8, prompts);
  Report("int8 vs bfloat16", vs_bf16);
  EXPECT_GE(vs_bf16.min_cosine, 0.99);
}

// The comparison can fail: a model whose layers are off by more than quantization is caught.
TEST_F(Int8AccuracyTest, TheComparisonSeesADifferentModel) {
  TempDir other("int8_accuracy_other");
  WriteRandomCheckpoint(SmallShape(), /*seed=*/12, "bfloat16", other.str(), {});
  auto a = Load(MatmulDtype::kFloat32, Quantization::kNone);
  auto b = CpuModel::Load(other.str(), {});
  const LogitAgreement d = CompareLogits(*a, *b, FixedPromptSet(SmallShape().vocab_size, 1, 32, 7));
  EXPECT_LT(d.min_cosine, 0.9);
}

TEST_F(Int8AccuracyTest, LmHeadKeptUnquantizedOnRequest) {
  const auto prompts = FixedPromptSet(SmallShape().vocab_size, 2, 64, 8);
  auto fp32 = Load(MatmulDtype::kFloat32, Quantization::kNone);
  auto int8_head_fp32 = Load(MatmulDtype::kFloat32, Quantization::kInt8, /*quantize_lm_head=*/false);
  const LogitAgreement a = CompareLogits(*fp32, *int8_head_fp32, prompts);
  Report("int8 (lm_head float32) vs float32", a);
  EXPECT_GE(a.min_cosine, 0.99);
}

// Batched with other sequences, prefilled in chunks: the same greedy tokens as alone.
TEST_F(Int8AccuracyTest, GreedyTokensIndependentOfBatchingAndChunking) {
  RunnerOptions options;
  options.model_dir = dir_->str();
  options.quantization = "int8";
  options.block_size = 4;
  options.num_kv_blocks = 512;
  CpuRunner runner(options);
  EXPECT_EQ(runner.info().quantization, "int8");
  const auto prompts = FixedPromptSet(SmallShape().vocab_size, 3, 40, 9);
  std::vector<std::vector<int32_t>> alone;
  for (const auto& p : prompts) {
    MiniScheduler sched(runner, 1);
    sched.Add(1, p);
    sched.RunUntil({1}, 16, 1 << 20);
    alone.push_back(sched.Generated(1));
  }
  MiniScheduler batched(runner, 3);
  for (size_t i = 0; i < prompts.size(); ++i) batched.Add(10 + i, prompts[i]);
  batched.RunUntil({10, 11, 12}, 16, 7);  // 7-token prefill chunks shared by three sequences
  for (size_t i = 0; i < prompts.size(); ++i) EXPECT_EQ(batched.Generated(10 + i), alone[i]) << "prompt " << i;
}

TEST(QuantizationFlagTest, NamesParseAndABadOneIsRefused) {
  EXPECT_EQ(ParseQuantization("int8"), Quantization::kInt8);
  EXPECT_EQ(ParseQuantization("none"), Quantization::kNone);
  try {
    ParseQuantization("int4");
    FAIL() << "int4 accepted";
  } catch (const std::invalid_argument& e) {
    EXPECT_NE(std::string(e.what()).find("int4"), std::string::npos);
  }
}

}  // namespace
}  // namespace ferry::worker
