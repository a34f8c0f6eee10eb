#include "gateway/tokenizer/bpe_tokenizer.h"

#include <algorithm>
#include <fstream>
#include <sstream>
#include <stdexcept>

#include "gateway/tokenizer/unicode_util.h"

namespace ferry::tokenizer {
namespace {

std::vector<RegexSplitter> CompileSplitters(const TokenizerSpec& spec, const std::string& source) {
  std::vector<RegexSplitter> splitters;
  for (const std::string& pattern : spec.split_patterns) {
    try {
      splitters.emplace_back(pattern);
    } catch (const std::runtime_error& e) {
      throw std::runtime_error("tokenizer.json '" + source + "': pre_tokenizer.Split: " + e.what());
    }
  }
  return splitters;
}

BpeModel BuildModel(const TokenizerSpec& spec, const std::string& source) {
  try {
    return BpeModel(spec.model);
  } catch (const std::runtime_error& e) {
    throw std::runtime_error("tokenizer.json '" + source + "': model.merges: " + e.what());
  }
}

// HF matches normalized added tokens against normalised text, so their
// contents are normalised the same way first.
std::vector<AddedToken> NormalizedContents(const TokenizerSpec& spec) {
  std::vector<AddedToken> tokens = spec.added_tokens;
  for (AddedToken& token : tokens) {
    if (token.normalized && spec.normalize_nfc) token.content = NormalizeNfc(token.content);
  }
  return tokens;
}

}  // namespace

BpeTokenizer::BpeTokenizer(const TokenizerSpec& spec, const std::string& source)
    : special_prefix_(spec.special_prefix),
      special_suffix_(spec.special_suffix),
      normalize_nfc_(spec.normalize_nfc),
      splitters_(CompileSplitters(spec, source)),
      model_(BuildModel(spec, source)),
      raw_matcher_(spec.added_tokens, /*normalized_pass=*/false),
      normalized_matcher_(NormalizedContents(spec), /*normalized_pass=*/true) {
  for (const AddedToken& token : spec.added_tokens) added_ids_.emplace(token.content, token.id);
  BuildDecodeTable(spec);
  for (const std::vector<int32_t>* ids : {&special_prefix_, &special_suffix_}) {
    for (int32_t id : *ids) {
      if (id >= vocab_size() || !is_known_[id]) {
        throw std::runtime_error("tokenizer.json '" + source + "': post_processor: special token id " +
                                 std::to_string(id) + " is not in the vocabulary");
      }
    }
  }
}

void BpeTokenizer::BuildDecodeTable(const TokenizerSpec& spec) {
  int32_t size = 0;
  for (const auto& [token, id] : spec.model.vocab) size = std::max(size, id + 1);
  for (const AddedToken& token : spec.added_tokens) size = std::max(size, token.id + 1);
  // Added tokens win over the model for the same id, as in HF's id_to_token.
  std::vector<const std::string*> text_of(size, nullptr);
  for (const auto& [token, id] : spec.model.vocab) text_of[id] = &token;
  for (const AddedToken& token : spec.added_tokens) text_of[token.id] = &token.content;
  std::unordered_map<std::string_view, bool> is_special_content;
  for (const AddedToken& token : spec.added_tokens) {
    if (token.special) is_special_content[token.content] = true;
  }
  token_bytes_.assign(size, std::string());
  is_known_.assign(size, 0);
  is_special_.assign(size, 0);
  const ByteLevelAlphabet& alphabet = ByteLevelAlphabet::Get();
  for (int32_t id = 0; id < size; ++id) {
    if (text_of[id] == nullptr) continue;
    // HF's ByteLevel decoder maps a token's characters back to bytes, or keeps
    // its UTF-8 as is when a character is outside the byte alphabet.
    if (!alphabet.Decode(*text_of[id], &token_bytes_[id])) token_bytes_[id] = *text_of[id];
    is_known_[id] = 1;
    // HF skips special tokens by content, whichever id carries it.
    is_special_[id] = is_special_content.count(*text_of[id]) ? 1 : 0;
    max_token_bytes_ = std::max<int64_t>(max_token_bytes_, static_cast<int64_t>(token_bytes_[id].size()));
    // An added token matches its content, which may differ from its decoded bytes.
    max_token_bytes_ = std::max<int64_t>(max_token_bytes_, static_cast<int64_t>(text_of[id]->size()));
  }
}

int64_t BpeTokenizer::MinTokensFor(size_t text_bytes) const {
  const int64_t per_token = (normalize_nfc_ ? 4 : 1) * max_token_bytes_;
  return (static_cast<int64_t>(text_bytes) + per_token - 1) / per_token;
}

std::vector<int32_t> BpeTokenizer::Encode(std::string_view text) const {
  // PCRE2 and utf8proc require valid UTF-8; Python/Rust callers cannot pass
  // anything else, and C++ callers get invalid bytes replaced by U+FFFD.
  const std::string repaired = Utf8Lossy(text);
  if (repaired != text) text = repaired;
  std::vector<int32_t> ids;
  ids.reserve(text.size() / 3 + 4);
  for (const Segment& segment : raw_matcher_.Split(text)) {
    if (segment.token_id >= 0) {
      ids.push_back(segment.token_id);
    } else {
      EncodePlain(text.substr(segment.begin, segment.end - segment.begin), &ids);
    }
  }
  return ids;
}

// One stretch between raw-matched added tokens: normalise it as a whole, find
// normalized added tokens in it, and run the rest through pre-tokenizer + BPE.
void BpeTokenizer::EncodePlain(std::string_view raw_text, std::vector<int32_t>* ids) const {
  const std::string normalized = normalize_nfc_ ? NormalizeNfc(raw_text) : std::string(raw_text);
  const std::string_view text = normalized;
  if (normalized_matcher_.empty()) return EncodeNormalized(text, ids);
  for (const Segment& segment : normalized_matcher_.Split(text)) {
    if (segment.token_id >= 0) {
      ids->push_back(segment.token_id);
    } else {
      EncodeNormalized(text.substr(segment.begin, segment.end - segment.begin), ids);
    }
  }
}

void BpeTokenizer::EncodeNormalized(std::string_view text, std::vector<int32_t>* ids) const {
  std::vector<std::string_view> pieces{text};
  std::vector<std::string_view> next;
  for (const RegexSplitter& splitter : splitters_) {
    next.clear();
    for (std::string_view piece : pieces) splitter.Split(piece, &next);
    pieces.swap(next);
  }
  for (std::string_view piece : pieces) model_.EncodeWord(piece, ids);
}

void BpeTokenizer::AppendTokenBytes(int32_t id, bool skip_special, std::string* out) const {
  if (id < 0 || id >= vocab_size() || !is_known_[id]) return;
  if (skip_special && is_special_[id]) return;
  out->append(token_bytes_[id]);
}

std::string BpeTokenizer::Decode(std::span<const int32_t> ids, bool skip_special) const {
  std::string bytes;
  for (int32_t id : ids) AppendTokenBytes(id, skip_special, &bytes);
  return Utf8Lossy(bytes);
}

std::optional<int32_t> BpeTokenizer::TokenToId(std::string_view token) const {
  const std::string key(token);
  if (auto it = added_ids_.find(key); it != added_ids_.end()) return it->second;
  if (auto it = model_.vocab().find(key); it != model_.vocab().end()) return it->second;
  return std::nullopt;
}

std::vector<int32_t> Tokenizer::Encode(std::string_view text, bool add_special_tokens) const {
  if (!add_special_tokens || (special_prefix().empty() && special_suffix().empty())) return Encode(text);
  std::vector<int32_t> ids(special_prefix().begin(), special_prefix().end());
  const std::vector<int32_t> body = Encode(text);
  ids.insert(ids.end(), body.begin(), body.end());
  ids.insert(ids.end(), special_suffix().begin(), special_suffix().end());
  return ids;
}

std::unique_ptr<Tokenizer> Tokenizer::FromJson(std::string_view json_text) {
  const std::string source = "<json>";
  return std::make_unique<BpeTokenizer>(ParseTokenizerJson(json_text, source), source);
}

std::unique_ptr<Tokenizer> Tokenizer::FromFile(const std::string& path) {
  std::ifstream file(path, std::ios::binary);
  if (!file) throw std::runtime_error("tokenizer.json '" + path + "': file: cannot open");
  std::stringstream buffer;
  buffer << file.rdbuf();
  return std::make_unique<BpeTokenizer>(ParseTokenizerJson(buffer.str(), path), path);
}

}  // namespace ferry::tokenizer
