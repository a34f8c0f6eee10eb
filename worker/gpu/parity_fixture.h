// The engine parity check's shared pieces: the cases (the ferry-make-model presets' shapes, fixed
// seeds: Qwen2 tiny and 0.5B-sized, and each other architecture of the registry at a tiny shape), the step script both engines run, and a file holding the CPU engine's result
// (its tokens, which the GPU engine is teacher-forced with, the top of every logits row and some
// whole rows) for machines that can build the GPU engine but not the CPU one
// (tests/gpu/device_check.sh on the GPU machine). The file records a hash of the checkpoint it came
// from, so a different checkpoint cannot be compared by mistake.
#pragma once

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <fstream>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

#include "worker/arch/model_config.h"
#include "worker/arch/random_checkpoint.h"
#include "worker/engine/model_runner.h"
#include "worker/lora/random_adapter.h"
#include "worker/gpu/runner_driver.h"

namespace ferry::worker::gpu::testing {

struct ParityCase {
  std::string preset;  // "tiny" | "qwen2.5-0.5b" | "tiny-qwen3" | "tiny-llama" | "tiny-mistral" | "tiny-lora"
  ModelShape shape;
  uint64_t seed = 0;
  Script script;
  // Samples whose whole logits rows the fixture keeps (all when empty); of the others it keeps
  // the top (parity_compare.h).
  std::vector<int32_t> kept_samples;
  // LoRA adapters (written beside the checkpoint, <dir>/lora-<name>) the script's sequences name.
  std::vector<std::pair<std::string, RandomAdapterSpec>> adapters;
};

inline Script MakeScript(int32_t vocab, const std::vector<int32_t>& lengths, int32_t chunk) {
  Script s;
  uint32_t x = 12345;
  for (int32_t len : lengths) {
    std::vector<int32_t> p(len);
    for (auto& t : p) t = static_cast<int32_t>(((x = x * 1664525u + 1013904223u) >> 8) % uint32_t(vocab));
    s.prompts.push_back(p);
  }
  // The last sequence shares the first one's first 32 prompt tokens through its blocks.
  s.prefix_seq = static_cast<int32_t>(lengths.size()) - 1;
  s.prefix_tokens = 32;
  std::copy_n(s.prompts[0].begin(), 32, s.prompts.back().begin());
  s.chunk = chunk;
  s.num_new = 32;
  s.num_blocks = 512;
  return s;
}

inline ParityCase MakeParityCase(const std::string& preset) {
  ParityCase c;
  c.preset = preset;
  if (preset == "tiny") {
    c.shape = TinyShape();
    c.seed = 7;
    c.script = MakeScript(c.shape.vocab_size, {40, 7, 100, 65, 48}, 32);
  } else if (preset == "qwen2.5-0.5b") {
    c.shape = Qwen2_5_0_5BShape();
    c.seed = 2024;
    c.script = MakeScript(c.shape.vocab_size, {64, 9, 200, 48}, 128);
    c.kept_samples = {0, 1, 15, 31};
  } else if (preset == "tiny-qwen3" || preset == "tiny-llama" || preset == "tiny-mistral") {
    const std::string arch = preset == "tiny-qwen3"   ? "Qwen3ForCausalLM"
                             : preset == "tiny-llama" ? "LlamaForCausalLM"
                                                      : "MistralForCausalLM";
    c.shape = TinyShapeOf(arch);
    // Qwen3's heads wider than hidden / heads, at a width the CUDA attention kernels are built for
    // (16 and 64; kernels/cuda AttentionSupported).
    if (preset == "tiny-qwen3") c.shape.head_dim = 64;
    c.seed = 11;
    c.script = MakeScript(c.shape.vocab_size, {40, 7, 100, 48}, 32);
  } else if (preset == "tiny-lora") {
    // Two adapters of different ranks and targets beside the base model in every step, one of
    // them on two sequences: the GPU engine's adapter slots against the CPU engine's segments.
    c.shape = TinyShape();
    c.seed = 7;
    c.script = MakeScript(c.shape.vocab_size, {40, 7, 100, 65, 48}, 32);
    c.script.lora_names = {"a", "", "b", "a", ""};
    RandomAdapterSpec a, b;
    a.rank = 8;
    a.seed = 21;
    b.rank = 4;
    b.seed = 22;
    b.targets = {true, false, true, false, false, true, true};  // q, v, up, down
    c.adapters = {{"a", a}, {"b", b}};
  } else {
    throw std::invalid_argument("unknown parity preset " + preset);
  }
  return c;
}

inline void WriteParityCheckpoint(const ParityCase& c, const std::string& dir) {
  WriteRandomCheckpoint(c.shape, c.seed, "bfloat16", dir, {});
  if (c.adapters.empty()) return;
  const ModelConfig config = LoadModelConfig(dir);
  for (const auto& [name, spec] : c.adapters) WriteRandomLoraAdapter(config, spec, dir + "/lora-" + name);
}

// The runner options both engines run the case with (the CPU engine's, the GPU engine's .runner).
inline RunnerOptions ParityRunnerOptions(const ParityCase& c, const std::string& dir) {
  RunnerOptions o;
  o.model_dir = dir;
  o.dtype = "bfloat16";
  o.num_kv_blocks = c.script.num_blocks;
  o.block_size = c.script.block_size;
  o.keep_logits = true;  // the trace compares logits
  if (!c.adapters.empty()) {
    o.lora.enable = true;
    o.lora.max_loras = static_cast<int32_t>(c.adapters.size());
    for (const auto& [name, spec] : c.adapters) o.lora.modules.push_back({name, dir + "/lora-" + name});
  }
  return o;
}

// FNV-1a over model.safetensors.
inline uint64_t HashCheckpoint(const std::string& dir) {
  std::ifstream in(dir + "/model.safetensors", std::ios::binary);
  if (!in) throw std::runtime_error("cannot read " + dir + "/model.safetensors");
  uint64_t h = 1469598103934665603ull;
  std::vector<char> buf(1 << 20);
  while (in) {
    in.read(buf.data(), static_cast<std::streamsize>(buf.size()));
    for (std::streamsize i = 0; i < in.gcount(); ++i) h = (h ^ static_cast<uint8_t>(buf[i])) * 1099511628211ull;
  }
  return h;
}

// Layout (version 2): magic, hash, num_seqs, then per sequence: tokens (count, ids), rows
// (count, then per sample: scale, the kTopKept (id, value) pairs of its top, vocab, then vocab
// values or, where the row was not kept, vocab 0). Every sample keeps its top, enough for the
// argmax and top-5 rules of parity_compare.h; the error over the whole row is checked on kept rows.
constexpr uint32_t kFixtureMagic = 0xfe771002;

template <typename T>
void Put(std::ofstream& out, const T& v) { out.write(reinterpret_cast<const char*>(&v), sizeof(T)); }
template <typename T>
T Get(std::ifstream& in) {
  T v{};
  in.read(reinterpret_cast<char*>(&v), sizeof(T));
  if (!in) throw std::runtime_error("truncated parity fixture");
  return v;
}

// kept: the sample indices whose whole rows are written (all when empty).
inline void WriteFixture(const std::string& path, uint64_t hash, const Trace& t, const std::vector<int32_t>& kept) {
  std::ofstream out(path, std::ios::binary);
  Put(out, kFixtureMagic);
  Put(out, hash);
  Put(out, static_cast<int32_t>(t.tokens.size()));
  for (size_t s = 0; s < t.tokens.size(); ++s) {
    Put(out, static_cast<int32_t>(t.tokens[s].size()));
    for (int32_t id : t.tokens[s]) Put(out, id);
    Put(out, static_cast<int32_t>(t.rows[s].size()));
    for (int32_t k = 0; k < static_cast<int32_t>(t.rows[s].size()); ++k) {
      const parity::LogitsRow& row = t.rows[s][k];
      if (row.top.size() != size_t{parity::kTopKept}) throw std::invalid_argument("row without its top");
      Put(out, row.scale);
      for (const auto& [id, v] : row.top) {
        Put(out, id);
        Put(out, v);
      }
      const bool keep = kept.empty() || std::find(kept.begin(), kept.end(), k) != kept.end();
      const auto vocab = static_cast<int32_t>(keep ? row.values.size() : 0);
      Put(out, vocab);
      out.write(reinterpret_cast<const char*>(row.values.data()), static_cast<std::streamsize>(vocab * sizeof(float)));
    }
  }
  if (!out) throw std::runtime_error("cannot write " + path);
}

inline Trace ReadFixture(const std::string& path, uint64_t* hash) {
  std::ifstream in(path, std::ios::binary);
  if (!in) throw std::runtime_error("cannot read " + path);
  if (Get<uint32_t>(in) != kFixtureMagic) {
    throw std::runtime_error(path + " is not a version-2 parity fixture (tests/gpu/prepare.sh writes one)");
  }
  *hash = Get<uint64_t>(in);
  Trace t;
  const int32_t n = Get<int32_t>(in);
  t.tokens.resize(n);
  t.rows.resize(n);
  for (int32_t s = 0; s < n; ++s) {
    t.tokens[s].resize(Get<int32_t>(in));
    for (auto& id : t.tokens[s]) id = Get<int32_t>(in);
    t.rows[s].resize(Get<int32_t>(in));
    for (parity::LogitsRow& row : t.rows[s]) {
      row.scale = Get<float>(in);
      row.top.resize(parity::kTopKept);
      for (auto& [id, v] : row.top) {
        id = Get<int32_t>(in);
        v = Get<float>(in);
      }
      row.values.resize(Get<int32_t>(in));
      in.read(reinterpret_cast<char*>(row.values.data()),
              static_cast<std::streamsize>(row.values.size() * sizeof(float)));
      if (!in) throw std::runtime_error("truncated parity fixture " + path);
    }
  }
  return t;
}

}  // namespace ferry::worker::gpu::testing
