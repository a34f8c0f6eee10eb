// safetensors round trips per dtype, sharded checkpoints, and error messages that name the
// file and the tensor.
#include "worker/checkpoint/safetensors.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <cmath>
#include <filesystem>
#include <fstream>
#include <random>

#include "common/temp_dir.h"

namespace ferry::worker {
namespace {

namespace fs = std::filesystem;
using ::testing::HasSubstr;

// A fresh directory per test, removed at its end.
class TempDir : public ferry::testing::TempDir {
 public:
  TempDir()
      : ferry::testing::TempDir(std::string("st_") +
                                ::testing::UnitTest::GetInstance()->current_test_info()->name()) {}
};

std::vector<float> Values(size_t n, uint32_t seed) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> dist(0.f, 3.f);
  std::vector<float> v(n);
  for (float& x : v) x = dist(rng);
  return v;
}

TEST(SafetensorsTest, RoundTripEachDtype) {
  TempDir dir;
  // Relative rounding of each dtype (half an ulp): F32 exact, BF16 8 bits, F16 11 bits.
  for (auto [dtype, rel_tol] : {std::pair{"F32", 0.0}, {"BF16", 1.0 / 256}, {"F16", 1.0 / 2048}}) {
    SCOPED_TRACE(dtype);
    const auto a = Values(6 * 7, 1), b = Values(5, 2);
    WriteSafetensors(dir / "t.safetensors",
                     {{"a", {dtype, {6, 7}, a}}, {"b", {dtype, {5}, b}}, {"empty", {dtype, {0}, {}}}});
    SafetensorsFile file(dir / "t.safetensors");
    EXPECT_EQ(file.tensors().size(), 3u);
    EXPECT_EQ(file.Info("a").shape, (std::vector<int64_t>{6, 7}));
    EXPECT_EQ(file.Info("a").dtype, dtype);
    std::vector<float> got(a.size());
    file.ReadFloat32("a", got.data());
    for (size_t i = 0; i < a.size(); ++i) {
      ASSERT_NEAR(got[i], a[i], rel_tol * std::abs(a[i]) + 1e-30) << i;
    }
    std::vector<float> got_b(b.size());
    file.ReadFloat32("b", got_b.data());
    for (size_t i = 0; i < b.size(); ++i) ASSERT_NEAR(got_b[i], b[i], rel_tol * std::abs(b[i]));
  }
}

TEST(SafetensorsTest, HalfConversionsEdgeCases) {
  // Exactly representable values survive; rounding is to nearest even; extremes saturate.
  for (float v : {0.f, -0.f, 1.f, -2.5f, 65504.f, 6.103515625e-05f, 5.9604644775390625e-08f}) {
    EXPECT_EQ(F16ToFloat(FloatToF16(v)), v) << v;
  }
  for (float v : {0.f, -0.f, 1.f, -2.5f, 3.0e38f, 1.0e-38f}) {
    const float rounded = Bf16ToFloat(FloatToBf16(v));
    EXPECT_NEAR(rounded, v, std::abs(v) / 256) << v;
  }
  EXPECT_EQ(Bf16ToFloat(FloatToBf16(65504.f)), 65536.f);  // rounds up to the next bf16
  EXPECT_EQ(F16ToFloat(FloatToF16(1e6f)), INFINITY);
  EXPECT_TRUE(std::isnan(F16ToFloat(FloatToF16(NAN))));
  EXPECT_TRUE(std::isnan(Bf16ToFloat(FloatToBf16(NAN))));
  EXPECT_EQ(FloatToF16(1.f + 1.f / 2048), FloatToF16(1.f));  // tie -> even mantissa
  EXPECT_EQ(FloatToBf16(1.f + 1.f / 256), FloatToBf16(1.f));
  EXPECT_EQ(Bf16ToFloat(0x3f80), 1.f);
  EXPECT_EQ(F16ToFloat(0x3c00), 1.f);
  EXPECT_EQ(F16ToFloat(0x0001), 5.9604644775390625e-08f);  // smallest subnormal
}

TEST(SafetensorsTest, HeaderIsAlignedAndReadableByOffsets) {
  TempDir dir;
  WriteSafetensors(dir / "t.safetensors", {{"x", {"F32", {3}, {1.f, 2.f, 3.f}}}});
  std::ifstream in(dir / "t.safetensors", std::ios::binary);
  uint64_t header_len = 0;
  in.read(reinterpret_cast<char*>(&header_len), 8);
  EXPECT_EQ(header_len % 8, 0u);
  EXPECT_EQ(fs::file_size(dir / "t.safetensors"), 8 + header_len + 12);
}

TEST(SafetensorsTest, ShardedIndexLoads) {
  TempDir dir;
  const auto a = Values(12, 3), b = Values(4, 4);
  WriteSafetensors(dir / "model-00001-of-00002.safetensors", {{"a", {"BF16", {3, 4}, a}}});
  WriteSafetensors(dir / "model-00002-of-00002.safetensors", {{"b", {"F32", {4}, b}}});
  std::ofstream(dir / "model.safetensors.index.json")
      << R"({"metadata": {"total_size": 40}, "weight_map": {)"
      << R"("a": "model-00001-of-00002.safetensors", "b": "model-00002-of-00002.safetensors"}})";
  Checkpoint ckpt(dir.str());
  EXPECT_TRUE(ckpt.Has("a"));
  EXPECT_TRUE(ckpt.Has("b"));
  EXPECT_FALSE(ckpt.Has("c"));
  EXPECT_EQ(ckpt.Read("b", {4}), b);
  const auto got_a = ckpt.Read("a", {3, 4});
  for (size_t i = 0; i < a.size(); ++i) EXPECT_NEAR(got_a[i], a[i], std::abs(a[i]) / 256);
}

TEST(SafetensorsTest, ErrorsNameFileAndTensor) {
  TempDir dir;
  WriteSafetensors(dir / "model.safetensors", {{"w", {"F32", {2, 3}, Values(6, 5)}}});
  Checkpoint ckpt(dir.str());
  try {
    ckpt.Read("model.norm.weight", {3});
    FAIL() << "no throw";
  } catch (const std::runtime_error& e) {
    EXPECT_THAT(e.what(), HasSubstr("model.norm.weight"));
    EXPECT_THAT(e.what(), HasSubstr("model.safetensors"));
  }
  try {
    ckpt.Read("w", {3, 2});
    FAIL() << "no throw";
  } catch (const std::runtime_error& e) {
    EXPECT_THAT(e.what(), HasSubstr("tensor w has shape [2, 3], expected [3, 2]"));
    EXPECT_THAT(e.what(), HasSubstr("model.safetensors"));
  }
}

TEST(SafetensorsTest, IndexPointingAtMissingTensorFails) {
  TempDir dir;
  WriteSafetensors(dir / "shard.safetensors", {{"a", {"F32", {1}, {1.f}}}});
  std::ofstream(dir / "model.safetensors.index.json")
      << R"({"weight_map": {"a": "shard.safetensors", "ghost": "shard.safetensors"}})";
  EXPECT_THAT([&] { Checkpoint c(dir.str()); },
              ::testing::ThrowsMessage<std::runtime_error>(HasSubstr("ghost")));
}

TEST(SafetensorsTest, TruncatedFileIsRejected) {
  TempDir dir;
  WriteSafetensors(dir / "t.safetensors", {{"x", {"F32", {100}, Values(100, 6)}}});
  fs::resize_file(dir / "t.safetensors", fs::file_size(dir / "t.safetensors") - 4);
  EXPECT_THAT([&] { SafetensorsFile f(dir / "t.safetensors"); },
              ::testing::ThrowsMessage<std::runtime_error>(HasSubstr("x")));
  EXPECT_THROW(Checkpoint(dir / "nowhere"), std::runtime_error);
}

// A header in memory: the 8-byte length, then the JSON, then `data_bytes` zero bytes.
std::string HeaderBytes(const std::string& header_json, size_t data_bytes) {
  std::string bytes(8, '\0');
  for (int i = 0; i < 8; ++i) bytes[i] = static_cast<char>((header_json.size() >> (8 * i)) & 0xFF);
  return bytes + header_json + std::string(data_bytes, '\0');
}

std::map<std::string, TensorInfo> ParseHeader(const std::string& bytes) {
  uint64_t data_offset = 0;
  return ParseSafetensorsHeader(reinterpret_cast<const uint8_t*>(bytes.data()), bytes.size(), "h.safetensors",
                                &data_offset);
}

// Found reading the parser for tests/fuzz/safetensors_header_fuzz.cc (inputs kept in its
// regressions/): a negative dimension paired with another passed the byte-count check ([-1, -4]
// has 4 elements), and huge ones overflowed the element count.
TEST(SafetensorsTest, HeaderShapesMustHaveACountThatFits) {
  const auto parsed = ParseHeader(HeaderBytes(R"({"w": {"dtype": "F32", "shape": [2, 3], "data_offsets": [0, 24]}})", 24));
  EXPECT_EQ(parsed.at("w").num_elements(), 6);
  EXPECT_THAT([] { ParseHeader(HeaderBytes(R"({"w": {"dtype": "F32", "shape": [-1, -4], "data_offsets": [0, 16]}})", 16)); },
              ::testing::ThrowsMessage<std::runtime_error>(HasSubstr("shape[0] = -1")));
  EXPECT_THAT([] {
    ParseHeader(HeaderBytes(
        R"({"w": {"dtype": "F32", "shape": [4294967296, 4294967296, 4], "data_offsets": [0, 0]}})", 0));
  }, ::testing::ThrowsMessage<std::runtime_error>(HasSubstr("shape[1] = 4294967296")));
  EXPECT_THAT([] { ParseHeader(HeaderBytes("[1, 2]", 0)); },
              ::testing::ThrowsMessage<std::runtime_error>(HasSubstr("not a JSON object")));
  // Numbers that are not whole int64s are refused by name, not converted (libFuzzer: a dimension of
  // 4294967292949672897696 parsed as a float, and its conversion to int64 was undefined).
  EXPECT_THAT([] {
    ParseHeader(HeaderBytes(R"({"w": {"dtype": "F32", "shape": [4294967292949672897696, 4], "data_offsets": [0, 0]}})", 0));
  }, ::testing::ThrowsMessage<std::runtime_error>(HasSubstr("shape[0] = 4.294967292949673e+21 is not a whole number")));
  EXPECT_THAT([] { ParseHeader(HeaderBytes(R"({"w": {"dtype": "F32", "shape": [1.5], "data_offsets": [0, 4]}})", 4)); },
              ::testing::ThrowsMessage<std::runtime_error>(HasSubstr("shape[0] = 1.5")));
  EXPECT_THAT([] { ParseHeader(HeaderBytes(R"({"w": {"dtype": "F32", "shape": [1], "data_offsets": [-4, 0]}})", 4)); },
              ::testing::ThrowsMessage<std::runtime_error>(HasSubstr("data_offsets[0] = -4")));
  EXPECT_THAT([] { ParseHeader(HeaderBytes(R"({"w": {"dtype": "F32", "shape": [1], "data_offsets": [0, 18446744073709551615]}})", 4)); },
              ::testing::ThrowsMessage<std::runtime_error>(HasSubstr("data_offsets[1] = 18446744073709551615")));
  EXPECT_THAT([] { ParseHeader(HeaderBytes(R"({"w": {"dtype": "F32", "shape": 4, "data_offsets": [0, 16]}})", 16)); },
              ::testing::ThrowsMessage<std::runtime_error>(HasSubstr("shape = 4 is not an array")));
  // Zero elements stay allowed whatever the other dimensions.
  EXPECT_NO_THROW(ParseHeader(HeaderBytes(R"({"e": {"dtype": "F32", "shape": [0, 4294967296], "data_offsets": [0, 0]}})", 0)));
}

TEST(SafetensorsTest, WriterChecksCompleteness) {
  TempDir dir;
  SafetensorsWriter writer(dir / "w.safetensors", {{"a", "F32", {4}}, {"b", "BF16", {2}}});
  const float four[4] = {1, 2, 3, 4};
  writer.Write(four, 3);  // chunks may split tensors anywhere
  writer.Write(four, 2);
  EXPECT_THROW(writer.Finish(), std::runtime_error);  // b has 1 of 2 values
}

}  // namespace
}  // namespace ferry::worker
