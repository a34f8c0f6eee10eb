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

void ReplaceAll(std::string& s, std::string_view from, std::string_view to) {
  if (from.empty()) return;
  std::string out;
  size_t at = 0;
  for (size_t hit; (hit = s.find(from, at)) != std::string::npos; at = hit + from.size()) {
    out.append(s, at, hit - at);
    out += to;
  }
  if (at == 0) return;
  out.append(s, at, std::string::npos);
  s = std::move(out);
}

std::string ApplyNormalizers(const std::vector<NormalizerStep>& steps, std::string_view text) {
  std::string s(text);
  for (const NormalizerStep& step : steps) {
    switch (step.kind) {
      case NormalizerStep::Kind::kNfc: s = NormalizeNfc(s); break;
      case NormalizerStep::Kind::kPrepend:
        if (!s.empty()) s.insert(0, step.text);  // HF prepends to a non-empty piece only
        break;
      case NormalizerStep::Kind::kReplace: ReplaceAll(s, step.text, step.with); break;
    }
  }
  return s;
}

// HF matches normalized added tokens against normalised text, so their
// contents are normalised the same way first.
std::vector<AddedToken> NormalizedContents(const TokenizerSpec& spec) {
  std::vector<AddedToken> tokens = spec.added_tokens;
  for (AddedToken& token : tokens) {
    if (token.normalized) token.content = ApplyNormalizers(spec.normalizers, token.content);
  }
  return tokens;
}

// <0xXX>: a byte of ByteFallback (its value), else -1.
int FallbackByte(const std::string& token) {
  if (token.size() != 6 || token.compare(0, 3, "<0x") != 0 || token[5] != '>') return -1;
  int value = 0;
  for (int i = 3; i < 5; ++i) {
    const char c = token[i];
    const int digit = c >= '0' && c <= '9' ? c - '0' : c >= 'A' && c <= 'F' ? c - 'A' + 10 : -1;
    if (digit < 0) return -1;
    value = value * 16 + digit;
  }
  return value;
}

}  // namespace

BpeTokenizer::BpeTokenizer(const TokenizerSpec& spec, const std::string& source)
    : special_prefix_(spec.special_prefix),
      special_suffix_(spec.special_suffix),
      normalize_nfc_(std::any_of(spec.normalizers.begin(), spec.normalizers.end(),
                                 [](const NormalizerStep& s) { return s.kind == NormalizerStep::Kind::kNfc; })),
      normalizers_(spec.normalizers),
      metaspace_(spec.metaspace),
      decode_strip_(spec.decode_strip),
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
  is_byte_.assign(size, 0);
  const ByteLevelAlphabet& alphabet = ByteLevelAlphabet::Get();
  for (int32_t id = 0; id < size; ++id) {
    if (text_of[id] == nullptr) continue;
    if (!spec.model.byte_level) {
      // SentencePiece-style: <0xXX> is its byte (ByteFallback), any other token its text with
      // the replacement character back to a space (Replace / Metaspace).
      const int byte = spec.model.byte_fallback ? FallbackByte(*text_of[id]) : -1;
      if (byte >= 0) {
        token_bytes_[id] = std::string(1, static_cast<char>(byte));
        is_byte_[id] = 1;
      } else {
        token_bytes_[id] = *text_of[id];
        ReplaceAll(token_bytes_[id], spec.decode_from, spec.decode_to);
      }
    } else if (!alphabet.Decode(*text_of[id], &token_bytes_[id])) {
      // HF's ByteLevel decoder maps a token's characters back to bytes, or keeps
      // its UTF-8 as is when a character is outside the byte alphabet.
      token_bytes_[id] = *text_of[id];
    }
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
      EncodePlain(text.substr(segment.begin, segment.end - segment.begin), segment.begin == 0, &ids);
    }
  }
  return ids;
}

std::string BpeTokenizer::Normalize(std::string_view text) const {
  if (normalizers_.empty()) return std::string(text);
  return ApplyNormalizers(normalizers_, text);
}

// One stretch between raw-matched added tokens: normalise it as a whole, find
// normalized added tokens in it, and run the rest through pre-tokenizer + BPE.
void BpeTokenizer::EncodePlain(std::string_view raw_text, bool at_start, std::vector<int32_t>* ids) const {
  const std::string normalized = Normalize(raw_text);
  const std::string_view text = normalized;
  if (normalized_matcher_.empty()) return EncodeNormalized(text, at_start, ids);
  for (const Segment& segment : normalized_matcher_.Split(text)) {
    if (segment.token_id >= 0) {
      ids->push_back(segment.token_id);
    } else {
      EncodeNormalized(text.substr(segment.begin, segment.end - segment.begin), at_start && segment.begin == 0, ids);
    }
  }
}

void BpeTokenizer::EncodeNormalized(std::string_view text, bool at_start, std::vector<int32_t>* ids) const {
  if (metaspace_) {  // HF's Metaspace pre-tokenizer, then the whole piece (or each word) through BPE
    std::string s(text);
    ReplaceAll(s, " ", metaspace_->replacement);
    const bool prepend = metaspace_->prepend == MetaspaceSpec::Prepend::kAlways ||
                         (metaspace_->prepend == MetaspaceSpec::Prepend::kFirst && at_start);
    if (prepend && s.compare(0, metaspace_->replacement.size(), metaspace_->replacement) != 0) {
      s.insert(0, metaspace_->replacement);
    }
    if (!metaspace_->split) return model_.EncodeWord(s, ids);
    size_t start = 0;  // words begin at each replacement (MergedWithNext)
    for (size_t at = s.find(metaspace_->replacement, 1); at != std::string::npos;
         at = s.find(metaspace_->replacement, at + 1)) {
      if (at > start) model_.EncodeWord(std::string_view(s).substr(start, at - start), ids);
      start = at;
    }
    if (start < s.size()) model_.EncodeWord(std::string_view(s).substr(start), ids);
    return;
  }
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
  std::string run;  // consecutive <0xXX> bytes: UTF-8, or one U+FFFD per byte (HF's ByteFallback)
  auto flush_run = [&] {
    if (Utf8Lossy(run) == run) {
      bytes += run;
    } else {
      for (size_t i = 0; i < run.size(); ++i) bytes += "\xEF\xBF\xBD";
    }
    run.clear();
  };
  for (int32_t id : ids) {
    if (id >= 0 && id < vocab_size() && is_byte_[id]) {
      run += token_bytes_[id];
      continue;
    }
    if (!run.empty()) flush_run();
    AppendTokenBytes(id, skip_special, &bytes);
  }
  if (!run.empty()) flush_run();
  std::string text = Utf8Lossy(bytes);
  for (int n = 0; n < decode_strip_ && !text.empty() && text[0] == ' '; ++n) text.erase(0, 1);
  return text;
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
