// The BPE model of a byte-level tokenizer: vocab, merge ranks, word merging.
#pragma once

#include <array>
#include <cstdint>
#include <string>
#include <string_view>
#include <unordered_map>
#include <utility>
#include <vector>

namespace ferry::tokenizer {

struct BpeModelSpec {
  std::vector<std::pair<std::string, int32_t>> vocab;  // byte-level token -> id
  std::vector<std::pair<std::string, std::string>> merges;  // in rank order
  bool ignore_merges = false;
};

class BpeModel {
 public:
  // Throws std::runtime_error when a merge names a token missing from the vocab.
  explicit BpeModel(const BpeModelSpec& spec);

  // Appends the ids of one pre-token given as raw bytes. Bytes whose symbol is
  // missing from the vocab are dropped, as HF does with no unk_token.
  void EncodeWord(std::string_view bytes, std::vector<int32_t>* ids) const;

  const std::unordered_map<std::string, int32_t>& vocab() const { return vocab_; }

 private:
  struct MergeTarget {
    uint32_t rank;
    int32_t new_id;
  };
  static uint64_t PairKey(int32_t left, int32_t right) {
    return (static_cast<uint64_t>(static_cast<uint32_t>(left)) << 32) | static_cast<uint32_t>(right);
  }
  const MergeTarget* FindMerge(int32_t left, int32_t right) const;
  void MergeSymbols(std::vector<int32_t>* symbols) const;

  std::unordered_map<std::string, int32_t> vocab_;
  std::array<int32_t, 256> byte_ids_{};  // -1 when the byte's symbol is not in the vocab
  std::unordered_map<uint64_t, MergeTarget> merges_;
  bool ignore_merges_ = false;
};

}  // namespace ferry::tokenizer
