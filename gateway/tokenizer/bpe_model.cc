#include "gateway/tokenizer/bpe_model.h"

#include <algorithm>
#include <cstdio>
#include <queue>
#include <stdexcept>

#include "gateway/tokenizer/unicode_util.h"

namespace ferry::tokenizer {

BpeModel::BpeModel(const BpeModelSpec& spec)
    : byte_level_(spec.byte_level), byte_fallback_(spec.byte_fallback), fuse_unk_(spec.fuse_unk),
      ignore_merges_(spec.ignore_merges) {
  vocab_.reserve(spec.vocab.size());
  for (const auto& [token, id] : spec.vocab) vocab_[token] = id;
  const ByteLevelAlphabet& alphabet = ByteLevelAlphabet::Get();
  for (int b = 0; b < 256; ++b) {
    auto it = vocab_.find(alphabet.CharOf(static_cast<uint8_t>(b)));
    byte_ids_[b] = it == vocab_.end() ? -1 : it->second;
    char name[8];
    std::snprintf(name, sizeof name, "<0x%02X>", b);
    auto fallback = vocab_.find(name);
    fallback_ids_[b] = byte_fallback_ && fallback != vocab_.end() ? fallback->second : -1;
  }
  if (!spec.unk_token.empty()) {
    auto it = vocab_.find(spec.unk_token);
    if (it == vocab_.end()) throw std::runtime_error("unk_token '" + spec.unk_token + "' is not in the vocab");
    unk_id_ = it->second;
  }
  auto lookup = [&](const std::string& token) {
    auto it = vocab_.find(token);
    if (it == vocab_.end()) throw std::runtime_error("merge uses token '" + token + "' missing from vocab");
    return it->second;
  };
  merges_.reserve(spec.merges.size());
  for (size_t rank = 0; rank < spec.merges.size(); ++rank) {
    const auto& [left, right] = spec.merges[rank];
    // A repeated pair keeps its last rank, as HF's HashMap collect does.
    merges_[PairKey(lookup(left), lookup(right))] =
        MergeTarget{static_cast<uint32_t>(rank), lookup(left + right)};
  }
}

const BpeModel::MergeTarget* BpeModel::FindMerge(int32_t left, int32_t right) const {
  auto it = merges_.find(PairKey(left, right));
  return it == merges_.end() ? nullptr : &it->second;
}

// SentencePiece-style symbols, as HF's BPE::merge_word makes them: each character's id; a
// missing one's <0xXX> ids when every byte has one (byte_fallback); else unk_token (consecutive
// unknowns fused), else nothing.
void BpeModel::CharSymbols(std::string_view text, std::vector<int32_t>* symbols) const {
  bool last_was_unk = false;
  for (size_t i = 0; i < text.size();) {
    const auto c = static_cast<unsigned char>(text[i]);
    size_t n = c < 0x80 ? 1 : c < 0xE0 ? 2 : c < 0xF0 ? 3 : 4;
    n = std::min(n, text.size() - i);
    const std::string_view ch = text.substr(i, n);
    i += n;
    if (auto it = vocab_.find(std::string(ch)); it != vocab_.end()) {
      symbols->push_back(it->second);
      last_was_unk = false;
      continue;
    }
    if (byte_fallback_) {
      bool all = true;
      for (unsigned char b : ch) all = all && fallback_ids_[b] >= 0;
      if (all) {
        for (unsigned char b : ch) symbols->push_back(fallback_ids_[b]);
        last_was_unk = false;
        continue;
      }
    }
    if (unk_id_ < 0) continue;
    if (!(fuse_unk_ && last_was_unk)) symbols->push_back(unk_id_);
    last_was_unk = true;
  }
}

void BpeModel::EncodeWord(std::string_view bytes, std::vector<int32_t>* ids) const {
  if (!byte_level_) {
    if (ignore_merges_) {
      if (auto it = vocab_.find(std::string(bytes)); it != vocab_.end()) {
        ids->push_back(it->second);
        return;
      }
    }
    std::vector<int32_t> symbols;
    symbols.reserve(bytes.size());
    CharSymbols(bytes, &symbols);
    if (symbols.size() > 1) MergeSymbols(&symbols);
    ids->insert(ids->end(), symbols.begin(), symbols.end());
    return;
  }
  if (ignore_merges_) {
    auto it = vocab_.find(ByteLevelAlphabet::Get().Encode(bytes));
    if (it != vocab_.end()) {
      ids->push_back(it->second);
      return;
    }
  }
  std::vector<int32_t> symbols;
  symbols.reserve(bytes.size());
  for (unsigned char b : bytes) {
    if (byte_ids_[b] >= 0) symbols.push_back(byte_ids_[b]);
  }
  if (symbols.size() > 1) MergeSymbols(&symbols);
  ids->insert(ids->end(), symbols.begin(), symbols.end());
}

// Applies merges lowest rank first, leftmost first among equal ranks, which is
// the order HF's Word::merge_all pops its priority queue in. O(n log n).
void BpeModel::MergeSymbols(std::vector<int32_t>* symbols) const {
  struct Node {
    int32_t id;
    int32_t prev;
    int32_t next;
  };
  struct Candidate {
    uint32_t rank;
    int32_t pos;
    int32_t new_id;
    bool operator>(const Candidate& o) const { return rank != o.rank ? rank > o.rank : pos > o.pos; }
  };
  const int32_t n = static_cast<int32_t>(symbols->size());
  std::vector<Node> nodes(n);
  std::priority_queue<Candidate, std::vector<Candidate>, std::greater<>> queue;
  auto push_pair = [&](int32_t pos) {
    const int32_t next = nodes[pos].next;
    if (next < 0) return;
    if (const MergeTarget* m = FindMerge(nodes[pos].id, nodes[next].id)) queue.push({m->rank, pos, m->new_id});
  };
  for (int32_t i = 0; i < n; ++i) nodes[i] = Node{(*symbols)[i], i - 1, i + 1 < n ? i + 1 : -1};
  for (int32_t i = 0; i + 1 < n; ++i) push_pair(i);
  while (!queue.empty()) {
    const Candidate top = queue.top();
    queue.pop();
    Node& node = nodes[top.pos];
    if (node.id < 0 || node.next < 0) continue;  // merged away, or now last
    const MergeTarget* current = FindMerge(node.id, nodes[node.next].id);
    if (current == nullptr || current->new_id != top.new_id) continue;  // stale entry
    const int32_t right = node.next;
    node.id = top.new_id;
    node.next = nodes[right].next;
    nodes[right].id = -1;
    if (node.next >= 0) nodes[node.next].prev = top.pos;
    if (node.prev >= 0) push_pair(node.prev);
    push_pair(top.pos);
  }
  symbols->clear();
  for (int32_t i = 0; i >= 0 && i < n; i = nodes[i].next) symbols->push_back(nodes[i].id);
}

}  // namespace ferry::tokenizer
