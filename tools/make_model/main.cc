// ferry-make-model: writes a random-weight checkpoint of a served architecture (Qwen2, Qwen3,
// Llama, Mistral) in exactly the Hugging Face layout (config.json, generation_config.json, model.safetensors,
// tokenizer.json, tokenizer_config.json), so tests and the demo need no
// download and a real checkpoint loads through the same code.
#include <CLI/CLI.hpp>
#include <spdlog/spdlog.h>

#include <filesystem>
#include <fstream>
#include <map>

#include "common/logging.h"
#include "gateway/tokenizer/bpe_trainer.h"
#include "gateway/tokenizer/tokenizer.h"
#include "worker/arch/random_checkpoint.h"

namespace fs = std::filesystem;

namespace {

void WriteText(const fs::path& path, const std::string& text) {
  std::ofstream out(path);
  out << text;
  if (!out) throw std::runtime_error("cannot write " + path.string());
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"ferry-make-model: write a random-weight checkpoint (Hugging Face layout) of a served architecture"};
  std::string preset = "tiny", out_dir, dtype = "bfloat16";
  uint64_t seed = 0;
  int tokenizer_vocab = 0;
  const std::map<std::string, ferry::worker::ModelShape> presets = {
      {"tiny", ferry::worker::TinyShape()},
      {"qwen2.5-0.5b", ferry::worker::Qwen2_5_0_5BShape()},
      {"qwen2.5-draft", ferry::worker::Qwen2_5_DraftShape()},
      {"llama3.2-1b", ferry::worker::Llama3_2_1BShape()},
      {"qwen3-0.6b", ferry::worker::Qwen3_0_6BShape()},
      {"mistral-7b-v0.3", ferry::worker::Mistral7BV0_3Shape()},
      {"tiny-llama", ferry::worker::TinyShapeOf("LlamaForCausalLM")},
      {"tiny-qwen3", ferry::worker::TinyShapeOf("Qwen3ForCausalLM")},
      {"tiny-mistral", ferry::worker::TinyShapeOf("MistralForCausalLM")},
  };
  std::vector<std::string> names;
  for (const auto& [name, shape] : presets) names.push_back(name);
  app.add_option("--preset", preset,
                 "tiny (Qwen2, for tests), qwen2.5-0.5b (the real shape), qwen2.5-draft (a small draft model sharing "
                 "qwen2.5-0.5b's vocabulary and tokenizer, for --speculative-config draft_model), the other families' "
                 "real shapes llama3.2-1b, qwen3-0.6b and mistral-7b-v0.3, or tiny-llama, tiny-qwen3, tiny-mistral")
      ->check(CLI::IsMember(names));
  app.add_option("--out", out_dir, "Output directory")->required();
  app.add_option("--dtype", dtype, "Weight dtype on disk")->check(CLI::IsMember({"bfloat16", "float16", "float32"}));
  app.add_option("--seed", seed, "Random seed (same seed, same checkpoint)");
  app.add_option("--tokenizer-vocab", tokenizer_vocab, "BPE vocabulary to train (0: preset default)");
  CLI11_PARSE(app, argc, argv);
  ferry::InitLogging("make-model");

  try {
    ferry::worker::ModelShape shape = presets.at(preset);
    // The tokenizer is a byte-level BPE trained here in Qwen2's configuration, with ChatML's special
    // tokens and template, whatever the architecture (the families' own tokenizers: issue #55).
    if (tokenizer_vocab == 0) tokenizer_vocab = preset.rfind("tiny", 0) == 0 ? 1024 : 8192;
    tokenizer_vocab = std::min(tokenizer_vocab, shape.vocab_size - 3);
    fs::create_directories(out_dir);
    const std::vector<std::string> specials = {"<|endoftext|>", "<|im_start|>", "<|im_end|>"};
    const std::string tokenizer_json =
        ferry::tokenizer::TrainQwen2TokenizerJson(ferry::tokenizer::DefaultTrainingCorpus(), tokenizer_vocab, specials);
    WriteText(fs::path(out_dir) / "tokenizer.json", tokenizer_json);
    auto tokenizer = ferry::tokenizer::Tokenizer::FromJson(tokenizer_json);
    const int32_t im_end = tokenizer->TokenToId("<|im_end|>").value();
    const int32_t endoftext = tokenizer->TokenToId("<|endoftext|>").value();
    WriteText(fs::path(out_dir) / "tokenizer_config.json", ferry::tokenizer::Qwen2TokenizerConfigJson(tokenizer_json, shape.max_position_embeddings));
    spdlog::info("tokenizer: {} tokens (eos {} and {})", tokenizer->vocab_size(), im_end, endoftext);
    shape.bos_token_id = endoftext;
    shape.eos_token_id = im_end;
    ferry::worker::WriteRandomCheckpoint(shape, seed, dtype, out_dir, {im_end, endoftext}, tokenizer->vocab_size());
    spdlog::info("wrote {} checkpoint ({}) to {}", preset, dtype, out_dir);
  } catch (const std::exception& e) {
    spdlog::critical("{}", e.what());
    return 1;
  }
  return 0;
}
