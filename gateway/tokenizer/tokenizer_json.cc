// tokenizer.json parsing: accepts what the byte-level BPE files of Qwen2, Qwen3 and Llama 3 use,
// and the SentencePiece-style BPE files of Mistral and Llama 2 (byte fallback, Prepend/Replace or
// Metaspace, the Replace/ByteFallback/Fuse/Strip decoders), and refuses the rest by name, so an
// unsupported file fails loudly at load time.
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

// Replace's {"String": s} pattern (a regex pattern is refused).
std::string StringPattern(const json& node, const std::string& source, const std::string& part) {
  if (!node.contains("pattern") || !node["pattern"].is_object() || !node["pattern"].contains("String") ||
      !node["pattern"]["String"].is_string()) {
    Fail(source, part, "only {\"String\": ...} patterns are supported");
  }
  const std::string s = node["pattern"]["String"].get<std::string>();
  if (s.empty()) Fail(source, part, "an empty pattern is unsupported");
  if (!node.contains("content") || !node["content"].is_string()) Fail(source, part, "content must be a string");
  return s;
}

void ParseNormalizer(const json& node, const std::string& source, TokenizerSpec* spec) {
  if (node.is_null()) return;
  const std::string type = TypeOf(node, source, "normalizer");
  if (type == "NFC") {
    spec->normalizers.push_back({NormalizerStep::Kind::kNfc, "", ""});
  } else if (type == "Prepend") {
    if (!node.contains("prepend") || !node["prepend"].is_string()) Fail(source, "normalizer.Prepend", "prepend must be a string");
    spec->normalizers.push_back({NormalizerStep::Kind::kPrepend, node["prepend"].get<std::string>(), ""});
  } else if (type == "Replace") {
    const std::string from = StringPattern(node, source, "normalizer.Replace");
    spec->normalizers.push_back({NormalizerStep::Kind::kReplace, from, node["content"].get<std::string>()});
  } else if (type == "Sequence" && node.contains("normalizers") && node["normalizers"].is_array()) {
    for (const json& child : node["normalizers"]) ParseNormalizer(child, source, spec);
  } else {
    Fail(source, "normalizer", "unsupported type '" + type + "' (NFC, Prepend, Replace or a Sequence of them)");
  }
}

void ParseMetaspace(const json& node, const std::string& source, TokenizerSpec* spec) {
  MetaspaceSpec m;
  if (!node.contains("replacement") || !node["replacement"].is_string() || node["replacement"].get<std::string>().empty()) {
    Fail(source, "pre_tokenizer.Metaspace", "replacement must be a character");
  }
  m.replacement = node["replacement"].get<std::string>();
  const std::string scheme = node.value("prepend_scheme", node.value("add_prefix_space", true) ? "always" : "never");
  if (scheme == "always") m.prepend = MetaspaceSpec::Prepend::kAlways;
  else if (scheme == "first") m.prepend = MetaspaceSpec::Prepend::kFirst;
  else if (scheme == "never") m.prepend = MetaspaceSpec::Prepend::kNever;
  else Fail(source, "pre_tokenizer.Metaspace", "prepend_scheme '" + scheme + "' is unsupported (always, first, never)");
  m.split = node.value("split", true);
  spec->metaspace = m;
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

// Sets model.byte_level: ByteLevel makes a byte-level file; none, or Metaspace, a
// SentencePiece-style one.
void ParsePreTokenizer(const json& node, const std::string& source, TokenizerSpec* spec) {
  spec->model.byte_level = false;
  if (node.is_null()) return;
  const std::string type = TypeOf(node, source, "pre_tokenizer");
  if (type == "Metaspace") return ParseMetaspace(node, source, spec);
  spec->model.byte_level = true;
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
  if (!IsEmptyOrNull(node, "continuing_subword_prefix")) Fail(source, "model.continuing_subword_prefix", "unsupported");
  if (!IsEmptyOrNull(node, "end_of_word_suffix")) Fail(source, "model.end_of_word_suffix", "unsupported");
  // SentencePiece-style files only: a byte-level vocabulary has every byte's symbol.
  const bool byte_fallback = !IsFalseOrAbsent(node, "byte_fallback");
  if (model->byte_level && byte_fallback) Fail(source, "model.byte_fallback", "unsupported with a ByteLevel pre_tokenizer");
  if (model->byte_level && !IsEmptyOrNull(node, "unk_token")) {
    Fail(source, "model.unk_token", "unsupported with a ByteLevel pre_tokenizer");
  }
  model->byte_fallback = byte_fallback;
  if (!IsEmptyOrNull(node, "unk_token")) model->unk_token = node["unk_token"].get<std::string>();
  model->fuse_unk = node.value("fuse_unk", false);
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

// A byte-level file decodes with ByteLevel; a SentencePiece-style one with Metaspace, or a
// Sequence of Replace (the replacement back to a space), ByteFallback, Fuse and Strip (leading
// spaces), the chain transformers' LlamaConverter writes.
void ParseDecoder(const json& node, const std::string& source, TokenizerSpec* spec) {
  if (node.is_null()) Fail(source, "decoder", "null is unsupported");
  const std::string type = TypeOf(node, source, "decoder");
  if (spec->model.byte_level) {
    if (type != "ByteLevel") Fail(source, "decoder", "unsupported type '" + type + "' with a ByteLevel pre_tokenizer");
    return;
  }
  const std::string part = "decoder (SentencePiece-style)";
  if (type == "Metaspace") {
    if (!node.contains("replacement") || !node["replacement"].is_string()) Fail(source, "decoder.Metaspace", "replacement");
    spec->decode_from = node["replacement"].get<std::string>();
    spec->decode_to = " ";
    spec->decode_strip = node.value("prepend_scheme", "always") == "never" ? 0 : 1;
    return;
  }
  if (type != "Sequence" || !node.contains("decoders") || !node["decoders"].is_array()) {
    Fail(source, part, "unsupported type '" + type + "' (Metaspace, or a Sequence of Replace, ByteFallback, Fuse, Strip)");
  }
  bool byte_fallback = false;
  for (const json& child : node["decoders"]) {
    const std::string child_type = TypeOf(child, source, "decoder.decoders");
    if (child_type == "Replace" && spec->decode_from.empty()) {
      spec->decode_from = StringPattern(child, source, "decoder.Replace");
      spec->decode_to = child["content"].get<std::string>();
    } else if (child_type == "ByteFallback") {
      byte_fallback = true;
    } else if (child_type == "Fuse") {
    } else if (child_type == "Strip" && child.value("content", "") == " " && child.value("stop", 0) == 0) {
      spec->decode_strip = child.value("start", 0);
      if (spec->decode_strip < 0 || spec->decode_strip > 16) Fail(source, "decoder.Strip", "start out of range");
    } else {
      Fail(source, part, "unsupported '" + child_type + "' in its Sequence (Replace, ByteFallback, Fuse, Strip of \" \" "
                         "at the start)");
    }
  }
  if (spec->model.byte_fallback && !byte_fallback) Fail(source, part, "model.byte_fallback needs a ByteFallback decoder");
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
    ParseNormalizer(root.value("normalizer", json()), source, &spec);
    ParsePreTokenizer(root.value("pre_tokenizer", json()), source, &spec);
    ParseModel(root["model"], source, &spec.model);
    ParseDecoder(root.value("decoder", json()), source, &spec);
    spec.added_tokens = ParseAddedTokens(root.value("added_tokens", json()), source);
    ParsePostProcessor(root.value("post_processor", json()), source, &spec);
  } catch (const json::exception& e) {
    Fail(source, "structure", std::string("unexpected JSON type: ") + e.what());
  }
  return spec;
}

}  // namespace ferry::tokenizer
