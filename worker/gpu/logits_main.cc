// ferry-gpu-logits: greedy-decodes one prompt with the GPU engine and writes the logits of every
// sample, for comparisons with other implementations (tests/gpu/hf_compare.py).
//
//   ferry-gpu-logits --model-dir DIR --prompt-len 37 --steps 8 --out PREFIX
// Writes PREFIX.json ({"prompt": [...], "generated": [...], "vocab": V}) and PREFIX.f32 (the
// logits, [steps, V] float32). The prompt is a fixed pseudo-random id sequence.
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <string>
#include <vector>

#include "worker/gpu/cuda_runner.h"

int main(int argc, char** argv) {
  using namespace ferry::worker;
  std::string dir, out;
  int prompt_len = 37, steps = 8;
  for (int i = 1; i + 1 < argc; i += 2) {
    if (!std::strcmp(argv[i], "--model-dir")) dir = argv[i + 1];
    if (!std::strcmp(argv[i], "--out")) out = argv[i + 1];
    if (!std::strcmp(argv[i], "--prompt-len")) prompt_len = std::atoi(argv[i + 1]);
    if (!std::strcmp(argv[i], "--steps")) steps = std::atoi(argv[i + 1]);
  }
  if (dir.empty() || out.empty() || prompt_len < 1 || steps < 1) {
    std::fprintf(stderr, "usage: %s --model-dir DIR --out PREFIX [--prompt-len 37] [--steps 8]\n", argv[0]);
    return 2;
  }
  try {
    gpu::CudaRunnerOptions o;
    o.runner.model_dir = dir;
    o.runner.num_kv_blocks = (prompt_len + steps) / 16 + 2;
    o.max_num_seqs = 1;
    o.max_num_batched_tokens = prompt_len;
    o.runner.keep_logits = true;
    gpu::CudaRunner runner(o);
    const int32_t vocab = runner.info().vocab_size;
    std::vector<int32_t> prompt(prompt_len), generated;
    uint32_t x = 2024;
    for (auto& t : prompt) t = static_cast<int32_t>(((x = x * 1664525u + 1013904223u) >> 8) % uint32_t(vocab));
    std::vector<int32_t> blocks;
    for (int32_t b = 0; b < o.runner.num_kv_blocks; ++b) blocks.push_back(b);
    std::ofstream logits(out + ".f32", std::ios::binary);
    StepSpec first;
    first.new_sequences.push_back({1, prompt, 0, {}, 0});
    first.scheduled.push_back({1, prompt_len, blocks});
    StepSpec spec = first;
    for (int s = 0; s < steps; ++s) {
      generated.push_back(runner.Step(spec).at(0).token_id);
      logits.write(reinterpret_cast<const char*>(runner.last_logits().data()),
                   static_cast<std::streamsize>(vocab * sizeof(float)));
      spec = StepSpec{};
      spec.scheduled.push_back({1, 1, {}});
    }
    std::ofstream meta(out + ".json");
    auto list = [](const std::vector<int32_t>& v) {
      std::string s = "[";
      for (size_t i = 0; i < v.size(); ++i) s += (i ? ", " : "") + std::to_string(v[i]);
      return s + "]";
    };
    meta << "{\"prompt\": " << list(prompt) << ", \"generated\": " << list(generated) << ", \"vocab\": " << vocab
         << "}\n";
  } catch (const std::exception& e) {
    std::fprintf(stderr, "ferry-gpu-logits: %s\n", e.what());
    return 1;
  }
  return 0;
}
