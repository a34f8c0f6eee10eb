#include "worker/engine/guided_decoding.h"

#include <algorithm>
#include <bit>
#include <cctype>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <numeric>
#include <optional>
#include <stdexcept>

#include "common/byte_level.h"
#include "structured/ebnf_grammar.h"
#include "structured/regex_dfa.h"
#include "worker/engine/guided_automata.h"
#include "worker/engine/guided_grammar.h"
#include "worker/engine/guided_schema.h"

namespace ferry::worker {
namespace {

// Marks in mask every token in trie nodes [begin, end) whose bytes past depth base_depth
// automaton `start` accepts; the range is whole subtrees whose parent is at base_depth (the
// root: 0). Preorder: states[d] is the automaton after the first base_depth + d bytes of the
// node being visited; a node whose byte is rejected skips its whole subtree.
template <class Automaton>
void WalkRange(const GuidedVocab& vocab, const Automaton& start, size_t begin, size_t end, size_t base_depth,
               TokenMask& mask) {
  const std::vector<GuidedVocab::Node>& trie = vocab.trie();
  std::vector<Automaton> states;
  states.reserve(64);
  states.push_back(start);
  std::vector<bool> reached;  // by node - begin, only when the vocabulary has duplicate byte strings
  if (!vocab.duplicates().empty()) reached.assign(end - begin, false);
  for (size_t i = begin; i < end;) {
    const GuidedVocab::Node& node = trie[i];
    states.erase(states.begin() + static_cast<std::ptrdiff_t>(node.depth - base_depth), states.end());
    Automaton next = states.back();
    if (!next.Feed(node.byte)) {
      i = static_cast<size_t>(node.end);
      continue;
    }
    if (node.token >= 0) mask.Set(node.token);
    if (!reached.empty()) reached[i - begin] = true;
    states.push_back(std::move(next));
    ++i;
  }
  if (reached.empty()) return;
  const auto& dups = vocab.duplicates();  // in node order
  auto it = std::lower_bound(dups.begin(), dups.end(), static_cast<int32_t>(begin),
                             [](const std::pair<int32_t, int32_t>& d, int32_t n) { return d.first < n; });
  for (; it != dups.end() && static_cast<size_t>(it->first) < end; ++it) {
    if (reached[static_cast<size_t>(it->first) - begin]) mask.Set(it->second);
  }
}

template <class Automaton>
void Walk(const GuidedVocab& vocab, const Automaton& start, TokenMask& mask) {
  WalkRange(vocab, start, 0, vocab.trie().size(), 0, mask);
}

// A JSON string's lexer as an automaton that takes only the bytes keeping it inside the string.
struct InsideString {
  StringLexer lexer;
  bool Feed(uint8_t c) { return lexer.Feed(c) == LexStep::kTaken; }
};

// The trie nodes whose byte closes a string that `lexer` reads from its state, after a path
// it took, with the path's bytes.
std::vector<std::pair<int32_t, std::string>> StringExits(const GuidedVocab& vocab, const StringLexer& lexer) {
  const std::vector<GuidedVocab::Node>& trie = vocab.trie();
  std::vector<std::pair<int32_t, std::string>> exits;
  std::vector<StringLexer> states{lexer};
  std::string path;
  for (size_t i = 0; i < trie.size();) {
    const GuidedVocab::Node& node = trie[i];
    states.resize(node.depth);
    path.resize(node.depth - 1u);
    path.push_back(static_cast<char>(node.byte));
    StringLexer next = states.back();
    const LexStep step = next.Feed(node.byte);
    if (step != LexStep::kTaken) {
      if (step == LexStep::kClosed) exits.emplace_back(static_cast<int32_t>(i), path);
      i = static_cast<size_t>(node.end);
      continue;
    }
    states.push_back(next);
    ++i;
  }
  return exits;
}

// Marks a trie node's token and the tokens with the same bytes (duplicates() is in node order).
void MarkNode(const GuidedVocab& vocab, int32_t node, TokenMask& mask) {
  const GuidedVocab::Node& n = vocab.trie()[static_cast<size_t>(node)];
  if (n.token >= 0) mask.Set(n.token);
  const auto& dups = vocab.duplicates();
  auto it = std::lower_bound(dups.begin(), dups.end(), node,
                             [](const std::pair<int32_t, int32_t>& d, int32_t v) { return d.first < v; });
  for (; it != dups.end() && it->first == node; ++it) mask.Set(it->second);
}

// The mask of an automaton inside a free string (FreeString() is its lexer): the tokens that
// stay inside, which depend on the lexer alone, plus those that close the string and whose
// rest the automaton accepts. The same set a whole walk finds, in a copy and a few short walks.
// budget: the characters the string may still take (-1: any number); tokens that complete more
// are dropped, and the closing ones are walked from the automaton, which counts.
template <class Automaton>
void FreeStringAllowed(GuidedVocab& vocab, const Automaton& state, const StringLexer& lexer, int64_t budget,
                       TokenMask& mask) {
  const GuidedVocab::StringClasses& classes = vocab.StringClassesFor(lexer);
  mask = classes.inside;
  if (budget >= 0) {
    for (const auto& [chars, id] : classes.by_chars) {
      if (chars <= budget) break;
      mask.Clear(id);
    }
  }
  const std::vector<GuidedVocab::Node>& trie = vocab.trie();
  for (const auto& [node, path] : classes.exits) {
    Automaton after = state;
    bool taken = true;
    for (size_t k = 0; k < path.size() && taken; ++k) taken = after.Feed(static_cast<uint8_t>(path[k]));
    if (!taken) continue;  // not by the contract of FreeString; then no token under it fits
    const GuidedVocab::Node& n = trie[static_cast<size_t>(node)];
    MarkNode(vocab, node, mask);
    WalkRange(vocab, after, static_cast<size_t>(node) + 1, static_cast<size_t>(n.end), n.depth, mask);
  }
}

// A state of a grammar's automaton that neither calls nor ends a rule, as a walk of its own.
bool Simple(const GrammarPda::State& s) { return !s.final && s.calls.empty(); }

// The mask of a grammar automaton whose one parse's top is a simple state: the tokens that stay
// among simple states (they depend on that state alone), plus walks under the nodes where a
// token leaves them, each from the automaton as it is after the bytes before (its top replaced)
// and the node's byte; the same set a whole walk finds.
void GrammarAllowed(GuidedVocab& vocab, const GrammarAutomaton& state, const std::string& key_prefix,
                    TokenMask& mask) {
  const int32_t top = state.SoleTop();
  const std::shared_ptr<const GuidedVocab::GrammarClasses> classes =
      vocab.GrammarClassesFor(key_prefix + std::to_string(top), *state.pda(), top);
  mask = classes->inside;
  const std::vector<GuidedVocab::Node>& trie = vocab.trie();
  std::unordered_map<int64_t, std::optional<GrammarAutomaton>> after;  // by (state before, byte)
  for (const auto& [node, before] : classes->exits) {
    const GuidedVocab::Node& n = trie[static_cast<size_t>(node)];
    auto [it, fresh] = after.try_emplace(int64_t{before} * 256 + n.byte);
    if (fresh) {
      GrammarAutomaton a = state.WithTop(before);
      if (a.Feed(n.byte)) it->second = std::move(a);
    }
    const std::optional<GrammarAutomaton>& a = it->second;
    if (!a) continue;
    MarkNode(vocab, node, mask);
    WalkRange(vocab, *a, static_cast<size_t>(node) + 1, static_cast<size_t>(n.end), n.depth, mask);
  }
}

// Tokens allowed from an automaton's state: the walk, plus the end-of-sequence ids once the
// text is accepted. key_prefix names the constraint (its text).
template <class Automaton>
std::shared_ptr<const TokenMask> Allowed(GuidedVocab& vocab, const Automaton& state, const std::string& key_prefix) {
  auto mask = std::make_shared<TokenMask>(vocab.size());
  if constexpr (std::is_same_v<Automaton, GrammarAutomaton>) {
    const int32_t top = state.SoleTop();
    if (top >= 0 && Simple(state.pda()->state(top))) {
      GrammarAllowed(vocab, state, key_prefix, *mask);
    } else {
      Walk(vocab, state, *mask);
    }
  } else {
    const StringLexer* lexer = nullptr;
    if constexpr (requires { state.FreeString(); }) lexer = state.FreeString();
    int64_t budget = -1;
    if constexpr (requires { state.FreeStringBudget(); }) budget = state.FreeStringBudget();
    if (lexer != nullptr) {
      FreeStringAllowed(vocab, state, *lexer, budget, *mask);
    } else {
      Walk(vocab, state, *mask);
    }
  }
  if (state.Accepted()) {
    for (int32_t id : vocab.eos_ids()) mask->Set(id);
  }
  return mask;
}

// Feeds a token's bytes to a copy of state; the copy when every byte is taken.
template <class Automaton>
std::optional<Automaton> AfterToken(const GuidedVocab& vocab, const Automaton& state, int32_t token_id) {
  if (token_id < 0 || token_id >= vocab.size()) return std::nullopt;
  const std::string& bytes = vocab.bytes(token_id);
  if (bytes.empty()) return std::nullopt;
  Automaton next = state;
  for (char c : bytes) {
    if (!next.Feed(static_cast<uint8_t>(c))) return std::nullopt;
  }
  return next;
}

// A regular expression's DFA state: an index, so the walk copies four bytes a node.
class RegexAutomaton {
 public:
  explicit RegexAutomaton(const RegexDfa* dfa) : dfa_(dfa), state_(dfa->start) {}
  bool Feed(uint8_t c) {
    const int32_t next = dfa_->Step(state_, c);
    if (next < 0) return false;
    state_ = next;
    return true;
  }
  bool Accepted() const { return dfa_->accepting[static_cast<size_t>(state_)]; }
  std::string Key() const { return std::string(reinterpret_cast<const char*>(&state_), sizeof state_); }

 private:
  const RegexDfa* dfa_;
  int32_t state_;
};

// A sequence's constraint over any automaton. Masks are cached in the vocabulary under the
// constraint's own text (key_prefix) and the automaton's state, so every sequence of one
// constraint shares them; `owned` keeps what the automaton points into (a compiled schema or
// DFA, sorted choices) alive as long as the matcher.
template <class Automaton>
class CachedMatcher final : public GuidedMatcher {
 public:
  CachedMatcher(GuidedVocab& vocab, std::string key_prefix, std::shared_ptr<const void> owned, Automaton start)
      : vocab_(vocab), key_prefix_(std::move(key_prefix)), owned_(std::move(owned)), state_(std::move(start)) {}

  const TokenMask& Allowed() override {
    if (!mask_) {
      const std::string key = key_prefix_ + state_.Key();
      mask_ = vocab_.CachedMask(key);
      if (!mask_) {
        mask_ = worker::Allowed(vocab_, state_, key_prefix_);
        vocab_.CacheMask(key, mask_);
      }
    }
    return *mask_;
  }

  bool Advance(int32_t token_id) override {
    if (vocab_.IsEos(token_id)) return state_.Accepted();
    std::optional<Automaton> next = AfterToken(vocab_, state_, token_id);
    if (!next) return false;
    state_ = std::move(*next);
    mask_.reset();
    return true;
  }

  bool Accepted() const override { return state_.Accepted(); }

 private:
  GuidedVocab& vocab_;
  const std::string key_prefix_;
  const std::shared_ptr<const void> owned_;
  Automaton state_;
  std::shared_ptr<const TokenMask> mask_;
};

// A cache key prefix naming a constraint by its text: kind, then length-prefixed parts, so no
// two constraints' prefixes (whatever bytes their texts hold) can be confused.
std::string KeyPrefix(const char* kind, const std::vector<std::string>& parts) {
  std::string out = kind;
  for (const std::string& p : parts) out += std::to_string(p.size()) + ':' + p;
  return out + '|';
}

template <class Automaton>
std::unique_ptr<GuidedMatcher> Matcher(GuidedVocab& vocab, std::string prefix, std::shared_ptr<const void> owned,
                                       Automaton start) {
  return std::make_unique<CachedMatcher<Automaton>>(vocab, std::move(prefix), std::move(owned), std::move(start));
}

}  // namespace

int32_t TokenMask::Count() const {
  int32_t n = 0;
  for (uint64_t w : words_) n += std::popcount(w);
  return n;
}

GuidedVocab::GuidedVocab(std::vector<std::string> token_bytes, std::vector<int32_t> eos_ids)
    : bytes_(std::move(token_bytes)), eos_ids_(std::move(eos_ids)) {
  std::erase_if(eos_ids_, [&](int32_t id) { return id < 0 || id >= size(); });
  for (int32_t id : eos_ids_) bytes_[static_cast<size_t>(id)].clear();  // never a byte string
  BuildTrie();
  // The plain in-string state, the one costly to classify (two walks of nearly the whole trie,
  // ~11 ms at Qwen2's size): here, at load, rather than inside the first guided step. The
  // others (after a backslash, between UTF-8 bytes) take few tokens and are classified when met.
  StringClassesFor(StringLexer{});
}

bool GuidedVocab::IsEos(int32_t id) const { return std::find(eos_ids_.begin(), eos_ids_.end(), id) != eos_ids_.end(); }

void GuidedVocab::BuildTrie() {
  std::vector<int32_t> order;
  for (int32_t id = 0; id < size(); ++id) {
    if (!bytes_[static_cast<size_t>(id)].empty()) order.push_back(id);
  }
  std::stable_sort(order.begin(), order.end(), [&](int32_t a, int32_t b) { return bytes(a) < bytes(b); });
  std::vector<int32_t> path;  // open nodes, root's child first
  const std::string* prev = nullptr;
  auto close_to = [&](size_t depth) {
    while (path.size() > depth) {
      trie_[static_cast<size_t>(path.back())].end = static_cast<int32_t>(trie_.size());
      path.pop_back();
    }
  };
  for (int32_t id : order) {
    const std::string& b = bytes(id);
    if (b.size() > UINT16_MAX) throw std::runtime_error("a token of over 65,535 bytes");
    size_t common = 0;
    if (prev != nullptr) {
      common = static_cast<size_t>(std::mismatch(b.begin(), b.end(), prev->begin(), prev->end()).first - b.begin());
    }
    if (prev != nullptr && common == b.size() && b.size() == prev->size()) {
      duplicates_.emplace_back(path.back(), id);
      continue;
    }
    close_to(common);
    for (size_t d = common; d < b.size(); ++d) {
      path.push_back(static_cast<int32_t>(trie_.size()));
      trie_.push_back({static_cast<uint8_t>(b[d]), static_cast<uint16_t>(d + 1), -1, 0});
    }
    trie_[static_cast<size_t>(path.back())].token = id;
    prev = &b;
  }
  close_to(0);
}

namespace {

constexpr std::string_view kMetaspace = "\xe2\x96\x81";  // ▁, SentencePiece's space

// Whether a tokenizer.json spells spaces as "▁" (Mistral's and Llama 2's SentencePiece-style
// BPE): its model falls back to bytes, or its decoder maps "▁" back to a space (Metaspace, or a
// Replace of "▁").
bool IsSentencePieceStyle(const nlohmann::json& j) {
  const nlohmann::json& model = j["model"];
  if (model.is_object() && model.value("byte_fallback", false) == true) return true;
  if (!j.contains("decoder") || !j["decoder"].is_object()) return false;
  const nlohmann::json& d = j["decoder"];
  std::vector<const nlohmann::json*> steps{&d};
  if (d.contains("decoders") && d["decoders"].is_array()) {
    for (const nlohmann::json& step : d["decoders"]) steps.push_back(&step);
  }
  for (const nlohmann::json* step : steps) {
    if (!step->is_object()) continue;
    const std::string type = step->value("type", "");
    if (type == "Metaspace") return true;
    if (type == "Replace" && step->contains("pattern") && (*step)["pattern"].is_object() &&
        (*step)["pattern"].value("String", "") == kMetaspace) {
      return true;
    }
  }
  return false;
}

// The bytes a SentencePiece-style token stands for: a byte-fallback token "<0xHH>" the one byte,
// any other its text with every "▁" a space. The decoder's Strip of the output's first space is
// the detokenizer's (the text a client sees), not the constraint's: a guided sequence's text is
// its tokens' bytes as they are, so a constraint that starts with "{" admits "{" first and not
// "▁{", and the text the client sees is the same.
std::string SentencePieceBytes(const std::string& token, bool byte_fallback) {
  if (byte_fallback && token.size() == 6 && token.rfind("<0x", 0) == 0 && token[5] == '>' &&
      std::isxdigit(static_cast<unsigned char>(token[3])) && std::isxdigit(static_cast<unsigned char>(token[4]))) {
    return std::string(1, static_cast<char>(std::stoi(token.substr(3, 2), nullptr, 16)));
  }
  std::string out;
  for (size_t i = 0; i < token.size();) {
    if (token.compare(i, kMetaspace.size(), kMetaspace) == 0) {
      out += ' ';
      i += kMetaspace.size();
    } else {
      out += token[i++];
    }
  }
  return out;
}

}  // namespace

std::unique_ptr<GuidedVocab> GuidedVocab::FromTokenizerJson(const std::string& path, int32_t vocab_size,
                                                            std::vector<int32_t> eos_ids) {
  std::ifstream in(path);
  if (!in) throw std::runtime_error(path + ": cannot be read");
  nlohmann::json j;
  try {
    j = nlohmann::json::parse(in);
  } catch (const nlohmann::json::exception& e) {
    throw std::runtime_error(path + ": not JSON: " + e.what());
  }
  const nlohmann::json* vocab = j.contains("model") ? &j["model"] : nullptr;
  if (vocab == nullptr || !vocab->contains("vocab") || !(*vocab)["vocab"].is_object()) {
    throw std::runtime_error(path + ": no model.vocab object (guided decoding reads byte-level BPE vocabularies)");
  }
  const bool sentencepiece = IsSentencePieceStyle(j);
  const bool byte_fallback = (*vocab).value("byte_fallback", false) == true;
  const ByteLevelAlphabet& alphabet = ByteLevelAlphabet::Get();
  std::vector<std::string> bytes(static_cast<size_t>(std::max(vocab_size, 0)));
  for (const auto& [entry, id_json] : (*vocab)["vocab"].items()) {
    if (!id_json.is_number_integer()) continue;
    const int64_t id = id_json.get<int64_t>();
    if (id < 0 || id >= vocab_size) continue;
    std::string b;
    if (sentencepiece) {
      b = SentencePieceBytes(entry, byte_fallback);
    } else if (!alphabet.Decode(entry, &b)) {
      throw std::runtime_error(path + ": vocabulary entry " + std::to_string(id) + " is not byte-level");
    }
    bytes[static_cast<size_t>(id)] = std::move(b);
  }
  if (j.contains("added_tokens") && j["added_tokens"].is_array()) {
    for (const nlohmann::json& t : j["added_tokens"]) {
      if (!t.is_object() || !t.contains("id") || !t["id"].is_number_integer()) continue;
      const int64_t id = t["id"].get<int64_t>();
      if (id < 0 || id >= vocab_size) continue;
      const bool special = t.value("special", true);
      bytes[static_cast<size_t>(id)] = special ? std::string() : t.value("content", std::string());
    }
  }
  return std::make_unique<GuidedVocab>(std::move(bytes), std::move(eos_ids));
}

const GuidedVocab::StringClasses& GuidedVocab::StringClassesFor(const StringLexer& lexer) {
  const uint32_t key = lexer.sub | uint32_t{lexer.utf8_left} << 8 | uint32_t{lexer.utf8_first} << 16 |
                       uint32_t{lexer.no_unicode_escape} << 24;
  std::unique_ptr<const StringClasses>& slot = string_classes_[key];
  if (!slot) {
    auto classes = std::make_unique<StringClasses>(StringClasses{TokenMask(size()), {}, StringExits(*this, lexer)});
    Walk(*this, InsideString{lexer}, classes->inside);
    for (int32_t id = 0; id < size(); ++id) {
      if (!classes->inside.Test(id)) continue;
      StringLexer l = lexer;
      int32_t chars = 0;
      for (char c : bytes(id)) {
        chars += l.AtCharBoundary();  // characters begun, as SchemaAutomaton counts them
        l.Feed(static_cast<uint8_t>(c));
      }
      classes->by_chars.emplace_back(chars, id);
    }
    std::sort(classes->by_chars.begin(), classes->by_chars.end(), std::greater<>());
    slot = std::move(classes);
  }
  return *slot;
}

std::shared_ptr<const GuidedVocab::GrammarClasses> GuidedVocab::GrammarClassesFor(const std::string& key,
                                                                                  const GrammarPda& pda,
                                                                                  int32_t state) {
  if (const auto it = grammar_classes_.find(key); it != grammar_classes_.end()) return it->second;
  // Bytes lead from a simple state to simple ones of no greater need (so a parse that could
  // end with `state` on top still can): taken whole, whatever is below the top.
  const int32_t need = pda.state(state).need;
  auto step = [&](int32_t from, uint8_t c, bool* inside) {
    for (const GrammarPda::ByteEdge& e : pda.state(from).bytes) {
      if (!e.Has(c)) continue;
      const GrammarPda::State& to = pda.state(e.target);
      *inside = Simple(to) && to.need <= need;
      return e.target;
    }
    return -1;
  };
  struct Local {
    const decltype(step)* stepper;
    int32_t at;
    bool Feed(uint8_t c) {
      bool inside = false;
      const int32_t next = (*stepper)(at, c, &inside);
      if (next < 0 || !inside) return false;
      at = next;
      return true;
    }
  };
  auto classes = std::make_shared<GrammarClasses>(GrammarClasses{TokenMask(size()), {}});
  Walk(*this, Local{&step, state}, classes->inside);
  std::vector<int32_t> states{state};  // by depth: the state after the node's path
  for (size_t i = 0; i < trie_.size();) {
    const Node& node = trie_[i];
    states.resize(node.depth);
    bool inside = false;
    const int32_t next = step(states.back(), node.byte, &inside);
    if (next < 0 || !inside) {
      if (next >= 0) classes->exits.emplace_back(static_cast<int32_t>(i), states.back());
      i = static_cast<size_t>(node.end);
      continue;
    }
    states.push_back(next);
    ++i;
  }
  if (grammar_classes_.size() >= kGrammarClassEntries) grammar_classes_.clear();
  grammar_classes_.emplace(key, classes);
  return classes;
}

std::shared_ptr<const TokenMask> GuidedVocab::CachedMask(const std::string& key) {
  const auto it = mask_index_.find(key);
  if (it == mask_index_.end()) return nullptr;
  mask_lru_.splice(mask_lru_.begin(), mask_lru_, it->second);
  return it->second->second;
}

void GuidedVocab::CacheMask(const std::string& key, std::shared_ptr<const TokenMask> mask) {
  if (const auto it = mask_index_.find(key); it != mask_index_.end()) {
    it->second->second = std::move(mask);
    mask_lru_.splice(mask_lru_.begin(), mask_lru_, it->second);
    return;
  }
  // Matchers hold their masks by shared pointer, so evicting never pulls one from under them.
  if (mask_index_.size() >= kMaskCacheEntries) {
    mask_index_.erase(mask_lru_.back().first);
    mask_lru_.pop_back();
  }
  mask_lru_.emplace_front(key, std::move(mask));
  mask_index_.emplace(key, mask_lru_.begin());
}

namespace {

std::unique_ptr<GuidedMatcher> RegexMatcher(GuidedVocab& vocab, const std::string& regex) {
  std::shared_ptr<const RegexDfa> dfa = CompileRegexCached(regex);
  const RegexAutomaton start(dfa.get());
  return Matcher(vocab, KeyPrefix("regex", {regex}), std::move(dfa), start);
}

}  // namespace

std::unique_ptr<GuidedMatcher> MakeGuidedMatcher(const GuidedSpec& spec, GuidedVocab& vocab) {
  switch (spec.kind) {
    case GuidedSpec::Kind::kJsonObject:
      return Matcher(vocab, KeyPrefix("json", {}), nullptr, JsonAutomaton{});
    case GuidedSpec::Kind::kChoice: {
      auto choices = std::make_shared<std::vector<std::string>>(spec.choices);
      std::sort(choices->begin(), choices->end());
      choices->erase(std::unique(choices->begin(), choices->end()), choices->end());
      std::erase(*choices, std::string());
      if (choices->empty()) throw std::invalid_argument("guided choice needs at least one non-empty choice");
      const ChoiceAutomaton start(choices.get());
      std::string prefix = KeyPrefix("choice", *choices);  // before choices is moved from
      return Matcher(vocab, std::move(prefix), std::move(choices), start);
    }
    case GuidedSpec::Kind::kJsonSchema: {  // JsonSchemaError is an invalid_argument
      std::shared_ptr<const SchemaGraph> graph = CompileJsonSchemaCached(spec.json_schema);
      const SchemaAutomaton start(graph.get());
      return Matcher(vocab, KeyPrefix("schema", {spec.json_schema}), std::move(graph), start);
    }
    case GuidedSpec::Kind::kRegex:  // RegexError is an invalid_argument
      return RegexMatcher(vocab, spec.regex);
    case GuidedSpec::Kind::kGrammar: {  // GrammarError is an invalid_argument
      // A regular grammar is walked as its regex's DFA (cheaper per step than the pushdown
      // automaton, and its masks are cached); a recursive one, or one whose expansion is past
      // the regex limits, runs as the pushdown automaton.
      if (const GrammarPlan plan = CheckGrammarCached(spec.grammar); plan.regex) return RegexMatcher(vocab, *plan.regex);
      std::shared_ptr<const GrammarPda> pda = CompileGrammarPdaCached(spec.grammar);
      const GrammarAutomaton start(pda.get());
      return Matcher(vocab, KeyPrefix("grammar", {spec.grammar}), std::move(pda), start);
    }
    case GuidedSpec::Kind::kNone:
      break;
  }
  throw std::invalid_argument("no guided decoding asked for");
}

std::unique_ptr<GuidedVocab> LoadGuidedVocab(const std::string& model_dir, int32_t vocab_size,
                                             std::vector<int32_t> eos_ids) {
  const std::string path = model_dir + "/tokenizer.json";
  if (!std::filesystem::exists(path)) return nullptr;
  try {
    return GuidedVocab::FromTokenizerJson(path, vocab_size, std::move(eos_ids));
  } catch (const std::runtime_error&) {
    return nullptr;
  }
}

std::unique_ptr<GuidedMatcher> SequenceMatcher(const GuidedSpec& spec, GuidedVocab* vocab,
                                               const std::vector<int32_t>& token_ids, int32_t num_generated) {
  if (spec.kind == GuidedSpec::Kind::kNone || vocab == nullptr) return nullptr;
  std::unique_ptr<GuidedMatcher> m = MakeGuidedMatcher(spec, *vocab);
  const size_t first = token_ids.size() - static_cast<size_t>(std::max(num_generated, 0));
  for (size_t i = first; i < token_ids.size(); ++i) m->Advance(token_ids[i]);
  return m;
}

const TokenMask* SamplingMask(GuidedMatcher* matcher) {
  if (matcher == nullptr) return nullptr;
  const TokenMask& allowed = matcher->Allowed();
  return allowed.Count() == 0 ? nullptr : &allowed;
}

std::unique_ptr<const TokenMask> AllowedIdsMask(const std::vector<int32_t>& ids, int32_t vocab_size) {
  if (ids.empty()) return nullptr;
  auto mask = std::make_unique<TokenMask>(vocab_size);
  for (int32_t id : ids) mask->Set(id);  // in range: step validation checked them
  return mask;
}

}  // namespace ferry::worker
