// tokenizer.json parsing: accepts what Qwen2-style byte-level BPE files use and
// refuses the rest by name, so an unsupported file fails loudly at load time.
#include <nlohmann/json.hpp>

#include <stdexcept>

#include "gateway/tokenizer/bpe_tokenizer.h"
#include "gateway/tokenizer/unicode_util.h"

namespace ferry::tokenizer {
namespace {

using nlohmann::json;

[[noreturn]] void Fail(const std::string& source, const std::string& part, const std::string& why) {
  throw std::runtime_error("tokenizer.json '" + source + "': " + part + ": " + why);
}

std::string TypeOf(const json& node, const std::string& source, const std::string& part) {
  if (!node.is_object() || !node.contains("type") || !node["type"].is_string()) {
    Fail(source, part, "expected an object with a string \"type\"");
  }
  return node["type"].get<std::string>();
}

// Ids index the tokenizer's tables: one past kMaxTokenId would size them (and id + 1 overflow).
void CheckTokenId(int64_t id, const std::string& source, const std::string& part, const std::string& token) {
  if (id > kMaxTokenId) {
    Fail(source, part, "id " + std::to_string(id) + " of '" + token + "' is past the limit " +
                           std::to_string(kMaxTokenId));
  }
}

bool IsFalseOrAbsent(const json& node, const char* key) {
  return !node.contains(key) || node[key].is_null() || (node[key].is_boolean() && !node[key].get<bool>());
}

bool IsEmptyOrNull(const json& node, const char* key) {
  return !node.contains(key) || node[key].is_null() || (node[key].is_string() && node[key].get<std::string>().empty());
}

bool ParseNormalizer(const json& node, const std::string& source) {
  if (node.is_null()) return false;
  const std::string type = TypeOf(node, source, "normalizer");
  if (type == "NFC") return true;
  if (type == "Sequence" && node.contains("normalizers") && node["normalizers"].is_array()) {
    bool nfc = false;
    for (const json& child : node["normalizers"]) nfc = ParseNormalizer(child, source) || nfc;
    return nfc;
  }
  Fail(source, "normalizer", "unsupported type '" + type + "' (only NFC)");
}

void ParseByteLevel(const json& node, const std::string& source, TokenizerSpec* spec) {
  if (!IsFalseOrAbsent(node, "add_prefix_space")) Fail(source, "pre_tokenizer.ByteLevel", "add_prefix_space=true is unsupported");
  if (node.value("use_regex", true)) spec->split_patterns.emplace_back(kGpt2SplitPattern);
}

void ParseSplit(const json& node, const std::string& source, TokenizerSpec* spec) {
  const std::string part = "pre_tokenizer.Split";
  if (!node.contains("pattern") || !node["pattern"].is_object() || !node["pattern"].contains("Regex")) {
    Fail(source, part, "only {\"Regex\": ...} patterns are supported");
  }
  if (node.value("behavior", "") != "Isolated") Fail(source, part, "only behavior Isolated is supported");
  if (!IsFalseOrAbsent(node, "invert")) Fail(source, part, "invert=true is unsupported");
  spec->split_patterns.push_back(node["pattern"]["Regex"].get<std::string>());
}

void ParsePreTokenizer(const json& node, const std::string& source, TokenizerSpec* spec) {
  if (node.is_null()) Fail(source, "pre_tokenizer", "null is unsupported (ByteLevel is required)");
  const std::string type = TypeOf(node, source, "pre_tokenizer");
  if (type == "ByteLevel") return ParseByteLevel(node, source, spec);
  if (type != "Sequence" || !node.contains("pretokenizers") || !node["pretokenizers"].is_array()) {
    Fail(source, "pre_tokenizer", "unsupported type '" + type + "'");
  }
  const json& children = node["pretokenizers"];
  // ByteLevel must come last: it turns bytes into the symbols BPE works on.
  for (size_t i = 0; i < children.size(); ++i) {
    const std::string child_type = TypeOf(children[i], source, "pre_tokenizer.pretokenizers");
    const bool is_last = i + 1 == children.size();
    if (child_type == "Split" && !is_last) {
      ParseSplit(children[i], source, spec);
    } else if (child_type == "ByteLevel" && is_last) {
      ParseByteLevel(children[i], source, spec);
    } else {
      Fail(source, "pre_tokenizer", "unsupported '" + child_type + "' at position " + std::to_string(i) +
                                        " (expected Split... then ByteLevel)");
    }
  }
}

void ParseMerges(const json& merges, const std::string& source, BpeModelSpec* model) {
  if (!merges.is_array()) Fail(source, "model.merges", "expected an array");
  model->merges.reserve(merges.size());
  for (const json& merge : merges) {
    if (merge.is_string()) {
      const std::string text = merge.get<std::string>();
      const size_t space = text.find(' ');
      if (space == std::string::npos) Fail(source, "model.merges", "entry '" + text + "' has no space");
      model->merges.emplace_back(text.substr(0, space), text.substr(space + 1));
    } else if (merge.is_array() && merge.size() == 2 && merge[0].is_string() && merge[1].is_string()) {
      model->merges.emplace_back(merge[0].get<std::string>(), merge[1].get<std::string>());
    } else {
      Fail(source, "model.merges", "entry " + merge.dump() + " is neither \"a b\" nor [\"a\", \"b\"]");
    }
  }
}

void ParseModel(const json& node, const std::string& source, BpeModelSpec* model) {
  const std::string type = TypeOf(node, source, "model");
  if (type != "BPE") Fail(source, "model", "unsupported type '" + type + "' (only BPE)");
  if (node.contains("dropout") && !node["dropout"].is_null() && node["dropout"].get<double>() != 0.0) {
    Fail(source, "model.dropout", "dropout is unsupported");
  }
  if (!IsEmptyOrNull(node, "unk_token")) Fail(source, "model.unk_token", "unk_token is unsupported");
  if (!IsEmptyOrNull(node, "continuing_subword_prefix")) Fail(source, "model.continuing_subword_prefix", "unsupported");
  if (!IsEmptyOrNull(node, "end_of_word_suffix")) Fail(source, "model.end_of_word_suffix", "unsupported");
  if (!IsFalseOrAbsent(node, "byte_fallback")) Fail(source, "model.byte_fallback", "unsupported");
  model->ignore_merges = node.value("ignore_merges", false);
  if (!node.contains("vocab") || !node["vocab"].is_object()) Fail(source, "model.vocab", "expected an object");
  for (const auto& [token, id] : node["vocab"].items()) {
    if (!id.is_number_integer() || id.get<int64_t>() < 0) Fail(source, "model.vocab", "bad id for '" + token + "'");
    CheckTokenId(id.get<int64_t>(), source, "model.vocab", token);
    model->vocab.emplace_back(token, id.get<int32_t>());
  }
  if (!node.contains("merges")) Fail(source, "model.merges", "missing");
  ParseMerges(node["merges"], source, model);
}

std::vector<AddedToken> ParseAddedTokens(const json& node, const std::string& source) {
  std::vector<AddedToken> tokens;
  if (node.is_null()) return tokens;
  if (!node.is_array()) Fail(source, "added_tokens", "expected an array");
  for (const json& entry : node) {
    if (!entry.is_object() || !entry.contains("id") || !entry.contains("content")) {
      Fail(source, "added_tokens", "entry " + entry.dump() + " lacks id or content");
    }
    AddedToken token;
    token.content = entry["content"].get<std::string>();
    if (!entry["id"].is_number_integer()) Fail(source, "added_tokens", "bad id for '" + token.content + "'");
    if (entry["id"].get<int64_t>() < 0) Fail(source, "added_tokens", "negative id for '" + token.content + "'");
    CheckTokenId(entry["id"].get<int64_t>(), source, "added_tokens", token.content);
    token.id = entry["id"].get<int32_t>();
    token.special = entry.value("special", false);
    token.single_word = entry.value("single_word", false);
    token.lstrip = entry.value("lstrip", false);
    token.rstrip = entry.value("rstrip", false);
    token.normalized = entry.value("normalized", !token.special);
    tokens.push_back(std::move(token));
  }
  return tokens;
}

void CheckDecoder(const json& node, const std::string& source) {
  if (node.is_null()) Fail(source, "decoder", "null is unsupported (only ByteLevel)");
  const std::string type = TypeOf(node, source, "decoder");
  if (type != "ByteLevel") Fail(source, "decoder", "unsupported type '" + type + "' (only ByteLevel)");
}

// TemplateProcessing's `single`: special tokens around exactly one "$A" sequence.
void ParseTemplate(const json& node, const std::string& source, TokenizerSpec* spec) {
  const std::string part = "post_processor.TemplateProcessing";
  if (!node.contains("single") || !node["single"].is_array()) Fail(source, part, "single must be a list");
  const json specials = node.value("special_tokens", json::object());
  bool seen_sequence = false;
  for (const json& item : node["single"]) {
    if (item.contains("Sequence")) {
      if (seen_sequence || item["Sequence"].value("id", "") != "A") {
        Fail(source, part, "single must hold the sequence $A exactly once");
      }
      seen_sequence = true;
      continue;
    }
    if (!item.contains("SpecialToken") || !item["SpecialToken"].contains("id")) {
      Fail(source, part, "single holds only SpecialToken and Sequence items");
    }
    const std::string name = item["SpecialToken"]["id"].get<std::string>();
    if (!specials.contains(name) || !specials[name].contains("ids") || !specials[name]["ids"].is_array()) {
      Fail(source, part, "special token '" + name + "' has no ids in special_tokens");
    }
    std::vector<int32_t>& out = seen_sequence ? spec->special_suffix : spec->special_prefix;
    for (const json& id : specials[name]["ids"]) {
      if (!id.is_number_integer() || id.get<int64_t>() < 0 || id.get<int64_t>() > kMaxTokenId) {
        Fail(source, part, "special token '" + name + "' has an id that is not a token id");
      }
      out.push_back(id.get<int32_t>());
    }
  }
  if (!seen_sequence) Fail(source, part, "single must hold the sequence $A");
}

// The post-processor: what add_special_tokens=True adds (TemplateProcessing's single template).
// ByteLevel only adjusts offsets, which Ferry does not report; any other type would add tokens
// differently and is refused.
void ParsePostProcessor(const json& node, const std::string& source, TokenizerSpec* spec) {
  if (node.is_null()) return;
  const std::string type = TypeOf(node, source, "post_processor");
  if (type == "ByteLevel") return;
  if (type == "TemplateProcessing") return ParseTemplate(node, source, spec);
  if (type != "Sequence" || !node.contains("processors") || !node["processors"].is_array()) {
    Fail(source, "post_processor", "unsupported type '" + type + "' (ByteLevel, TemplateProcessing or a Sequence of them)");
  }
  int templates = 0;
  for (const json& child : node["processors"]) {
    const std::string child_type = TypeOf(child, source, "post_processor.processors");
    if (child_type == "TemplateProcessing" && templates++ == 0) {
      ParseTemplate(child, source, spec);
    } else if (child_type != "ByteLevel") {
      Fail(source, "post_processor", "unsupported '" + child_type + "' in its Sequence (ByteLevel and one TemplateProcessing)");
    }
  }
}

}  // namespace

TokenizerSpec ParseTokenizerJson(std::string_view json_text, const std::string& source) {
  json root;
  try {
    root = json::parse(json_text);
  } catch (const json::exception& e) {
    Fail(source, "file", std::string("not valid JSON: ") + e.what());
  }
  if (!root.is_object()) Fail(source, "file", "top level is not an object");
  if (root.contains("truncation") && !root["truncation"].is_null()) Fail(source, "truncation", "must be null");
  if (root.contains("padding") && !root["padding"].is_null()) Fail(source, "padding", "must be null");
  if (!root.contains("model")) Fail(source, "model", "missing");
  TokenizerSpec spec;
  try {
    spec.normalize_nfc = ParseNormalizer(root.value("normalizer", json()), source);
    ParsePreTokenizer(root.value("pre_tokenizer", json()), source, &spec);
    CheckDecoder(root.value("decoder", json()), source);
    ParseModel(root["model"], source, &spec.model);
    spec.added_tokens = ParseAddedTokens(root.value("added_tokens", json()), source);
    ParsePostProcessor(root.value("post_processor", json()), source, &spec);
  } catch (const json::exception& e) {
    Fail(source, "structure", std::string("unexpected JSON type: ") + e.what());
  }
  return spec;
}

}  // namespace ferry::tokenizer
