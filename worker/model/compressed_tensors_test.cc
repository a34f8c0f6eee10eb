// compressed-tensors int8 checkpoints: the schemes Ferry runs load, every other one is refused
// naming the field and its value, and int8 tensors are never read as float weights (or the
// reverse). The numerics are in hf_parity_test (Int8CheckpointMatchesItsReference).
#include "worker/checkpoint/compressed_tensors.h"

#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>

#include "worker/model/cpu_model.h"
#include "worker/model/runner_test_util.h"

namespace ferry::worker {
namespace {

namespace fs = std::filesystem;
using nlohmann::json;
using testing::TempDir;

const fs::path kFixture = fs::path(FERRY_SOURCE_DIR) / "tests/fixtures/hf_tiny_qwen2_w8a8";

json FixtureConfig() {
  std::ifstream in(kFixture / "config.json");
  return json::parse(in);
}

// A copy of the fixture whose config.json is `config`.
void WriteCopy(const TempDir& dir, const json& config) {
  for (const auto& entry : fs::directory_iterator(kFixture)) {
    fs::copy_file(entry.path(), fs::path(dir.str()) / entry.path().filename(), fs::copy_options::overwrite_existing);
  }
  std::ofstream(fs::path(dir.str()) / "config.json") << config.dump(2);
}

std::string LoadError(const json& config) {
  TempDir dir("compressed_tensors");
  WriteCopy(dir, config);
  try {
    CpuModel::Load(dir.str());
  } catch (const std::exception& e) {
    return e.what();
  }
  return "";
}

TEST(CompressedTensorsTest, TheFixturesSchemeLoads) {
  const auto scheme = LoadInt8CheckpointScheme(kFixture.string());
  ASSERT_TRUE(scheme.has_value());
  EXPECT_FALSE(scheme->Quantized("lm_head"));
  EXPECT_TRUE(scheme->Quantized("model.layers.0.mlp.down_proj"));
  EXPECT_FALSE(LoadInt8CheckpointScheme(fs::path(FERRY_SOURCE_DIR) / "tests/fixtures/hf_tiny_qwen2").has_value());
}

TEST(CompressedTensorsTest, IgnoreTakesNamesAndRegularExpressions) {
  Int8CheckpointScheme scheme{{"lm_head", "re:.*layers\\.1\\..*", "model.layers.0.mlp.down_proj"}};
  EXPECT_FALSE(scheme.Quantized("lm_head"));
  EXPECT_FALSE(scheme.Quantized("model.layers.1.self_attn.q_proj"));
  EXPECT_FALSE(scheme.Quantized("model.layers.0.mlp.down_proj"));
  EXPECT_TRUE(scheme.Quantized("model.layers.0.mlp.up_proj"));
  EXPECT_TRUE(scheme.Quantized("model.layers.11.mlp.up_proj"));  // the regex matches whole names
}

TEST(CompressedTensorsTest, OtherSchemesAreRefusedNamingTheField) {
  struct Case {
    const char* pointer;  // JSON pointer into quantization_config
    json value;
    const char* field;
  };
  const Case cases[] = {
      {"/config_groups/group_0/weights/num_bits", 4, "config_groups.group_0.weights.num_bits = 4"},
      {"/config_groups/group_0/weights/strategy", "group", "weights.strategy = \"group\""},
      {"/config_groups/group_0/weights/symmetric", false, "weights.symmetric = false"},
      {"/config_groups/group_0/input_activations/dynamic", false, "input_activations.dynamic = false"},
      {"/config_groups/group_0/input_activations/strategy", "tensor", "input_activations.strategy = \"tensor\""},
      {"/config_groups/group_0/input_activations", nullptr, "weight-only int8 is not run"},
      {"/format", "pack-quantized", "format = \"pack-quantized\""},
      {"/quant_method", "awq", "quant_method = \"awq\""},
      {"/quantization_status", "frozen", "quantization_status = \"frozen\""},
      {"/kv_cache_scheme", {{"num_bits", 8}}, "kv_cache_scheme"},
      {"/ignore", {"re:("}, "ignore = \"re:(\""},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(c.pointer);
    json config = FixtureConfig();
    config["quantization_config"][json::json_pointer(c.pointer)] = c.value;
    const std::string error = LoadError(config);
    EXPECT_NE(error.find("quantization_config"), std::string::npos) << error;
    EXPECT_NE(error.find(c.field), std::string::npos) << error;
  }
}

TEST(CompressedTensorsTest, Int8TensorsAreNeverReadAsFloats) {
  json config = FixtureConfig();
  config.erase("quantization_config");
  const std::string error = LoadError(config);
  EXPECT_NE(error.find("q_proj.weight is I8"), std::string::npos) << error;
  // The reverse: a quantized module whose weight is stored in float.
  config = FixtureConfig();
  config["quantization_config"]["ignore"] = json::array();  // lm_head (bf16 on disk) now quantized
  const std::string reverse = LoadError(config);
  EXPECT_NE(reverse.find("lm_head.weight is BF16, expected I8"), std::string::npos) << reverse;
}

TEST(CompressedTensorsTest, FusedProjectionsMustAgree) {
  json config = FixtureConfig();
  config["quantization_config"]["ignore"] = {"lm_head", "model.layers.0.self_attn.k_proj"};
  const std::string error = LoadError(config);
  EXPECT_NE(error.find("q_proj but not model.layers.0.self_attn.k_proj"), std::string::npos) << error;
}

}  // namespace
}  // namespace ferry::worker
