#include "gateway/tokenizer/bpe_trainer.h"

#include <nlohmann/json.hpp>

#include <algorithm>
#include <map>
#include <queue>
#include <unordered_map>

#include "gateway/tokenizer/regex_splitter.h"
#include "gateway/tokenizer/unicode_util.h"

namespace ferry::tokenizer {
namespace {

using OrderedJson = nlohmann::ordered_json;

struct Word {
  std::vector<int32_t> symbols;
  int64_t count = 0;
};

uint64_t PairKey(int32_t left, int32_t right) {
  return (static_cast<uint64_t>(static_cast<uint32_t>(left)) << 32) | static_cast<uint32_t>(right);
}
int32_t LeftOf(uint64_t key) { return static_cast<int32_t>(key >> 32); }
int32_t RightOf(uint64_t key) { return static_cast<int32_t>(key & 0xFFFFFFFFu); }

// Pre-tokenises the corpus as the tokenizer will, and counts each distinct
// piece; std::map keeps the word order (and so training) deterministic.
std::vector<Word> CountWords(std::string_view corpus) {
  const std::string text = NormalizeNfc(Utf8Lossy(corpus));
  const RegexSplitter splitter(kQwen2SplitPattern);
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
  std::vector<std::string> tokens;  // byte-level strings, indexed by id
  std::vector<std::pair<int32_t, int32_t>> merges;
};

TrainedBpe TrainBpe(std::vector<Word> words, int32_t vocab_size) {
  TrainedBpe bpe;
  std::unordered_map<std::string, int32_t> id_of;
  const ByteLevelAlphabet& alphabet = ByteLevelAlphabet::Get();
  for (int rank = 0; rank < 256; ++rank) {
    bpe.tokens.push_back(alphabet.CharOf(alphabet.ByteAtRank(rank)));
    id_of[bpe.tokens.back()] = rank;
  }
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

OrderedJson ByteLevelJson() {
  return OrderedJson{{"type", "ByteLevel"}, {"add_prefix_space", false}, {"trim_offsets", false}, {"use_regex", false}};
}

OrderedJson AddedTokenJson(int32_t id, const std::string& content) {
  return OrderedJson{{"id", id},         {"content", content}, {"single_word", false}, {"lstrip", false},
                     {"rstrip", false},  {"normalized", false}, {"special", true}};
}

OrderedJson PreTokenizerJson() {
  OrderedJson split{{"type", "Split"},
                    {"pattern", {{"Regex", std::string(kQwen2SplitPattern)}}},
                    {"behavior", "Isolated"},
                    {"invert", false}};
  return OrderedJson{{"type", "Sequence"}, {"pretokenizers", OrderedJson::array({split, ByteLevelJson()})}};
}

OrderedJson ModelJson(const TrainedBpe& bpe) {
  OrderedJson vocab = OrderedJson::object();
  // ordered_map's own insert searches linearly (quadratic here); tokens are
  // unique, so append to its underlying vector directly.
  auto& entries = static_cast<std::vector<std::pair<const std::string, OrderedJson>>&>(
      vocab.get_ref<OrderedJson::object_t&>());
  entries.reserve(bpe.tokens.size());
  for (size_t id = 0; id < bpe.tokens.size(); ++id) entries.emplace_back(bpe.tokens[id], id);
  OrderedJson merges = OrderedJson::array();
  // Byte-level symbols never contain U+0020, so Qwen2's "a b" form is unambiguous.
  for (const auto& [left, right] : bpe.merges) merges.push_back(bpe.tokens[left] + " " + bpe.tokens[right]);
  return OrderedJson{{"type", "BPE"},          {"dropout", nullptr},        {"unk_token", nullptr},
                     {"continuing_subword_prefix", ""}, {"end_of_word_suffix", ""}, {"fuse_unk", false},
                     {"byte_fallback", false}, {"ignore_merges", false},    {"vocab", std::move(vocab)},
                     {"merges", std::move(merges)}};
}

}  // namespace

std::string TrainQwen2TokenizerJson(std::string_view corpus, int32_t vocab_size,
                                    const std::vector<std::string>& special_tokens) {
  const TrainedBpe bpe = TrainBpe(CountWords(corpus), vocab_size);
  OrderedJson added = OrderedJson::array();
  int32_t next_id = static_cast<int32_t>(bpe.tokens.size());
  for (const std::string& special : special_tokens) added.push_back(AddedTokenJson(next_id++, special));
  OrderedJson root{{"version", "1.0"},
                   {"truncation", nullptr},
                   {"padding", nullptr},
                   {"added_tokens", std::move(added)},
                   {"normalizer", {{"type", "NFC"}}},
                   {"pre_tokenizer", PreTokenizerJson()},
                   {"post_processor", ByteLevelJson()},
                   {"decoder", ByteLevelJson()},
                   {"model", ModelJson(bpe)}};
  return root.dump(2) + "\n";
}

}  // namespace ferry::tokenizer
