// Structured output (guided decoding). A constraint is an automaton over the bytes of a
// sequence's generated text; the tokens allowed next are those whose bytes it accepts from its
// current state. They are found by one walk over a trie of the vocabulary (tokens that share a
// prefix share the automaton states of that prefix, and a rejected prefix skips every token
// below it), and JSON masks are cached by automaton state: a JSON text revisits few states
// many times (inside a string at the same nesting, after a comma, ...), so most steps reuse a
// mask instead of walking the 151,936-token vocabulary again.
//
// Not thread-safe: one runner samples its sequences one after another.
#pragma once

#include <cstdint>
#include <list>
#include <memory>
#include <string>
#include <unordered_map>
#include <vector>

#include "structured/grammar_pda.h"
#include "worker/engine/guided_automata.h"
#include "worker/engine/model_runner.h"

namespace ferry::worker {

// A set of token ids, one bit each.
class TokenMask {
 public:
  explicit TokenMask(int32_t size = 0) : words_((static_cast<size_t>(size) + 63) / 64), size_(size) {}
  void Set(int32_t id) { words_[static_cast<size_t>(id) >> 6] |= uint64_t{1} << (id & 63); }
  void Clear(int32_t id) { words_[static_cast<size_t>(id) >> 6] &= ~(uint64_t{1} << (id & 63)); }
  bool Test(int32_t id) const { return (words_[static_cast<size_t>(id) >> 6] >> (id & 63)) & 1u; }
  int32_t Count() const;
  int32_t size() const { return size_; }
  // Bit i of word i / 64 is id i; bits past size() are 0.
  const std::vector<uint64_t>& words() const { return words_; }

 private:
  std::vector<uint64_t> words_;
  int32_t size_ = 0;
};

// The vocabulary as the bytes each token stands for, in a trie stored in preorder: node i's
// subtree is [i, end), so a walk skips a rejected prefix's tokens in one jump. Built once per
// worker.
class GuidedVocab {
 public:
  // token_bytes[id]: the text the token decodes to; empty for special tokens and for ids the
  // tokenizer lacks, which a constraint never allows. eos_ids: allowed exactly when the text is
  // accepted.
  GuidedVocab(std::vector<std::string> token_bytes, std::vector<int32_t> eos_ids);

  // A Hugging Face tokenizer.json whose model is a byte-level BPE (Qwen2, Llama 3, GPT-2): each
  // model.vocab string mapped back to bytes through GPT-2's bytes_to_unicode; or a
  // SentencePiece-style BPE (Mistral, Llama 2: byte fallback, or "▁" decoded to a space): "▁" is a
  // space and "<0xHH>" the byte. Added tokens marked special are never allowed, other added
  // tokens stand for their content. Ids at or past vocab_size are ignored. Throws
  // std::runtime_error naming the file on a bad one.
  static std::unique_ptr<GuidedVocab> FromTokenizerJson(const std::string& path, int32_t vocab_size,
                                                        std::vector<int32_t> eos_ids);

  int32_t size() const { return static_cast<int32_t>(bytes_.size()); }
  const std::string& bytes(int32_t id) const { return bytes_[static_cast<size_t>(id)]; }
  const std::vector<int32_t>& eos_ids() const { return eos_ids_; }
  bool IsEos(int32_t id) const;

  struct Node {
    uint8_t byte = 0;
    uint16_t depth = 0;  // bytes from the root, this one included (>= 1)
    int32_t token = -1;  // the token whose bytes end here, if any
    int32_t end = 0;     // one past the last node of this subtree
  };
  const std::vector<Node>& trie() const { return trie_; }
  // Further tokens with the same bytes as a trie node's token (rare: added tokens), in node order.
  const std::vector<std::pair<int32_t, int32_t>>& duplicates() const { return duplicates_; }

  // Masks by constraint and automaton state, least recently used evicted past kMaskCacheEntries.
  // Found: the shared mask (now the most recently used); else nullptr.
  static constexpr size_t kMaskCacheEntries = 1024;  // ~19 MB of masks at Qwen2's vocabulary
  std::shared_ptr<const TokenMask> CachedMask(const std::string& key);
  void CacheMask(const std::string& key, std::shared_ptr<const TokenMask> mask);
  size_t cached_masks() const { return mask_index_.size(); }

  // The vocabulary as a JSON string's lexer in one state reads it. Inside a free string nearly
  // every token fits (149,117 of Qwen2's 151,936), so a trie walk visits almost every node:
  // 9-43 ms, again for every new nesting or key the string sits under. What the lexer does
  // with a token depends only on its own state, so that part is computed once per lexer state
  // (a dozen states in practice) and a string's mask is `inside` plus short walks under `exits`.
  struct StringClasses {
    TokenMask inside;  // tokens the lexer takes whole, ending still inside the string
    // The inside tokens by the characters they begin, most first: a string with a maxLength
    // drops those past what it may still take.
    std::vector<std::pair<int32_t, int32_t>> by_chars;  // (characters, token id)
    // Trie nodes whose byte closes the string after a path the lexer took, with the path's
    // bytes (the closing quote last): what follows the string decides these subtrees.
    std::vector<std::pair<int32_t, std::string>> exits;
  };
  const StringClasses& StringClassesFor(const StringLexer& lexer);
  size_t string_classes_computed() const { return string_classes_.size(); }

  // The same for a grammar's pushdown automaton (structured/grammar_pda.h) in a state that neither
  // calls nor ends a rule (inside a string, a number, a run of text): the tokens whose bytes
  // lead from it only through such states of its rule, which any parse whose top it is takes
  // whole, and the trie nodes where a token's path first reaches a state that calls or ends,
  // with the state before that byte: what the rest of the parse decides. `key` names the
  // grammar and the state (equal keys: the same automaton and state).
  struct GrammarClasses {
    TokenMask inside;
    std::vector<std::pair<int32_t, int32_t>> exits;  // (trie node, state before its byte)
  };
  std::shared_ptr<const GrammarClasses> GrammarClassesFor(const std::string& key, const GrammarPda& pda, int32_t state);
  size_t grammar_classes_cached() const { return grammar_classes_.size(); }

 private:
  void BuildTrie();

  std::vector<std::string> bytes_;
  std::vector<int32_t> eos_ids_;
  std::vector<Node> trie_;
  std::vector<std::pair<int32_t, int32_t>> duplicates_;  // (node, token id), in node order
  // Most recently used first. Evicting one entry at a time (it was a clear of the whole cache)
  // keeps the masks of constraints still in use when many are (a regex of a few hundred states
  // fills a quarter of it).
  using MaskEntry = std::pair<std::string, std::shared_ptr<const TokenMask>>;
  std::list<MaskEntry> mask_lru_;
  std::unordered_map<std::string, std::list<MaskEntry>::iterator> mask_index_;
  std::unordered_map<uint32_t, std::unique_ptr<const StringClasses>> string_classes_;  // by packed lexer state
  static constexpr size_t kGrammarClassEntries = 256;  // cleared whole past this; holders keep theirs
  std::unordered_map<std::string, std::shared_ptr<const GrammarClasses>> grammar_classes_;
};

// One sequence's constraint.
class GuidedMatcher {
 public:
  virtual ~GuidedMatcher() = default;
  // The tokens allowed next: those whose bytes the constraint accepts from here, plus the
  // end-of-sequence ids when the text so far is accepted (only those, when nothing may follow).
  // Valid until the next Advance.
  virtual const TokenMask& Allowed() = 0;
  // Takes the token sampled. False, and the matcher unchanged, when the constraint rejects it
  // (an end-of-sequence id is taken once the text is accepted, and changes nothing).
  virtual bool Advance(int32_t token_id) = 0;
  // The text so far is a whole text the constraint accepts.
  virtual bool Accepted() const = 0;
};

// The matcher for spec (kind != kNone). vocab must outlive it. Throws std::invalid_argument
// for a choice spec without choices and (JsonSchemaError, RegexError) for a schema or pattern
// that does not compile.
std::unique_ptr<GuidedMatcher> MakeGuidedMatcher(const GuidedSpec& spec, GuidedVocab& vocab);

// What a runner (CPU or GPU) needs around the matchers.
// The vocabulary of model_dir/tokenizer.json; null when there is none or it is neither a
// byte-level nor a SentencePiece-style BPE, and the backend then reports no guided decoding (ModelInfo.supports_guided_decoding),
// which the scheduler refuses with INVALID_ARGUMENT.
std::unique_ptr<GuidedVocab> LoadGuidedVocab(const std::string& model_dir, int32_t vocab_size,
                                             std::vector<int32_t> eos_ids);
// A new sequence's matcher, null when unguided. token_ids ends with the num_generated tokens it
// sampled before a preemption: the constraint's state is rebuilt from them.
std::unique_ptr<GuidedMatcher> SequenceMatcher(const GuidedSpec& spec, GuidedVocab* vocab,
                                               const std::vector<int32_t>& token_ids, int32_t num_generated);
// The mask to sample a guided sequence under; null when unguided, or when nothing is allowed
// (no end-of-sequence id to end on), where the sampler's own choice stands.
const TokenMask* SamplingMask(GuidedMatcher* matcher);
// vLLM's allowed_token_ids as a mask over vocab_size ids; null when empty (any token).
std::unique_ptr<const TokenMask> AllowedIdsMask(const std::vector<int32_t>& ids, int32_t vocab_size);

}  // namespace ferry::worker
