// Acceptance (issue #57): the CPU engine with a LoRA adapter reproduces PEFT applied to
// transformers (tests/fixtures/make_hf_tiny_lora.py: adapters PEFT itself wrote, every target
// set, rsLoRA, a bf16 adapter, Llama as well as Qwen2) within the base parity tolerance with the
// same greedy tokens; and in a batch that mixes adapters and the base, every sequence gets
// exactly the logits it gets alone.
#include <gtest/gtest.h>

#include <fstream>
#include <nlohmann/json.hpp>
#include <random>

#include "worker/lora/lora_adapter.h"
#include "worker/model/cpu_model.h"

namespace ferry::worker {
namespace {

constexpr float kLogitTolerance = 1e-4f;  // hf_parity_test's

std::string Fixture(const std::string& path) { return std::string(FERRY_SOURCE_DIR) + "/tests/fixtures/" + path; }

float MaxAbsDiff(const float* a, const std::vector<float>& b) {
  float m = 0;
  for (size_t i = 0; i < b.size(); ++i) m = std::max(m, std::abs(a[i] - b[i]));
  return m;
}

struct Case {
  std::string base, adapter;
};

class LoraParity : public ::testing::TestWithParam<Case> {};

TEST_P(LoraParity, MatchesPeftOnTransformers) {
  const Case& c = GetParam();
  const std::string dir = Fixture(c.base + "/lora/" + c.adapter);
  const nlohmann::json expected = nlohmann::json::parse(std::ifstream(dir + "/expected.json"));
  auto model = CpuModel::Load(Fixture(c.base));
  const LoraAdapter adapter =
      LoadLoraAdapter(c.adapter, dir, model->config(), model->shard(), LoraLimits{/*max_lora_rank=*/8});
  std::vector<int32_t> tokens = expected["prompt_token_ids"].get<std::vector<int32_t>>();
  const auto generated = expected["generated_token_ids"].get<std::vector<int32_t>>();
  const int32_t prompt_len = static_cast<int32_t>(tokens.size());
  tokens.insert(tokens.end(), generated.begin(), generated.end());
  const int32_t len = static_cast<int32_t>(tokens.size());
  // One pass over prompt + generated, scattered blocks; every position's logits from the last
  // prompt token on: the greedy token after each prefix, and the two logit rows stored.
  KvCache cache(model->config(), /*num_blocks=*/8, /*block_size=*/16);
  ForwardBatch batch;
  batch.AddSequence(tokens.data(), len, 0, {6, 1, 4}, 16, len - prompt_len + 1, &adapter);
  const std::vector<float>& logits = model->Forward(batch, cache);
  const int64_t vocab = model->config().vocab_size;
  for (size_t i = 0; i < generated.size(); ++i) {
    const float* row = logits.data() + i * vocab;
    EXPECT_EQ(std::max_element(row, row + vocab) - row, generated[i]) << "generated token " << i;
  }
  const auto last_prompt = expected["last_prompt_logits"].get<std::vector<float>>();
  const auto final_logits = expected["final_logits"].get<std::vector<float>>();
  EXPECT_LT(MaxAbsDiff(logits.data(), last_prompt), kLogitTolerance);
  EXPECT_LT(MaxAbsDiff(logits.data() + generated.size() * vocab, final_logits), kLogitTolerance);
}

INSTANTIATE_TEST_SUITE_P(Adapters, LoraParity,
                         ::testing::Values(Case{"hf_tiny_qwen2", "qv"}, Case{"hf_tiny_qwen2", "all_rslora"},
                                           Case{"hf_tiny_qwen2", "mlp_bf16"}, Case{"hf_tiny_qwen2", "ko"},
                                           Case{"hf_tiny_llama", "all"}),
                         [](const auto& info) { return info.param.base.substr(8) + "_" + info.param.adapter; });

// The logits of the last token of each sequence, run as one batch.
std::vector<std::vector<float>> RunBatch(CpuModel& model, const std::vector<std::vector<int32_t>>& prompts,
                                         const std::vector<const LoraAdapter*>& adapters) {
  const int32_t block = 16;
  KvCache cache(model.kv_layout(), /*num_blocks=*/256, block);
  ForwardBatch batch;
  int32_t next_block = 0;
  for (size_t s = 0; s < prompts.size(); ++s) {
    std::vector<int32_t> table;
    for (size_t i = 0; i * block < prompts[s].size(); ++i) table.push_back(next_block++);
    batch.AddSequence(prompts[s].data(), static_cast<int32_t>(prompts[s].size()), 0, table, block, 1, adapters[s]);
  }
  const std::vector<float>& logits = model.Forward(batch, cache);
  const int64_t vocab = model.config().vocab_size;
  std::vector<std::vector<float>> out;
  for (size_t s = 0; s < prompts.size(); ++s) out.emplace_back(logits.begin() + s * vocab, logits.begin() + (s + 1) * vocab);
  return out;
}

// 32 sequences over four adapters and the base, interleaved, in fp32 and bf16: each sequence's
// logits in the batch are bitwise those it gets alone, and differ between adapters.
TEST(LoraBatch, EachSequenceGetsExactlyWhatItGetsAlone) {
  for (const char* dtype : {"float32", "bfloat16"}) {
    ModelOptions options;
    options.dtype = ParseMatmulDtype(dtype);
    if (options.dtype == MatmulDtype::kBfloat16 && !Bf16MatmulAvailable()) continue;
    auto model = CpuModel::Load(Fixture("hf_tiny_qwen2"), options);
    std::vector<LoraAdapter> adapters;
    for (const char* name : {"qv", "all_rslora", "mlp_bf16", "ko"}) {
      adapters.push_back(LoadLoraAdapter(name, Fixture(std::string("hf_tiny_qwen2/lora/") + name), model->config(),
                                         model->shard(), LoraLimits{8}));
    }
    std::mt19937 rng(7);
    std::vector<std::vector<int32_t>> prompts;
    std::vector<const LoraAdapter*> chosen;
    for (int32_t s = 0; s < 32; ++s) {
      // The same prompt under every choice at s % 8 == 0: the adapters must tell them apart.
      std::vector<int32_t> p(static_cast<size_t>(s % 8 == 0 ? 24 : 5 + rng() % 40));
      for (size_t i = 0; i < p.size(); ++i) p[i] = s % 8 == 0 ? static_cast<int32_t>(10 + i) : 4 + rng() % 500;
      prompts.push_back(p);
      chosen.push_back(s % 5 == 4 ? nullptr : &adapters[s % 5]);
    }
    const auto together = RunBatch(*model, prompts, chosen);
    for (size_t s = 0; s < prompts.size(); ++s) {
      const auto alone = RunBatch(*model, {prompts[s]}, {chosen[s]});
      EXPECT_EQ(alone[0], together[s]) << dtype << " sequence " << s;
    }
    // Sequences 0, 8, 16, 24 share a prompt under adapters 0, 3, 1 and 4 (the base).
    EXPECT_NE(together[0], together[8]);
    EXPECT_NE(together[0], together[16]);
    EXPECT_NE(together[0], together[24]);
    EXPECT_GT(MaxAbsDiff(together[8].data(), together[24]), 1e-2f) << dtype;
  }
}

TEST(LoraBatch, RefusesAnAdapterOfAnotherModel) {
  auto model = CpuModel::Load(Fixture("hf_tiny_qwen2"));
  LoraAdapter other;
  other.name = "other";
  other.layers.resize(2);
  KvCache cache(model->config(), 4, 16);
  ForwardBatch batch;
  const std::vector<int32_t> tokens = {5, 6, 7};
  batch.AddSequence(tokens.data(), 3, 0, {0}, 16, 1, &other);
  try {
    model->Forward(batch, cache);
    FAIL() << "an adapter of 2 layers ran on a 3-layer model";
  } catch (const std::invalid_argument& e) {
    EXPECT_NE(std::string(e.what()).find("adapter other has 2 layers, the model 3"), std::string::npos) << e.what();
  }
}

}  // namespace
}  // namespace ferry::worker
