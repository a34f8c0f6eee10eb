// ferry-tokenize: JSON-lines front end to the tokenizer (parity tests, scripts)
// and the writer of trained demo tokenizers.
//   ferry-tokenize --tokenizer PATH        stdin {"text": s[, "add_special_tokens": b]} -> {"ids": [...]}
//                                          stdin {"ids": [...]} -> {"text": s}
//   ferry-tokenize --train-out PATH --vocab-size N [--config-out PATH]
#include <CLI/CLI.hpp>
#include <nlohmann/json.hpp>

#include <fstream>
#include <iostream>
#include <string>

#include "gateway/tokenizer/bpe_trainer.h"
#include "gateway/tokenizer/tokenizer.h"

namespace {

using nlohmann::json;
using ferry::tokenizer::Tokenizer;

struct Options {
  std::string tokenizer_path;
  std::string train_out_path;
  std::string config_out_path;
  int32_t vocab_size = 4096;
};

// One request line to one response line; a bad line answers {"error": ...}
// so a batch caller stays in step with its inputs.
json HandleLine(const Tokenizer& tokenizer, const std::string& line) {
  try {
    const json request = json::parse(line);
    if (request.contains("text")) {
      const bool add_special_tokens = request.value("add_special_tokens", false);
      return json{{"ids", tokenizer.Encode(request.at("text").get<std::string>(), add_special_tokens)}};
    }
    if (request.contains("ids")) {
      const auto ids = request.at("ids").get<std::vector<int32_t>>();
      return json{{"text", tokenizer.Decode(ids, /*skip_special=*/false)}};
    }
    return json{{"error", "expected {\"text\": ...} or {\"ids\": [...]}"}};
  } catch (const std::exception& e) {
    return json{{"error", e.what()}};
  }
}

int Serve(const Options& options) {
  const auto tokenizer = Tokenizer::FromFile(options.tokenizer_path);
  std::ios::sync_with_stdio(false);
  std::string line;
  while (std::getline(std::cin, line)) {
    if (line.empty()) continue;
    // Replacement characters keep any decoded text valid UTF-8 for dump().
    std::cout << HandleLine(*tokenizer, line).dump(-1, ' ', false, json::error_handler_t::replace) << '\n';
    std::cout.flush();  // callers may interleave requests and replies
  }
  return 0;
}

void WriteFile(const std::string& path, const std::string& text) {
  std::ofstream file(path, std::ios::binary);
  file << text;
  if (!file.good()) throw std::runtime_error("cannot write " + path);
}

int Train(const Options& options) {
  const std::string tokenizer_json = ferry::tokenizer::TrainQwen2TokenizerJson(
      ferry::tokenizer::DefaultTrainingCorpus(), options.vocab_size,
      {"<|endoftext|>", "<|im_start|>", "<|im_end|>"});
  WriteFile(options.train_out_path, tokenizer_json);
  if (!options.config_out_path.empty()) {
    WriteFile(options.config_out_path, ferry::tokenizer::Qwen2TokenizerConfigJson(tokenizer_json));
  }
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"Ferry byte-level BPE tokenizer (Hugging Face tokenizer.json)"};
  Options options;
  auto* tokenizer_opt = app.add_option("--tokenizer", options.tokenizer_path, "tokenizer.json to serve on stdin/stdout");
  auto* train_opt = app.add_option("--train-out", options.train_out_path, "write a tokenizer.json trained on the built-in corpus");
  app.add_option("--vocab-size", options.vocab_size, "BPE vocab size for --train-out (specials come on top)");
  app.add_option("--config-out", options.config_out_path, "also write a Qwen2.5-style tokenizer_config.json");
  tokenizer_opt->excludes(train_opt);
  CLI11_PARSE(app, argc, argv);
  try {
    if (!options.train_out_path.empty()) return Train(options);
    if (!options.tokenizer_path.empty()) return Serve(options);
    std::cerr << "give --tokenizer PATH or --train-out PATH\n" << app.help();
    return 2;
  } catch (const std::exception& e) {
    std::cerr << "ferry-tokenize: " << e.what() << '\n';
    return 1;
  }
}
