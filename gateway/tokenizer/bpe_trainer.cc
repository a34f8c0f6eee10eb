#include "gateway/tokenizer/bpe_trainer.h"

#include <nlohmann/json.hpp>

#include <algorithm>
#include <cstdio>
#include <map>
#include <stdexcept>
#include <queue>
#include <unordered_map>

#include "gateway/tokenizer/regex_splitter.h"
#include "gateway/tokenizer/unicode_util.h"

namespace ferry::tokenizer {
namespace {

using OrderedJson = nlohmann::ordered_json;

constexpr std::string_view kMetaspace = "\xe2\x96\x81";  // ▁, SentencePiece's space

struct Word {
  std::vector<int32_t> symbols;
  int64_t count = 0;
};

uint64_t PairKey(int32_t left, int32_t right) {
  return (static_cast<uint64_t>(static_cast<uint32_t>(left)) << 32) | static_cast<uint32_t>(right);
}
int32_t LeftOf(uint64_t key) { return static_cast<int32_t>(key >> 32); }
int32_t RightOf(uint64_t key) { return static_cast<int32_t>(key & 0xFFFFFFFFu); }

// Pre-tokenises the corpus as a byte-level tokenizer will (NFC when `nfc`, then `pattern`), and
// counts each distinct piece; std::map keeps the word order (and so training) deterministic.
std::vector<Word> CountByteLevelWords(std::string_view corpus, std::string_view pattern, bool nfc) {
  const std::string text = nfc ? NormalizeNfc(Utf8Lossy(corpus)) : Utf8Lossy(corpus);
  const RegexSplitter splitter(pattern);
  std::vector<std::string_view> pieces;
  splitter.Split(text, &pieces);
  std::map<std::string_view, int64_t> counts;
  for (std::string_view piece : pieces) ++counts[piece];
  std::array<int32_t, 256> id_of_byte{};
  const ByteLevelAlphabet& alphabet = ByteLevelAlphabet::Get();
  for (int rank = 0; rank < 256; ++rank) id_of_byte[alphabet.ByteAtRank(rank)] = rank;
  std::vector<Word> words;
  words.reserve(counts.size());
  for (const auto& [piece, count] : counts) {
    Word word{{}, count};
    for (unsigned char b : piece) word.symbols.push_back(id_of_byte[b]);
    words.push_back(std::move(word));
  }
  return words;
}

// Pair frequencies over all words, with a lazily updated max-heap: entries
// whose count is stale are re-pushed with the current count when popped.
class PairStats {
 public:
  explicit PairStats(const std::vector<Word>& words) {
    for (int32_t i = 0; i < static_cast<int32_t>(words.size()); ++i) {
      Add(words[i], i, /*track_pairs_with=*/-1);
    }
    for (const auto& [key, count] : counts_) heap_.push({count, key});
  }

  // Adds (or with a negative count removes) a word's pairs. Records the word
  // under pairs that contain `track_pairs_with` (all pairs when -1).
  void Add(const Word& word, int32_t index, int32_t track_pairs_with, int64_t sign = 1) {
    for (size_t i = 0; i + 1 < word.symbols.size(); ++i) {
      const uint64_t key = PairKey(word.symbols[i], word.symbols[i + 1]);
      counts_[key] += sign * word.count;
      const bool track = track_pairs_with < 0 || word.symbols[i] == track_pairs_with ||
                         word.symbols[i + 1] == track_pairs_with;
      if (sign > 0 && track) {
        words_with_[key].push_back(index);
        if (track_pairs_with >= 0) touched_.push_back(key);
      }
    }
  }

  // The most frequent pair (ties: smallest key); false when none is left.
  bool PopBest(uint64_t* key) {
    for (const uint64_t k : touched_) heap_.push({counts_[k], k});
    touched_.clear();
    while (!heap_.empty()) {
      const Entry top = heap_.top();
      heap_.pop();
      const int64_t current = counts_[top.key];
      if (current <= 0) continue;
      if (current != top.count) {
        heap_.push({current, top.key});
        continue;
      }
      *key = top.key;
      return true;
    }
    return false;
  }

  // Indexes of words that may contain the pair, each once; forgets the pair.
  std::vector<int32_t> TakeWordsWith(uint64_t key) {
    std::vector<int32_t> indexes = std::move(words_with_[key]);
    words_with_.erase(key);
    std::sort(indexes.begin(), indexes.end());
    indexes.erase(std::unique(indexes.begin(), indexes.end()), indexes.end());
    return indexes;
  }

 private:
  struct Entry {
    int64_t count;
    uint64_t key;
    bool operator<(const Entry& o) const { return count != o.count ? count < o.count : key > o.key; }
  };
  std::unordered_map<uint64_t, int64_t> counts_;
  std::unordered_map<uint64_t, std::vector<int32_t>> words_with_;
  std::priority_queue<Entry> heap_;
  std::vector<uint64_t> touched_;
};

// Replaces non-overlapping occurrences of (left, right), left to right.
bool MergeInWord(int32_t left, int32_t right, int32_t new_id, Word* word) {
  std::vector<int32_t>& s = word->symbols;
  size_t out = 0;
  bool changed = false;
  for (size_t i = 0; i < s.size(); ++i) {
    if (i + 1 < s.size() && s[i] == left && s[i + 1] == right) {
      s[out++] = new_id;
      ++i;
      changed = true;
    } else {
      s[out++] = s[i];
    }
  }
  s.resize(out);
  return changed;
}

struct TrainedBpe {
  std::vector<std::string> tokens;  // indexed by id: the initial symbols, then one per new merge
  std::vector<std::pair<int32_t, int32_t>> merges;
};

// BPE over `words`, whose symbols are ids of `initial` (the tokens that start the vocabulary), until
// the vocabulary holds vocab_size tokens or no pair is left.
TrainedBpe TrainBpe(std::vector<Word> words, std::vector<std::string> initial, int32_t vocab_size) {
  TrainedBpe bpe;
  bpe.tokens = std::move(initial);
  std::unordered_map<std::string, int32_t> id_of;
  for (int32_t id = 0; id < static_cast<int32_t>(bpe.tokens.size()); ++id) id_of.emplace(bpe.tokens[id], id);
  PairStats stats(words);
  uint64_t key = 0;
  while (static_cast<int32_t>(bpe.tokens.size()) < vocab_size && stats.PopBest(&key)) {
    const int32_t left = LeftOf(key), right = RightOf(key);
    const std::string text = bpe.tokens[left] + bpe.tokens[right];
    // Different splits can spell the same token; it then keeps its first id.
    auto [it, is_new] = id_of.emplace(text, static_cast<int32_t>(bpe.tokens.size()));
    if (is_new) bpe.tokens.push_back(text);
    bpe.merges.emplace_back(left, right);
    for (const int32_t index : stats.TakeWordsWith(key)) {
      Word& word = words[index];
      Word before = word;
      if (!MergeInWord(left, right, it->second, &word)) continue;
      stats.Add(before, index, -1, /*sign=*/-1);
      stats.Add(word, index, it->second);
    }
  }
  return bpe;
}

// The 256 byte symbols in GPT-2's bytes_to_unicode order.
std::vector<std::string> ByteLevelSymbols() {
  const ByteLevelAlphabet& alphabet = ByteLevelAlphabet::Get();
  std::vector<std::string> symbols;
  for (int rank = 0; rank < 256; ++rank) symbols.push_back(alphabet.CharOf(alphabet.ByteAtRank(rank)));
  return symbols;
}

OrderedJson ByteLevelJson() {
  return OrderedJson{{"type", "ByteLevel"}, {"add_prefix_space", false}, {"trim_offsets", false}, {"use_regex", false}};
}

OrderedJson AddedTokenJson(int32_t id, const std::string& content) {
  return OrderedJson{{"id", id},         {"content", content}, {"single_word", false}, {"lstrip", false},
                     {"rstrip", false},  {"normalized", false}, {"special", true}};
}

OrderedJson PreTokenizerJson(std::string_view pattern) {
  OrderedJson split{{"type", "Split"},
                    {"pattern", {{"Regex", std::string(pattern)}}},
                    {"behavior", "Isolated"},
                    {"invert", false}};
  return OrderedJson{{"type", "Sequence"}, {"pretokenizers", OrderedJson::array({split, ByteLevelJson()})}};
}

// The BPE model: byte-level (no unknown token), or SentencePiece-style (unk_token "<unk>", fused,
// byte fallback), as each family's file has it.
OrderedJson ModelJson(const TrainedBpe& bpe, bool sentencepiece) {
  OrderedJson vocab = OrderedJson::object();
  // ordered_map's own insert searches linearly (quadratic here); tokens are
  // unique, so append to its underlying vector directly.
  auto& entries = static_cast<std::vector<std::pair<const std::string, OrderedJson>>&>(
      vocab.get_ref<OrderedJson::object_t&>());
  entries.reserve(bpe.tokens.size());
  for (size_t id = 0; id < bpe.tokens.size(); ++id) entries.emplace_back(bpe.tokens[id], id);
  OrderedJson merges = OrderedJson::array();
  // Neither kind of symbol contains U+0020 (byte-level maps it, SentencePiece-style writes "▁"), so
  // the "a b" form is unambiguous.
  for (const auto& [left, right] : bpe.merges) merges.push_back(bpe.tokens[left] + " " + bpe.tokens[right]);
  const OrderedJson unk = sentencepiece ? OrderedJson("<unk>") : OrderedJson(nullptr);
  const OrderedJson affix = sentencepiece ? OrderedJson(nullptr) : OrderedJson("");
  return OrderedJson{{"type", "BPE"},          {"dropout", nullptr},         {"unk_token", unk},
                     {"continuing_subword_prefix", affix}, {"end_of_word_suffix", affix}, {"fuse_unk", sentencepiece},
                     {"byte_fallback", sentencepiece}, {"ignore_merges", false}, {"vocab", std::move(vocab)},
                     {"merges", std::move(merges)}};
}

// TemplateProcessing that puts `bos` (id `bos_id`) before each text, and before each of a pair.
OrderedJson BosTemplateJson(const std::string& bos, int32_t bos_id) {
  const OrderedJson special{{"SpecialToken", {{"id", bos}, {"type_id", 0}}}};
  auto seq = [](const char* id, int type_id) { return OrderedJson{{"Sequence", {{"id", id}, {"type_id", type_id}}}}; };
  return OrderedJson{{"type", "TemplateProcessing"},
                     {"single", OrderedJson::array({special, seq("A", 0)})},
                     {"pair", OrderedJson::array({special, seq("A", 0), OrderedJson{{"SpecialToken", {{"id", bos}, {"type_id", 1}}}},
                                                  seq("B", 1)})},
                     {"special_tokens", {{bos, {{"id", bos}, {"ids", {bos_id}}, {"tokens", {bos}}}}}}};
}

// Counts the words of a SentencePiece-style tokenizer: the text with "▁" prepended and for every
// space (its normaliser), cut before each "▁" (SentencePiece's split_by_whitespace), each word a
// sequence of characters. The most frequent characters that together make up kCharacterCoverage
// of the text (SentencePiece's default), and at most half of what vocab_size leaves after
// `symbols` (so merges get the other half), get ids, appended to `symbols`, most frequent first
// (ties: smaller text); the rarest are left to byte fallback, and words are cut around them so no
// merge spans one.
std::vector<Word> CountSentencePieceWords(std::string_view corpus, int32_t vocab_size, std::vector<std::string>* symbols) {
  static constexpr double kCharacterCoverage = 0.9995;
  std::string text(kMetaspace);
  for (char c : Utf8Lossy(corpus)) {
    if (c == ' ') {
      text += kMetaspace;
    } else {
      text += c;
    }
  }
  std::vector<std::string> chars;  // the text's characters, in order
  for (size_t i = 0; i < text.size();) {
    const auto lead = static_cast<unsigned char>(text[i]);  // valid UTF-8 (Utf8Lossy)
    const size_t n = lead < 0x80 ? 1 : lead < 0xE0 ? 2 : lead < 0xF0 ? 3 : 4;
    chars.push_back(text.substr(i, n));
    i += n;
  }
  std::map<std::string, int64_t> char_counts;
  for (const std::string& c : chars) ++char_counts[c];
  std::vector<std::pair<std::string, int64_t>> by_count(char_counts.begin(), char_counts.end());
  std::stable_sort(by_count.begin(), by_count.end(), [](const auto& a, const auto& b) { return a.second > b.second; });
  std::unordered_map<std::string, int32_t> id_of;
  const size_t max_chars = static_cast<size_t>(std::max<int64_t>(0, (vocab_size - int64_t{static_cast<int64_t>(symbols->size())}) / 2));
  int64_t covered = 0;
  for (const auto& [c, count] : by_count) {
    if (static_cast<double>(covered) >= kCharacterCoverage * static_cast<double>(chars.size())) break;
    if (id_of.size() == max_chars) break;
    covered += count;
    id_of.emplace(c, static_cast<int32_t>(symbols->size()));
    symbols->push_back(c);
  }
  std::map<std::vector<int32_t>, int64_t> counts;
  std::vector<int32_t> word;
  auto end_word = [&] {
    if (!word.empty()) ++counts[word];
    word.clear();
  };
  for (const std::string& c : chars) {
    if (c == kMetaspace) end_word();
    const auto it = id_of.find(c);
    if (it == id_of.end()) {
      end_word();
      continue;
    }
    word.push_back(it->second);
  }
  end_word();
  std::vector<Word> words;
  for (const auto& [symbols_of_word, count] : counts) words.push_back(Word{symbols_of_word, count});
  return words;
}

}  // namespace

std::string TrainQwen2TokenizerJson(std::string_view corpus, int32_t vocab_size,
                                    const std::vector<std::string>& special_tokens) {
  const TrainedBpe bpe = TrainBpe(CountByteLevelWords(corpus, kQwen2SplitPattern, /*nfc=*/true), ByteLevelSymbols(),
                                  vocab_size);
  OrderedJson added = OrderedJson::array();
  int32_t next_id = static_cast<int32_t>(bpe.tokens.size());
  for (const std::string& special : special_tokens) added.push_back(AddedTokenJson(next_id++, special));
  OrderedJson root{{"version", "1.0"},
                   {"truncation", nullptr},
                   {"padding", nullptr},
                   {"added_tokens", std::move(added)},
                   {"normalizer", {{"type", "NFC"}}},
                   {"pre_tokenizer", PreTokenizerJson(kQwen2SplitPattern)},
                   {"post_processor", ByteLevelJson()},
                   {"decoder", ByteLevelJson()},
                   {"model", ModelJson(bpe, /*sentencepiece=*/false)}};
  return root.dump(2) + "\n";
}

std::string TrainLlama3TokenizerJson(std::string_view corpus, int32_t vocab_size,
                                     const std::vector<std::string>& special_tokens) {
  if (special_tokens.empty()) throw std::invalid_argument("a Llama 3 tokenizer needs its BOS token");
  const TrainedBpe bpe = TrainBpe(CountByteLevelWords(corpus, kLlama3SplitPattern, /*nfc=*/false), ByteLevelSymbols(),
                                  vocab_size);
  OrderedJson added = OrderedJson::array();
  const auto bos_id = static_cast<int32_t>(bpe.tokens.size());
  int32_t next_id = bos_id;
  for (const std::string& special : special_tokens) added.push_back(AddedTokenJson(next_id++, special));
  OrderedJson root{{"version", "1.0"},
                   {"truncation", nullptr},
                   {"padding", nullptr},
                   {"added_tokens", std::move(added)},
                   {"normalizer", nullptr},
                   {"pre_tokenizer", PreTokenizerJson(kLlama3SplitPattern)},
                   {"post_processor", {{"type", "Sequence"},
                                       {"processors", OrderedJson::array({OrderedJson{{"type", "ByteLevel"},
                                                                                       {"add_prefix_space", true},
                                                                                       {"trim_offsets", false},
                                                                                       {"use_regex", true}},
                                                                           BosTemplateJson(special_tokens[0], bos_id)})}}},
                   {"decoder", ByteLevelJson()},
                   {"model", ModelJson(bpe, /*sentencepiece=*/false)}};
  return root.dump(2) + "\n";
}

std::string TrainSentencePieceTokenizerJson(std::string_view corpus, int32_t vocab_size,
                                            const std::vector<std::string>& special_tokens) {
  if (special_tokens.size() < 3) throw std::invalid_argument("a SentencePiece-style tokenizer needs <unk>, <s>, </s>");
  std::vector<std::string> symbols = special_tokens;
  for (int b = 0; b < 256; ++b) {
    char hex[8];
    std::snprintf(hex, sizeof(hex), "<0x%02X>", b);
    symbols.push_back(hex);
  }
  std::vector<Word> words = CountSentencePieceWords(corpus, vocab_size, &symbols);
  const TrainedBpe bpe = TrainBpe(std::move(words), std::move(symbols), vocab_size);
  OrderedJson added = OrderedJson::array();
  for (int32_t id = 0; id < static_cast<int32_t>(special_tokens.size()); ++id) {
    added.push_back(AddedTokenJson(id, special_tokens[static_cast<size_t>(id)]));
  }
  const std::string space(kMetaspace);
  const OrderedJson normalizer{
      {"type", "Sequence"},
      {"normalizers", OrderedJson::array({OrderedJson{{"type", "Prepend"}, {"prepend", space}},
                                          OrderedJson{{"type", "Replace"}, {"pattern", {{"String", " "}}}, {"content", space}}})}};
  const OrderedJson decoder{
      {"type", "Sequence"},
      {"decoders", OrderedJson::array({OrderedJson{{"type", "Replace"}, {"pattern", {{"String", space}}}, {"content", " "}},
                                       OrderedJson{{"type", "ByteFallback"}}, OrderedJson{{"type", "Fuse"}},
                                       OrderedJson{{"type", "Strip"}, {"content", " "}, {"start", 1}, {"stop", 0}}})}};
  OrderedJson root{{"version", "1.0"},
                   {"truncation", nullptr},
                   {"padding", nullptr},
                   {"added_tokens", std::move(added)},
                   {"normalizer", normalizer},
                   {"pre_tokenizer", nullptr},
                   {"post_processor", BosTemplateJson(special_tokens[1], 1)},
                   {"decoder", decoder},
                   {"model", ModelJson(bpe, /*sentencepiece=*/true)}};
  return root.dump(2) + "\n";
}

}  // namespace ferry::tokenizer
