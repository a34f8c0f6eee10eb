// ferry-make-model: writes a random-weight checkpoint of a served architecture (Qwen2, Qwen3,
// Llama, Mistral) in exactly the Hugging Face layout (config.json, generation_config.json,
// model.safetensors, tokenizer.json, tokenizer_config.json), with a tokenizer and chat template of
// the architecture's family, so tests and the demo need no download and a real checkpoint loads
// through the same code.
#include <CLI/CLI.hpp>
#include <spdlog/fmt/ranges.h>
#include <spdlog/spdlog.h>

#include <filesystem>
#include <fstream>
#include <map>
#include <sstream>
#include <string>
#include <vector>

#include "common/logging.h"
#include "gateway/tokenizer/bpe_trainer.h"
#include "gateway/tokenizer/tokenizer.h"
#include "worker/arch/random_checkpoint.h"
#include "worker/lora/random_adapter.h"

namespace fs = std::filesystem;

namespace {

void WriteText(const fs::path& path, const std::string& text) {
  std::ofstream out(path);
  out << text;
  if (!out) throw std::runtime_error("cannot write " + path.string());
}

// What the checkpoint takes from its tokenizer.
struct FamilyTokenizer {
  int32_t bos_id = 0;
  std::vector<int32_t> eos_ids;  // generation_config.json's, config.json's eos first
  int32_t vocab_size = 0;        // ids the tokenizer uses; the embedding rows past them are zero
};

// Trains the architecture's family of tokenizer on the demo corpus and writes tokenizer.json and
// tokenizer_config.json with its chat template: Llama 3's byte-level configuration for Llama,
// SentencePiece-style BPE with Mistral's control tokens for Mistral, Qwen2's with ChatML for Qwen2
// and Qwen3.
FamilyTokenizer WriteFamilyTokenizer(const ferry::worker::ModelShape& shape, int32_t vocab, const std::string& dir) {
  namespace tk = ferry::tokenizer;
  std::vector<std::string> specials;
  std::string bos, json, config;
  std::vector<std::string> eos;
  const std::string_view corpus = tk::DefaultTrainingCorpus();
  // Byte-level files put their special tokens after the BPE vocabulary: both fit the embedding.
  auto bpe_budget = [&] { return std::min(vocab, shape.vocab_size - static_cast<int32_t>(specials.size())); };
  if (shape.architecture == "LlamaForCausalLM") {
    specials = {"<|begin_of_text|>", "<|end_of_text|>", "<|start_header_id|>", "<|end_header_id|>", "<|eot_id|>",
                "<|python_tag|>"};
    json = tk::TrainLlama3TokenizerJson(corpus, bpe_budget(), specials);
    config = tk::Llama3TokenizerConfigJson(json, shape.max_position_embeddings);
    bos = "<|begin_of_text|>";
    eos = {"<|eot_id|>", "<|end_of_text|>"};
  } else if (shape.architecture == "MistralForCausalLM") {
    specials = {"<unk>", "<s>", "</s>", "[INST]", "[/INST]", "[TOOL_CALLS]", "[AVAILABLE_TOOLS]",
                "[/AVAILABLE_TOOLS]", "[TOOL_RESULTS]", "[/TOOL_RESULTS]"};
    // SentencePiece-style ids count the special tokens among the vocabulary.
    json = tk::TrainSentencePieceTokenizerJson(corpus, std::min(vocab, shape.vocab_size), specials);
    config = tk::MistralTokenizerConfigJson(json, shape.max_position_embeddings);
    bos = "<s>";
    eos = {"</s>"};
  } else {
    specials = {"<|endoftext|>", "<|im_start|>", "<|im_end|>"};
    json = tk::TrainQwen2TokenizerJson(corpus, bpe_budget(), specials);
    config = tk::Qwen2TokenizerConfigJson(json, shape.max_position_embeddings);
    bos = "<|endoftext|>";
    eos = {"<|im_end|>", "<|endoftext|>"};
  }
  WriteText(fs::path(dir) / "tokenizer.json", json);
  WriteText(fs::path(dir) / "tokenizer_config.json", config);
  const auto tokenizer = tk::Tokenizer::FromJson(json);
  FamilyTokenizer out;
  out.bos_id = tokenizer->TokenToId(bos).value();
  for (const std::string& e : eos) out.eos_ids.push_back(tokenizer->TokenToId(e).value());
  out.vocab_size = tokenizer->vocab_size();
  spdlog::info("tokenizer: {} tokens, bos {}, eos {}", out.vocab_size, bos, fmt::join(eos, " and "));
  return out;
}

}  // namespace

// --lora-for: one random adapter for the checkpoint at `base_dir`.
int WriteAdapter(const std::string& base_dir, const std::string& out_dir, ferry::worker::RandomAdapterSpec spec,
                 const std::string& targets, uint64_t seed, const std::string& dtype, bool alpha_given) {
  ferry::InitLogging("make-model");
  try {
    const ferry::worker::ModelConfig base = ferry::worker::LoadModelConfig(base_dir);
    nlohmann::json config = {{"r", spec.rank}, {"lora_alpha", 1}};
    if (targets == "all-linear") {
      config["target_modules"] = targets;
    } else {
      nlohmann::json list = nlohmann::json::array();
      std::stringstream in(targets);
      for (std::string name; std::getline(in, name, ',');) list.push_back(name);
      config["target_modules"] = list;
    }
    spec.targets = ferry::worker::ParseLoraAdapterConfig(config, "--lora-targets").targets;
    if (!alpha_given) spec.alpha = 2.0 * spec.rank;
    spec.seed = seed + 1;
    spec.dtype = dtype;
    spec.base_model = base.name;
    ferry::worker::WriteRandomLoraAdapter(base, spec, out_dir);
    spdlog::info("wrote a rank-{} LoRA adapter ({}) for {} to {}", spec.rank, targets, base_dir, out_dir);
  } catch (const std::exception& e) {
    spdlog::critical("{}", e.what());
    return 1;
  }
  return 0;
}

int main(int argc, char** argv) {
  CLI::App app{"ferry-make-model: write a random-weight checkpoint (Hugging Face layout) of a served architecture"};
  std::string preset = "tiny", out_dir, dtype = "bfloat16";
  uint64_t seed = 0;
  int tokenizer_vocab = 0;
  std::string lora_for, lora_targets = "all-linear";
  ferry::worker::RandomAdapterSpec lora;
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
  // A LoRA adapter instead of a checkpoint (issue #57): PEFT's layout, for the base at DIR.
  app.add_option("--lora-for", lora_for,
                 "write a random LoRA adapter (PEFT layout: adapter_config.json + adapter_model.safetensors) for the "
                 "checkpoint in this directory into --out, instead of a checkpoint");
  app.add_option("--lora-rank", lora.rank, "--lora-for: r")->check(CLI::Range(1, 512));
  app.add_option("--lora-alpha", lora.alpha, "--lora-for: lora_alpha (default 2 r)");
  app.add_flag("--lora-rslora", lora.use_rslora, "--lora-for: use_rslora");
  app.add_option("--lora-targets", lora_targets,
                 "--lora-for: target_modules, comma-separated among q_proj,k_proj,v_proj,o_proj,gate_proj,up_proj,"
                 "down_proj, or all-linear");
  CLI11_PARSE(app, argc, argv);
  if (!lora_for.empty()) return WriteAdapter(lora_for, out_dir, lora, lora_targets, seed, dtype,
                                             app.count("--lora-alpha") > 0);
  ferry::InitLogging("make-model");

  try {
    ferry::worker::ModelShape shape = presets.at(preset);
    if (tokenizer_vocab == 0) tokenizer_vocab = preset.rfind("tiny", 0) == 0 ? 1024 : 8192;
    fs::create_directories(out_dir);
    const FamilyTokenizer t = WriteFamilyTokenizer(shape, tokenizer_vocab, out_dir);
    shape.bos_token_id = t.bos_id;
    shape.eos_token_id = t.eos_ids.front();
    ferry::worker::WriteRandomCheckpoint(shape, seed, dtype, out_dir, t.eos_ids, t.vocab_size);
    spdlog::info("wrote {} checkpoint ({}) to {}", preset, dtype, out_dir);
  } catch (const std::exception& e) {
    spdlog::critical("{}", e.what());
    return 1;
  }
  return 0;
}
