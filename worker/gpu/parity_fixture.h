// The engine parity check's shared pieces: the two cases (the ferry-make-model presets' shapes,
// fixed seeds), the step script both engines run, and a file holding the CPU engine's result
// (tokens and some logits rows) for machines that can build the GPU engine but not the CPU one
// (tests/gpu/run.sh on the GPU machine). The file records a hash of the checkpoint it came
// from, so a different checkpoint cannot be compared by mistake.
#pragma once

#include <cstdint>
#include <cstdio>
#include <fstream>
#include <stdexcept>
#include <string>
#include <vector>

#include "worker/gpu/runner_driver.h"
#include "worker/model/random_checkpoint.h"

namespace ferry::worker::gpu::testing {

struct ParityCase {
  std::string preset;  // "tiny" | "qwen2.5-0.5b"
  Qwen2Shape shape;
  uint64_t seed = 0;
  Script script;
  // Samples whose full logits rows the fixture keeps (all when empty).
  std::vector<int32_t> kept_samples;
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
  } else {
    throw std::invalid_argument("unknown parity preset " + preset);
  }
  return c;
}

inline void WriteParityCheckpoint(const ParityCase& c, const std::string& dir) {
  WriteRandomQwen2Checkpoint(c.shape, c.seed, "bfloat16", dir, {});
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

// Layout: magic, hash, num_seqs, then per sequence: tokens (count, ids), logits rows (count,
// then per row: sample index, vocab, values). Rows not kept are absent.
constexpr uint32_t kFixtureMagic = 0xfe771001;

template <typename T>
void Put(std::ofstream& out, const T& v) { out.write(reinterpret_cast<const char*>(&v), sizeof(T)); }
template <typename T>
T Get(std::ifstream& in) {
  T v{};
  in.read(reinterpret_cast<char*>(&v), sizeof(T));
  if (!in) throw std::runtime_error("truncated parity fixture");
  return v;
}

inline void WriteFixture(const std::string& path, uint64_t hash, const Trace& t, const std::vector<int32_t>& kept) {
  std::ofstream out(path, std::ios::binary);
  Put(out, kFixtureMagic);
  Put(out, hash);
  Put(out, static_cast<int32_t>(t.tokens.size()));
  for (size_t s = 0; s < t.tokens.size(); ++s) {
    Put(out, static_cast<int32_t>(t.tokens[s].size()));
    for (int32_t id : t.tokens[s]) Put(out, id);
    std::vector<int32_t> rows;
    for (int32_t k = 0; k < static_cast<int32_t>(t.logits[s].size()); ++k) {
      if (kept.empty() || std::find(kept.begin(), kept.end(), k) != kept.end()) rows.push_back(k);
    }
    Put(out, static_cast<int32_t>(rows.size()));
    for (int32_t k : rows) {
      Put(out, k);
      Put(out, static_cast<int32_t>(t.logits[s][k].size()));
      out.write(reinterpret_cast<const char*>(t.logits[s][k].data()),
                static_cast<std::streamsize>(t.logits[s][k].size() * sizeof(float)));
    }
  }
  if (!out) throw std::runtime_error("cannot write " + path);
}

// The trace's logits rows that were not kept are left empty.
inline Trace ReadFixture(const std::string& path, uint64_t* hash) {
  std::ifstream in(path, std::ios::binary);
  if (!in) throw std::runtime_error("cannot read " + path);
  if (Get<uint32_t>(in) != kFixtureMagic) throw std::runtime_error(path + " is not a parity fixture");
  *hash = Get<uint64_t>(in);
  Trace t;
  const int32_t n = Get<int32_t>(in);
  t.tokens.resize(n);
  t.logits.resize(n);
  for (int32_t s = 0; s < n; ++s) {
    t.tokens[s].resize(Get<int32_t>(in));
    for (auto& id : t.tokens[s]) id = Get<int32_t>(in);
    t.logits[s].resize(t.tokens[s].size());
    const int32_t rows = Get<int32_t>(in);
    for (int32_t r = 0; r < rows; ++r) {
      const int32_t k = Get<int32_t>(in), vocab = Get<int32_t>(in);
      t.logits[s].at(k).resize(vocab);
      in.read(reinterpret_cast<char*>(t.logits[s][k].data()), static_cast<std::streamsize>(vocab * sizeof(float)));
    }
  }
  return t;
}

}  // namespace ferry::worker::gpu::testing
