#include "worker/arch/random_checkpoint.h"

#include <cmath>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <stdexcept>

#include "common/counter_uniform.h"
#include "worker/checkpoint/safetensors.h"

namespace ferry::worker {
namespace {

using nlohmann::ordered_json;
namespace fs = std::filesystem;

// How a tensor's values are drawn: uniform with standard deviation `stddev` around `mean`.
struct Init {
  float mean = 0.f;
  float stddev = 0.f;
};

struct PlannedTensor {
  SafetensorsWriter::Entry entry;
  Init init;
  int64_t num_live_rows = -1;  // rows past this are zero (-1: all rows random)
};

// FNV-1a: a stable per-tensor stream id, independent of the standard library's hash.
uint64_t NameHash(const std::string& name) {
  uint64_t h = 0xcbf29ce484222325ull;
  for (unsigned char ch : name) h = (h ^ ch) * 0x100000001b3ull;
  return h;
}

int32_t HeadDim(const ModelShape& s) { return s.head_dim > 0 ? s.head_dim : s.hidden_size / s.num_attention_heads; }

std::vector<PlannedTensor> PlanTensors(const ModelShape& s, const std::string& st_dtype) {
  const int64_t hidden = s.hidden_size, inter = s.intermediate_size;
  const int64_t head_dim = HeadDim(s);
  const bool qkv_bias = s.architecture == "Qwen2ForCausalLM", qk_norm = s.architecture == "Qwen3ForCausalLM";
  const int64_t q_dim = s.num_attention_heads * head_dim, kv_dim = s.num_key_value_heads * head_dim;
  // Projections: std 1/sqrt(fan_in) keeps each output near the RMS of its (normed) input.
  // Embeddings: std 2/sqrt(hidden), so with the (tied) head the logits have std ~2 and the
  // top choices are well apart, while the input token does not dominate the residual stream.
  const Init embed{0.f, 2.f / std::sqrt(float(hidden))};
  const Init from_hidden{0.f, 1.f / std::sqrt(float(hidden))};
  const Init from_q{0.f, 1.f / std::sqrt(float(q_dim))};
  const Init from_inter{0.f, 1.f / std::sqrt(float(inter))};
  const Init bias{0.f, 0.02f};
  const Init ones{1.f, 0.f};
  std::vector<PlannedTensor> plan;
  auto add = [&](const std::string& name, std::vector<int64_t> shape, Init init) {
    plan.push_back({{name, st_dtype, std::move(shape)}, init});
  };
  add("model.embed_tokens.weight", {s.vocab_size, hidden}, embed);
  for (int32_t i = 0; i < s.num_hidden_layers; ++i) {
    const std::string p = "model.layers." + std::to_string(i) + ".";
    add(p + "input_layernorm.weight", {hidden}, ones);
    add(p + "self_attn.q_proj.weight", {q_dim, hidden}, from_hidden);
    if (qkv_bias) add(p + "self_attn.q_proj.bias", {q_dim}, bias);
    add(p + "self_attn.k_proj.weight", {kv_dim, hidden}, from_hidden);
    if (qkv_bias) add(p + "self_attn.k_proj.bias", {kv_dim}, bias);
    add(p + "self_attn.v_proj.weight", {kv_dim, hidden}, from_hidden);
    if (qkv_bias) add(p + "self_attn.v_proj.bias", {kv_dim}, bias);
    if (qk_norm) {
      add(p + "self_attn.q_norm.weight", {head_dim}, ones);
      add(p + "self_attn.k_norm.weight", {head_dim}, ones);
    }
    add(p + "self_attn.o_proj.weight", {hidden, q_dim}, from_q);
    add(p + "post_attention_layernorm.weight", {hidden}, ones);
    add(p + "mlp.gate_proj.weight", {inter, hidden}, from_hidden);
    add(p + "mlp.up_proj.weight", {inter, hidden}, from_hidden);
    add(p + "mlp.down_proj.weight", {hidden, inter}, from_inter);
  }
  add("model.norm.weight", {hidden}, ones);
  if (!s.tie_word_embeddings) add("lm_head.weight", {s.vocab_size, hidden}, from_hidden);
  return plan;
}

// Streams one tensor's values through the writer in fixed-size chunks. Each value is a pure
// function of (seed, tensor name, index), so chunking and thread count do not change it.
void WriteTensor(SafetensorsWriter& writer, const PlannedTensor& t, uint64_t seed,
                 std::vector<float>& chunk) {
  const int64_t n = NumElements(t.entry.shape);
  const uint64_t stream = seed ^ NameHash(t.entry.name);
  const float half_width = t.init.stddev * std::sqrt(3.f);  // uniform(-a, a) has std a/sqrt(3)
  const int64_t row = t.entry.shape.size() == 2 ? t.entry.shape[1] : 1;
  const int64_t live_end = t.num_live_rows < 0 ? n : t.num_live_rows * row;
  for (int64_t begin = 0; begin < n; begin += static_cast<int64_t>(chunk.size())) {
    const int64_t count = std::min<int64_t>(static_cast<int64_t>(chunk.size()), n - begin);
#pragma omp parallel for schedule(static)
    for (int64_t i = 0; i < count; ++i) {
      const double u = CounterUniform(stream, static_cast<uint64_t>(begin + i));
      chunk[i] = begin + i < live_end ? t.init.mean + half_width * static_cast<float>(2.0 * u - 1.0) : 0.f;
    }
    writer.Write(chunk.data(), static_cast<size_t>(count));
  }
}

// config.json as transformers writes it for the shape's architecture (keys in its order).
ordered_json ConfigJson(const ModelShape& s, const std::string& dtype) {
  const std::string& a = s.architecture;
  const bool qwen = a == "Qwen2ForCausalLM" || a == "Qwen3ForCausalLM";
  ordered_json j;
  if (!s.name.empty()) j["_name_or_path"] = s.name;
  j["architectures"] = {a};
  if (a != "Qwen2ForCausalLM" && a != "MistralForCausalLM") j["attention_bias"] = false;
  j["attention_dropout"] = 0.0;
  j["bos_token_id"] = s.bos_token_id;
  j["eos_token_id"] = s.eos_token_id;
  if (a != "Qwen2ForCausalLM") j["head_dim"] = HeadDim(s);
  j["hidden_act"] = "silu";
  j["hidden_size"] = s.hidden_size;
  j["initializer_range"] = 0.02;
  j["intermediate_size"] = s.intermediate_size;
  j["max_position_embeddings"] = s.max_position_embeddings;
  if (qwen) j["max_window_layers"] = s.num_hidden_layers;
  if (a == "LlamaForCausalLM") j["mlp_bias"] = false;
  j["model_type"] = a == "Qwen2ForCausalLM"   ? "qwen2"
                    : a == "Qwen3ForCausalLM" ? "qwen3"
                    : a == "LlamaForCausalLM" ? "llama"
                                              : "mistral";
  j["num_attention_heads"] = s.num_attention_heads;
  j["num_hidden_layers"] = s.num_hidden_layers;
  j["num_key_value_heads"] = s.num_key_value_heads;
  if (a == "LlamaForCausalLM") j["pretraining_tp"] = 1;
  j["rms_norm_eps"] = s.rms_norm_eps;
  if (s.llama3_factor > 0) {
    j["rope_scaling"] = {{"factor", s.llama3_factor},
                         {"high_freq_factor", s.llama3_high_freq_factor},
                         {"low_freq_factor", s.llama3_low_freq_factor},
                         {"original_max_position_embeddings", s.llama3_original_max_position_embeddings},
                         {"rope_type", "llama3"}};
  } else if (a != "MistralForCausalLM") {
    j["rope_scaling"] = nullptr;
  }
  j["rope_theta"] = s.rope_theta;
  if (qwen || a == "MistralForCausalLM") j["sliding_window"] = nullptr;
  j["tie_word_embeddings"] = s.tie_word_embeddings;
  j["torch_dtype"] = dtype;
  // Qwen3 came with transformers 4.51; Qwen2's files stay byte for byte what they were.
  j["transformers_version"] = a == "Qwen2ForCausalLM" ? "4.46.3" : "4.51.3";
  j["use_cache"] = true;
  if (qwen) j["use_sliding_window"] = false;
  j["vocab_size"] = s.vocab_size;
  return j;
}

void WriteJson(const fs::path& path, const ordered_json& j) {
  std::ofstream out(path);
  out << j.dump(2) << "\n";
  if (!out) throw std::runtime_error(path.string() + ": write failed");
}

}  // namespace

ModelShape TinyShape() { return ModelShape{}; }

ModelShape TinyShapeOf(const std::string& architecture) {
  ModelShape s;
  s.architecture = architecture;
  if (architecture == "LlamaForCausalLM") {
    s.rope_theta = 500000.0;
    s.llama3_factor = 8.0;
    s.llama3_original_max_position_embeddings = 64;  // small: every branch of the scaling occurs
  }
  if (architecture == "Qwen3ForCausalLM") s.head_dim = 32;  // wider than hidden / heads, as Qwen3's
  return s;
}

ModelShape Llama3_2_1BShape() {
  ModelShape s;
  s.architecture = "LlamaForCausalLM";
  s.hidden_size = 2048;
  s.intermediate_size = 8192;
  s.num_hidden_layers = 16;
  s.num_attention_heads = 32;
  s.num_key_value_heads = 8;
  s.head_dim = 64;
  s.vocab_size = 128256;
  s.max_position_embeddings = 131072;
  s.rope_theta = 500000.0;
  s.rms_norm_eps = 1e-5;
  s.llama3_factor = 32.0;
  s.llama3_original_max_position_embeddings = 8192;
  s.tie_word_embeddings = true;
  s.bos_token_id = 128000;
  s.eos_token_id = 128001;
  return s;
}

ModelShape Qwen3_0_6BShape() {
  ModelShape s;
  s.architecture = "Qwen3ForCausalLM";
  s.hidden_size = 1024;
  s.intermediate_size = 3072;
  s.num_hidden_layers = 28;
  s.num_attention_heads = 16;
  s.num_key_value_heads = 8;
  s.head_dim = 128;
  s.vocab_size = 151936;
  s.max_position_embeddings = 40960;
  s.rope_theta = 1000000.0;
  s.tie_word_embeddings = true;
  s.bos_token_id = 151643;
  s.eos_token_id = 151645;
  return s;
}

ModelShape Mistral7BV0_3Shape() {
  ModelShape s;
  s.architecture = "MistralForCausalLM";
  s.hidden_size = 4096;
  s.intermediate_size = 14336;
  s.num_hidden_layers = 32;
  s.num_attention_heads = 32;
  s.num_key_value_heads = 8;
  s.head_dim = 128;
  s.vocab_size = 32768;
  s.max_position_embeddings = 32768;
  s.rope_theta = 1000000.0;
  s.rms_norm_eps = 1e-5;
  s.tie_word_embeddings = false;
  s.bos_token_id = 1;
  s.eos_token_id = 2;
  return s;
}

ModelShape Qwen2_5_0_5BShape() {
  ModelShape s;
  s.hidden_size = 896;
  s.intermediate_size = 4864;
  s.num_hidden_layers = 24;
  s.num_attention_heads = 14;
  s.num_key_value_heads = 2;
  s.vocab_size = 151936;
  s.max_position_embeddings = 32768;
  s.rope_theta = 1000000.0;
  s.rms_norm_eps = 1e-6;
  s.tie_word_embeddings = true;
  s.bos_token_id = 151643;
  s.eos_token_id = 151645;
  return s;
}

ModelShape Qwen2_5_DraftShape() {
  ModelShape s = Qwen2_5_0_5BShape();
  s.hidden_size = 256;
  s.intermediate_size = 1024;
  s.num_hidden_layers = 4;
  s.num_attention_heads = 4;
  s.num_key_value_heads = 2;
  return s;
}

void WriteConfigFiles(const ModelShape& shape, const std::string& dtype,
                           const std::string& dir, const std::vector<int32_t>& eos_token_ids) {
  SafetensorsDtypeFromTorch(dtype);  // validates the spelling
  if (shape.num_attention_heads <= 0 || (shape.head_dim <= 0 && shape.hidden_size % shape.num_attention_heads != 0) ||
      shape.num_key_value_heads <= 0 ||
      shape.num_attention_heads % shape.num_key_value_heads != 0) {
    throw std::runtime_error(dir + ": inconsistent ModelShape head counts");
  }
  fs::create_directories(dir);
  WriteJson(fs::path(dir) / "config.json", ConfigJson(shape, dtype));
  ordered_json gen;
  gen["bos_token_id"] = shape.bos_token_id;
  const std::vector<int32_t> eos =
      eos_token_ids.empty() ? std::vector<int32_t>{shape.eos_token_id} : eos_token_ids;
  if (eos.size() == 1) {
    gen["eos_token_id"] = eos[0];
  } else {
    gen["eos_token_id"] = eos;
  }
  gen["transformers_version"] = shape.architecture == "Qwen2ForCausalLM" ? "4.46.3" : "4.51.3";
  WriteJson(fs::path(dir) / "generation_config.json", gen);
}

void WriteRandomCheckpoint(const ModelShape& shape, uint64_t seed, const std::string& dtype,
                                const std::string& dir,
                                const std::vector<int32_t>& eos_token_ids, int32_t num_live_tokens) {
  WriteConfigFiles(shape, dtype, dir, eos_token_ids);
  std::vector<PlannedTensor> plan = PlanTensors(shape, SafetensorsDtypeFromTorch(dtype));
  for (PlannedTensor& t : plan) {
    if (num_live_tokens > 0 && (t.entry.name == "model.embed_tokens.weight" || t.entry.name == "lm_head.weight")) {
      t.num_live_rows = num_live_tokens;
    }
  }
  std::vector<SafetensorsWriter::Entry> entries;
  for (const PlannedTensor& t : plan) entries.push_back(t.entry);
  SafetensorsWriter writer((fs::path(dir) / "model.safetensors").string(), std::move(entries));
  std::vector<float> chunk(1 << 20);
  for (const PlannedTensor& t : plan) WriteTensor(writer, t, seed, chunk);
  writer.Finish();
}

namespace {

// GPT-2's bytes_to_unicode for one byte, as UTF-8: printable Latin-1 bytes stand for themselves,
// the other 68 are shifted to U+0100 and up, in byte order.
std::string ByteLevelChar(int b) {
  auto printable = [](int x) { return (x >= 33 && x <= 126) || (x >= 161 && x <= 172) || x >= 174; };
  int cp = b;
  if (!printable(b)) {
    cp = 256;
    for (int x = 0; x < b; ++x) cp += !printable(x);
  }
  std::string out;
  if (cp < 0x80) {
    out.push_back(static_cast<char>(cp));
  } else {
    out.push_back(static_cast<char>(0xC0 | (cp >> 6)));
    out.push_back(static_cast<char>(0x80 | (cp & 0x3F)));
  }
  return out;
}

}  // namespace

void WriteByteLevelTokenizerJson(const std::string& dir, const std::vector<std::string>& words) {
  ordered_json vocab = ordered_json::object();
  for (int b = 0; b < 256; ++b) vocab[ByteLevelChar(b)] = b;
  for (size_t i = 0; i < words.size(); ++i) {
    std::string entry;
    for (char c : words[i]) entry += ByteLevelChar(static_cast<uint8_t>(c));
    vocab[entry] = 256 + static_cast<int>(i);
  }
  const ordered_json j = {{"model", {{"type", "BPE"}, {"vocab", vocab}, {"merges", ordered_json::array()}}},
                          {"added_tokens", ordered_json::array()}};
  fs::create_directories(dir);
  std::ofstream out(dir + "/tokenizer.json");
  out << j.dump();
  if (!out) throw std::runtime_error(dir + "/tokenizer.json: cannot be written");
}

}  // namespace ferry::worker
