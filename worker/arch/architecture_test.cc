// The registry's config readers: each architecture found by architectures[0] or model_type, its
// traits set, and every field that would change the output and is not implemented refused at
// load, naming the file, the field, its value and what is served. Parity of each architecture's
// forward with transformers: worker/model/hf_parity_test.cc.
#include <gtest/gtest.h>

#include <cmath>
#include <fstream>
#include <nlohmann/json.hpp>

#include "common/temp_dir.h"
#include "worker/arch/architecture.h"
#include "worker/arch/model_config.h"
#include "worker/arch/random_checkpoint.h"
#include "worker/arch/tensor_names.h"
#include "worker/checkpoint/safetensors.h"

namespace ferry::worker {
namespace {

using nlohmann::json;

json Base(const std::string& architecture, const std::string& model_type) {
  return {{"architectures", {architecture}}, {"model_type", model_type}, {"hidden_size", 64},
          {"intermediate_size", 128}, {"num_hidden_layers", 2}, {"num_attention_heads", 4},
          {"num_key_value_heads", 2}, {"vocab_size", 512}, {"max_position_embeddings", 256},
          {"hidden_act", "silu"}};
}

ModelConfig Load(const json& config) {
  testing::TempDir dir("arch_config");
  std::ofstream(dir.str() + "/config.json") << config.dump();
  return LoadModelConfig(dir.str());
}

// The message of the refusal, or "" when it loaded.
std::string Refusal(const json& config) {
  try {
    Load(config);
  } catch (const std::runtime_error& e) {
    return e.what();
  }
  return "";
}

TEST(Architectures, EachFoundByNameOrModelTypeWithItsTraits) {
  const ModelConfig qwen2 = Load(Base("Qwen2ForCausalLM", "qwen2"));
  EXPECT_EQ(qwen2.architecture, "Qwen2ForCausalLM");
  EXPECT_TRUE(qwen2.qkv_bias);
  EXPECT_FALSE(qwen2.qk_norm);
  json by_type = Base("", "llama");
  by_type.erase("architectures");
  EXPECT_EQ(Load(by_type).architecture, "LlamaForCausalLM");
  json qwen3 = Base("Qwen3ForCausalLM", "qwen3");
  qwen3["head_dim"] = 32;
  const ModelConfig q3 = Load(qwen3);
  EXPECT_TRUE(q3.qk_norm);
  EXPECT_FALSE(q3.qkv_bias);
  EXPECT_EQ(q3.head_dim, 32);
  json mistral = Base("MistralForCausalLM", "mistral");
  mistral["sliding_window"] = nullptr;
  EXPECT_EQ(Load(mistral).head_dim, 16);
  EXPECT_EQ(arch::Architectures().size(), 4u);
}

TEST(Architectures, UnservedFieldsAreRefusedNamingFieldValueAndWhatIsServed) {
  struct Case {
    json config;
    std::vector<std::string> says;
  };
  auto with = [](json config, const std::string& key, json value) {
    config[key] = std::move(value);
    return config;
  };
  const json llama = Base("LlamaForCausalLM", "llama");
  const json mistral = Base("MistralForCausalLM", "mistral");
  json no_window = mistral;  // absent: transformers' default 4096
  const std::vector<Case> cases = {
      {Base("GPTNeoXForCausalLM", "gpt_neox"), {"config.json", "GPTNeoXForCausalLM", "Qwen2ForCausalLM, "}},
      {with(Base("Qwen2ForCausalLM", "qwen2"), "use_sliding_window", true), {"use_sliding_window = true", "false"}},
      {with(Base("Qwen2ForCausalLM", "qwen2"), "rope_scaling", {{"type", "yarn"}, {"factor", 4}}),
       {"rope_scaling = {", "yarn", "Ferry serves null"}},
      {with(llama, "hidden_act", "gelu"), {"hidden_act = \"gelu\"", "\"silu\""}},
      {with(llama, "attention_bias", true), {"attention_bias = true", "false"}},
      {with(llama, "mlp_bias", true), {"mlp_bias = true"}},
      {with(llama, "rope_scaling", {{"rope_type", "dynamic"}, {"factor", 2}}), {"dynamic", "llama3"}},
      {with(llama, "rope_scaling", {{"rope_type", "llama3"}, {"factor", 8}}), {"low_freq_factor"}},
      {with(Base("Qwen3ForCausalLM", "qwen3"), "use_sliding_window", true), {"use_sliding_window = true"}},
      {with(mistral, "sliding_window", 4096), {"sliding_window = 4096", "null"}},
      {no_window, {"sliding_window = null", "explicit null"}},
      {with(llama, "head_dim", 15), {"head_dim 15"}},
  };
  for (const Case& c : cases) {
    const std::string message = Refusal(c.config);
    EXPECT_NE(message, "") << c.config.dump();
    for (const std::string& s : c.says) EXPECT_NE(message.find(s), std::string::npos) << s << " in " << message;
  }
}

// transformers' _compute_llama3_parameters on Llama 3.1's own scaling (factor 8, 1, 4, 8192) and
// head_dim 128, theta 500000: the highest frequencies kept, the lowest divided by 8, the band
// between blended (values from transformers 4.51.3 in fp32).
TEST(Architectures, Llama3RopeScaling) {
  json config = Base("LlamaForCausalLM", "llama");
  config["hidden_size"] = 512;
  config["max_position_embeddings"] = 131072;
  config["rope_theta"] = 500000.0;
  config["rope_scaling"] = {{"rope_type", "llama3"}, {"factor", 8.0}, {"low_freq_factor", 1.0},
                            {"high_freq_factor", 4.0}, {"original_max_position_embeddings", 8192}};
  const std::vector<float> f = RopeInvFreq(Load(config));
  ASSERT_EQ(f.size(), 64u);
  EXPECT_FLOAT_EQ(f[0], 1.0f);
  EXPECT_FLOAT_EQ(f[20], 0.0165604409f);    // kept (transformers' default init gives the same)
  EXPECT_FLOAT_EQ(f[32], 0.000524846022f);  // blended (default 0.00141421345)
  EXPECT_FLOAT_EQ(f[40], 3.42810235e-05f);  // divided by 8 (default 0.000274248188)
  EXPECT_FLOAT_EQ(f[63], 3.06892588e-07f);
}

// The tensors both engines read (tensor_names.h) are exactly those transformers writes for each
// architecture, no more and no fewer: a tensor the traits say is absent (a bias, a norm) would be
// read by neither engine and its effect silently lost.
TEST(Architectures, TheTensorsReadAreExactlyThoseTransformersWrites) {
  for (const char* name : {"hf_tiny_qwen2", "hf_tiny_qwen2_tied", "hf_tiny_qwen3", "hf_tiny_llama", "hf_tiny_mistral"}) {
    SCOPED_TRACE(name);
    const std::string dir = std::string(FERRY_SOURCE_DIR) + "/tests/fixtures/" + name;
    const ModelConfig config = LoadModelConfig(dir);
    EXPECT_EQ(Checkpoint(dir).Names(), ExpectedTensors(config));
  }
}

// And ferry-make-model writes each architecture's checkpoint with exactly those tensors.
TEST(Architectures, MakeModelWritesTheTensorsEachArchitectureReads) {
  for (const char* name : {"Qwen2ForCausalLM", "Qwen3ForCausalLM", "LlamaForCausalLM", "MistralForCausalLM"}) {
    SCOPED_TRACE(name);
    testing::TempDir dir(std::string("arch_tensors_") + name);
    WriteRandomCheckpoint(TinyShapeOf(name), 7, "float32", dir.str(), {});
    const ModelConfig config = LoadModelConfig(dir.str());
    EXPECT_EQ(config.architecture, name);
    EXPECT_EQ(Checkpoint(dir.str()).Names(), ExpectedTensors(config));
  }
}

}  // namespace
}  // namespace ferry::worker
