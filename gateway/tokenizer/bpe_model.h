// The BPE model: vocab, merge ranks, word merging. Two kinds, as tokenizer.json's BPE has them:
// byte-level (GPT-2, Qwen, Llama 3: symbols are bytes through the ByteLevel alphabet) and
// SentencePiece-style (Mistral, Llama 2: symbols are characters, a character missing from the
// vocab falls back to its bytes' <0xXX> tokens, else to unk_token, consecutive unks fused).
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
  std::vector<std::pair<std::string, int32_t>> vocab;  // token -> id
  std::vector<std::pair<std::string, std::string>> merges;  // in rank order
  bool ignore_merges = false;
  bool byte_level = true;      // false: SentencePiece-style, symbols are characters
  bool byte_fallback = false;  // a character missing from the vocab becomes its <0xXX> tokens
  std::string unk_token;       // empty: none (a missing symbol is dropped, as HF does)
  bool fuse_unk = false;       // consecutive unknowns are one unk_token
};

class BpeModel {
 public:
  // Throws std::runtime_error when a merge names a token missing from the vocab.
  explicit BpeModel(const BpeModelSpec& spec);

  // Appends the ids of one pre-token given as raw bytes (SentencePiece-style: as UTF-8 text).
  // Symbols missing from the vocab are dropped, as HF does with no unk_token.
  void EncodeWord(std::string_view bytes, std::vector<int32_t>* ids) const;
  // The id of byte b's <0xXX> token (SentencePiece-style with byte_fallback), -1 when none.
  int32_t byte_fallback_id(uint8_t b) const { return fallback_ids_[b]; }

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
  void CharSymbols(std::string_view text, std::vector<int32_t>* symbols) const;

  std::array<int32_t, 256> byte_ids_{};  // -1 when the byte's symbol is not in the vocab
  std::array<int32_t, 256> fallback_ids_{};  // <0xXX>; -1 when none
  bool byte_level_ = true;
  bool byte_fallback_ = false;
  int32_t unk_id_ = -1;
  bool fuse_unk_ = false;
  std::unordered_map<uint64_t, MergeTarget> merges_;
  bool ignore_merges_ = false;
};

}  // namespace ferry::tokenizer
