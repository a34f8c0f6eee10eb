// ferry-quant-eval: --quantization int8 against the unquantized engine on one checkpoint.
// Logits at every position of a fixed prompt set (quant_eval.h), against float32 and bfloat16:
// cosine similarity (worst and mean) and top-1 agreement. docs/benchmarks/cpu.md has the figures.
//
//   build/bin/ferry-quant-eval --model-dir DIR [--prompts 8] [--length 128] [--seed 7]
//                              [--vocab N] [--no-quantize-lm-head]
// --vocab: prompt ids are drawn below it (default the config's vocab_size; ferry-make-model's
// checkpoints have zero embeddings past their tokenizer's size, so give that).
#include <cstdio>
#include <cstdlib>
#include <string>

#include "worker/model/quant_eval.h"

namespace {

void Print(const char* what, const ferry::worker::LogitAgreement& a) {
  std::printf("%-28s %6d positions  cosine min %.5f  mean %.5f  top-1 agreement %.1f%%\n", what, a.positions,
              a.min_cosine, a.mean_cosine, 100.0 * a.top1_agree / a.positions);
}

}  // namespace

int main(int argc, char** argv) {
  using namespace ferry::worker;
  std::string dir;
  int prompts = 8, length = 128, vocab = 0;
  uint64_t seed = 7;
  bool quantize_head = true;
  for (int i = 1; i < argc; ++i) {
    const std::string arg = argv[i];
    const bool has_value = i + 1 < argc;
    if (arg == "--model-dir" && has_value) {
      dir = argv[++i];
    } else if (arg == "--prompts" && has_value) {
      prompts = std::atoi(argv[++i]);
    } else if (arg == "--length" && has_value) {
      length = std::atoi(argv[++i]);
    } else if (arg == "--vocab" && has_value) {
      vocab = std::atoi(argv[++i]);
    } else if (arg == "--seed" && has_value) {
      seed = std::strtoull(argv[++i], nullptr, 10);
    } else if (arg == "--no-quantize-lm-head") {
      quantize_head = false;
    } else {
      std::fprintf(stderr, "usage: %s --model-dir DIR [--prompts N] [--length N] [--seed N] [--vocab N] [--no-quantize-lm-head]\n",
                   argv[0]);
      return 2;
    }
  }
  if (dir.empty() || prompts <= 0 || length <= 0) {
    std::fprintf(stderr, "--model-dir is required; --prompts and --length must be positive\n");
    return 2;
  }
  try {
    ModelOptions int8_options;
    int8_options.quantization = Quantization::kInt8;
    int8_options.quantize_lm_head = quantize_head;
    auto int8 = CpuModel::Load(dir, int8_options);
    if (vocab < 0 || vocab > int8->config().vocab_size) {
      std::fprintf(stderr, "--vocab %d is outside [0, vocab_size %d]\n", vocab, int8->config().vocab_size);
      return 2;
    }
    if (vocab == 0) vocab = int8->config().vocab_size;
    const auto set = FixedPromptSet(vocab, prompts, length, seed);
    std::printf("%s: %d prompts x %d tokens below id %d (seed %llu), int8%s\n", dir.c_str(), prompts, length, vocab,
                static_cast<unsigned long long>(seed), quantize_head ? "" : " (lm_head float32)");
    {
      auto fp32 = CpuModel::Load(dir, {});
      Print("int8 vs float32", CompareLogits(*fp32, *int8, set));
    }
    if (Bf16MatmulAvailable()) {
      ModelOptions bf16_options;
      bf16_options.dtype = MatmulDtype::kBfloat16;
      auto bf16 = CpuModel::Load(dir, bf16_options);
      Print("int8 vs bfloat16", CompareLogits(*bf16, *int8, set));
      auto fp32 = CpuModel::Load(dir, {});
      Print("bfloat16 vs float32 (scale)", CompareLogits(*fp32, *bf16, set));
    }
  } catch (const std::exception& e) {
    std::fprintf(stderr, "ferry-quant-eval: %s\n", e.what());
    return 1;
  }
  return 0;
}
