// Reading PEFT adapters: the fixtures PEFT itself wrote (tests/fixtures/make_hf_tiny_lora.py),
// every refusal naming its field, and tensor-parallel slices that put the whole matrices back.
#include "worker/lora/lora_adapter.h"

#include <gtest/gtest.h>

#include <cmath>
#include <filesystem>
#include <fstream>

#include "common/temp_dir.h"

namespace ferry::worker {
namespace {

namespace fs = std::filesystem;

std::string Fixture(const std::string& path) { return std::string(FERRY_SOURCE_DIR) + "/tests/fixtures/" + path; }

ModelConfig TinyQwen2() { return LoadModelConfig(Fixture("hf_tiny_qwen2")); }

std::string ParseError(const nlohmann::json& json) {
  try {
    ParseLoraAdapterConfig(json, "adapter_config.json");
  } catch (const std::invalid_argument& e) {
    return e.what();
  }
  return "";
}

nlohmann::json Plain() {
  return {{"peft_type", "LORA"}, {"r", 8}, {"lora_alpha", 16}, {"target_modules", {"q_proj", "v_proj"}},
          {"bias", "none"}, {"use_dora", false}, {"modules_to_save", nullptr}, {"rank_pattern", nlohmann::json::object()}};
}

TEST(LoraAdapterConfig, ReadsWhatChangesTheOutput) {
  const LoraAdapterConfig c = ParseLoraAdapterConfig(Plain(), "x");
  EXPECT_EQ(c.rank, 8);
  EXPECT_DOUBLE_EQ(c.scale(), 2.0);
  EXPECT_TRUE(c.targets[static_cast<int>(LoraTarget::kQ)]);
  EXPECT_TRUE(c.targets[static_cast<int>(LoraTarget::kV)]);
  EXPECT_FALSE(c.targets[static_cast<int>(LoraTarget::kK)]);
  nlohmann::json rs = Plain();
  rs["use_rslora"] = true;
  EXPECT_DOUBLE_EQ(ParseLoraAdapterConfig(rs, "x").scale(), 16 / std::sqrt(8.0));
  nlohmann::json all = Plain();
  all["target_modules"] = "all-linear";
  for (bool t : ParseLoraAdapterConfig(all, "x").targets) EXPECT_TRUE(t);
}

TEST(LoraAdapterConfig, RefusesEveryFieldThatWouldChangeTheOutputUnserved) {
  const std::vector<std::pair<std::pair<std::string, nlohmann::json>, std::string>> cases = {
      {{"use_dora", true}, "use_dora = true"},
      {{"bias", "all"}, "bias = \"all\""},
      {{"bias", "lora_only"}, "bias = \"lora_only\""},
      {{"modules_to_save", {"lm_head"}}, "modules_to_save = [\"lm_head\"]"},
      {{"rank_pattern", {{"q_proj", 4}}}, "rank_pattern = {\"q_proj\":4}"},
      {{"alpha_pattern", {{"q_proj", 4}}}, "alpha_pattern"},
      {{"layers_to_transform", {0, 1}}, "layers_to_transform = [0,1]"},
      {{"fan_in_fan_out", true}, "fan_in_fan_out = true"},
      {{"target_modules", {"q_proj", "embed_tokens"}}, "\"embed_tokens\""},
      {{"target_modules", {"lm_head"}}, "\"lm_head\""},
      {{"target_modules", ".*\\.(q|v)_proj"}, "target_modules names \".*"},
      {{"target_modules", nlohmann::json::array()}, "target_modules is empty"},
      {{"peft_type", "IA3"}, "peft_type = \"IA3\""},
      {{"r", 0}, "r = 0"},
      {{"r", "8"}, "r = \"8\""},
      {{"lora_alpha", "x"}, "lora_alpha = \"x\""},
  };
  for (const auto& [field, want] : cases) {
    nlohmann::json j = Plain();
    j[field.first] = field.second;
    const std::string error = ParseError(j);
    EXPECT_NE(error.find("adapter_config.json: "), std::string::npos) << field.first;
    EXPECT_NE(error.find(want), std::string::npos) << field.first << ": " << error;
  }
  nlohmann::json missing = Plain();
  missing.erase("r");
  EXPECT_NE(ParseError(missing).find("r = (missing)"), std::string::npos);
}

TEST(LoraAdapter, LoadsPeftsOwnFixture) {
  const ModelConfig base = TinyQwen2();
  const LoraAdapter a =
      LoadLoraAdapter("qv", Fixture("hf_tiny_qwen2/lora/qv"), base, PlanShard(base, 0, 1), LoraLimits{});
  EXPECT_EQ(a.config.rank, 4);
  EXPECT_FLOAT_EQ(a.scale, 2.f);
  ASSERT_EQ(a.layers.size(), 3u);
  for (const auto& layer : a.layers) {
    ASSERT_TRUE(layer[static_cast<int>(LoraTarget::kQ)].has_value());
    ASSERT_TRUE(layer[static_cast<int>(LoraTarget::kV)].has_value());
    EXPECT_FALSE(layer[static_cast<int>(LoraTarget::kK)].has_value());
    EXPECT_FALSE(layer[static_cast<int>(LoraTarget::kDown)].has_value());
    EXPECT_EQ(layer[static_cast<int>(LoraTarget::kQ)]->out, 64);  // 4 heads x 16
    EXPECT_EQ(layer[static_cast<int>(LoraTarget::kV)]->out, 32);  // 2 KV heads x 16
  }
  EXPECT_EQ(a.bytes(), 3 * int64_t{sizeof(float)} * (4 * 64 + 64 * 4 + 4 * 64 + 32 * 4));  // A and B of q and v
}

std::string LoadError(const std::string& dir, const ModelConfig& base, LoraLimits limits = {}) {
  try {
    LoadLoraAdapter("x", dir, base, PlanShard(base, 0, 1), limits);
  } catch (const std::invalid_argument& e) {
    return e.what();
  }
  return "";
}

TEST(LoraAdapter, RefusesAMalformedOrMismatchedAdapterNamingIt) {
  const ModelConfig base = TinyQwen2();
  EXPECT_NE(LoadError(Fixture("hf_tiny_qwen2/lora/all_rslora"), base, LoraLimits{4})
                .find("r = 8 is above --max-lora-rank 4"),
            std::string::npos);
  EXPECT_NE(LoadError("/nonexistent/adapter", base).find("adapter_config.json: cannot be read"), std::string::npos);
  // A base whose attention is shaped otherwise: the tensor and both shapes are named.
  ModelConfig wider = base;
  wider.num_attention_heads = 8;
  const std::string shape = LoadError(Fixture("hf_tiny_qwen2/lora/qv"), wider);
  EXPECT_NE(shape.find("self_attn.q_proj.lora_B.weight has shape [64, 4]"), std::string::npos) << shape;
  EXPECT_NE(shape.find("need [128, 4]"), std::string::npos) << shape;
  // A deeper base: the adapter lacks the layers.
  ModelConfig deeper = base;
  deeper.num_hidden_layers = 4;
  EXPECT_NE(LoadError(Fixture("hf_tiny_qwen2/lora/qv"), deeper).find("layers.3.self_attn.q_proj.lora_A.weight is missing"),
            std::string::npos);
  // Tensors of a module the config does not target.
  ferry::testing::TempDir dir("lora_test");
  fs::copy(Fixture("hf_tiny_qwen2/lora/qv"), dir.str(), fs::copy_options::recursive | fs::copy_options::overwrite_existing);
  nlohmann::json config = nlohmann::json::parse(std::ifstream(dir.str() + "/adapter_config.json"));
  config["target_modules"] = {"q_proj"};
  std::ofstream(dir.str() + "/adapter_config.json") << config.dump();
  EXPECT_NE(LoadError(dir.str(), base).find("v_proj.lora_A.weight is not a lora_A/lora_B of a targeted projection"),
            std::string::npos);
  fs::remove(dir.str() + "/adapter_model.safetensors");
  EXPECT_NE(LoadError(dir.str(), base).find("adapter_model.safetensors: is missing"), std::string::npos);
  std::ofstream(dir.str() + "/adapter_config.json") << "{not json";
  EXPECT_NE(LoadError(dir.str(), base).find("is not valid JSON"), std::string::npos);
}

// Two ranks' slices: column-parallel B rows and row-parallel A columns put back the whole.
TEST(LoraAdapter, TensorParallelSlicesJoinToTheWhole) {
  const ModelConfig base = TinyQwen2();
  const std::string dir = Fixture("hf_tiny_qwen2/lora/all_rslora");
  const LoraAdapter whole = LoadLoraAdapter("a", dir, base, PlanShard(base, 0, 1), LoraLimits{8});
  const LoraAdapter r0 = LoadLoraAdapter("a", dir, base, PlanShard(base, 0, 2), LoraLimits{8});
  const LoraAdapter r1 = LoadLoraAdapter("a", dir, base, PlanShard(base, 1, 2), LoraLimits{8});
  const int32_t rank = 8;
  for (int32_t t = 0; t < kNumLoraTargets; ++t) {
    const bool row_parallel = t == static_cast<int>(LoraTarget::kO) || t == static_cast<int>(LoraTarget::kDown);
    const LoraModule& w = *whole.layers[1][t];
    const LoraModule& a = *r0.layers[1][t];
    const LoraModule& b = *r1.layers[1][t];
    if (row_parallel) {
      ASSERT_EQ(a.in + b.in, w.in) << LoraTargetName(static_cast<LoraTarget>(t));
      EXPECT_EQ(a.b_t, w.b_t);
      for (int32_t j = 0; j < rank; ++j) {
        for (int64_t i = 0; i < w.in; ++i) {
          const float got = i < a.in ? a.a[j * a.in + i] : b.a[j * b.in + i - a.in];
          ASSERT_EQ(got, w.a[j * w.in + i]);
        }
      }
    } else {
      ASSERT_EQ(a.out + b.out, w.out) << LoraTargetName(static_cast<LoraTarget>(t));
      EXPECT_EQ(a.a, w.a);
      for (int32_t j = 0; j < rank; ++j) {
        for (int64_t o = 0; o < w.out; ++o) {
          const float got = o < a.out ? a.b_t[j * a.out + o] : b.b_t[j * b.out + o - a.out];
          ASSERT_EQ(got, w.b_t[j * w.out + o]);
        }
      }
    }
  }
}

}  // namespace
}  // namespace ferry::worker
