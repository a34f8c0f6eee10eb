// The byte automaton of a compiled JSON Schema (structured/json_schema.h): a JSON text valid under
// the schema, with properties in the schema's order, read byte by byte. Copyable and small (its
// frame stack is inline), since the vocabulary walk copies one per trie node it visits.
#pragma once

#include <array>
#include <cstdint>
#include <string>

#include "structured/json_schema.h"
#include "worker/engine/guided_automata.h"

namespace ferry::worker {

class SchemaAutomaton {
 public:
  // Containers open at once; a deeper value (a recursive schema's) is not generated.
  static constexpr size_t kMaxDepth = 24;

  explicit SchemaAutomaton(const SchemaGraph* graph) : graph_(graph), expect_(graph->root) {}

  // False (and the automaton unchanged) when c cannot come next.
  bool Feed(uint8_t c);
  // The text so far is a whole value of the schema (a top-level number or literal that could
  // still go on counts: the end-of-sequence token ends it).
  bool Accepted() const;
  // Equal keys: equal futures.
  std::string Key() const;
  // Inside a string whose content the schema leaves free (a `string` value, or any string of
  // a value of any shape), its lexer, else nullptr; the contract of JsonAutomaton::FreeString,
  // for tokens of at most FreeStringBudget() characters. Keys, enum or const strings and strings
  // under a pattern or format are not free.
  const StringLexer* FreeString() const {
    if (lex_ == Lex::kString) return dfa_ == nullptr ? &string_ : nullptr;
    return lex_ == Lex::kAny ? any_.FreeString() : nullptr;
  }
  // Inside a free string with a maxLength: the characters it may still take; else -1.
  int64_t FreeStringBudget() const;

 private:
  enum class Phase : uint8_t { kObjectFirst, kObjectKey, kObjectColon, kObjectAfter, kArrayFirst, kArrayValue, kArrayAfter };
  enum class Lex : uint8_t { kNone, kString, kNumber, kLiteral, kKey, kAny, kRange };
  struct Frame {
    int32_t node = 0;
    int16_t count = 0;  // object: index of the last property written (-1: none); array: items
    Phase phase = Phase::kObjectFirst;
  };

  bool FeedLexer(uint8_t c);
  bool FeedString(uint8_t c);
  bool FeedStructural(uint8_t c);
  bool FeedObject(Frame& f, uint8_t c);
  bool FeedArray(Frame& f, uint8_t c);
  bool StartValue(int32_t node, uint8_t c);
  bool FeedLiterals(uint8_t c);
  void SelectTagged();
  bool EndedBefore(uint8_t c);
  void EndValue();
  uint64_t KeyCandidates(const Frame& f) const;
  bool CanClose(const Frame& f) const;
  const SchemaNode& node(int32_t id) const { return graph_->nodes[static_cast<size_t>(id)]; }

  const SchemaGraph* graph_;
  std::array<Frame, kMaxDepth> frames_{};
  uint8_t depth_ = 0;
  int32_t expect_;       // the node of the value that comes next; -1: a structural byte does
  bool done_ = false;    // the top-level value is whole
  uint8_t ws_ = 0;       // whitespace bytes in a row
  Lex lex_ = Lex::kNone;
  StringLexer string_;
  // kString, kRange: the value's node. kString: its characters so far, and its DFA's state when a pattern or
  // format constrains it (structured/json_string_dfa.h). kRange: a bounded integer's DFA and state.
  int32_t value_node_ = 0;
  uint32_t chars_ = 0;
  const RegexDfa* dfa_ = nullptr;
  int32_t dfa_state_ = 0;
  NumberLexer number_;
  uint64_t alive_ = 0;       // kLiteral, kKey: the literals (or keys) the bytes so far begin
  uint16_t literal_at_ = 0;  // bytes of them read
  int32_t literal_node_ = 0;
  JsonAutomaton any_{false};  // kAny: a value of any shape
};

}  // namespace ferry::worker
