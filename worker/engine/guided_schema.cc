#include "worker/engine/guided_schema.h"

#include <algorithm>
#include <bit>

namespace ferry::worker {
namespace {

template <class T>
void Append(std::string& out, const T& value) {
  out.append(reinterpret_cast<const char*>(&value), sizeof value);
}

}  // namespace

bool SchemaAutomaton::Feed(uint8_t c) { return lex_ == Lex::kNone ? FeedStructural(c) : FeedLexer(c); }

bool SchemaAutomaton::FeedLexer(uint8_t c) {
  switch (lex_) {
    case Lex::kString: return FeedString(c);
    case Lex::kNumber:
      switch (number_.Feed(c)) {
        case LexStep::kTaken: return true;
        case LexStep::kEnded: return EndedBefore(c);
        default: return false;
      }
    case Lex::kRange: {
      const int32_t next = dfa_->Step(dfa_state_, c);
      if (next >= 0) {
        dfa_state_ = next;
        return true;
      }
      return dfa_->accepting[static_cast<size_t>(dfa_state_)] && EndedBefore(c);  // the integer ended before c
    }
    case Lex::kLiteral:
    case Lex::kKey:
      return FeedLiterals(c);
    case Lex::kAny:
      if (any_.Feed(c)) {
        if (any_.Accepted()) EndValue();  // closed by this byte
        return true;
      }
      return any_.Complete() && EndedBefore(c);  // a number, ended by c
    case Lex::kNone:
      break;
  }
  return false;
}

// A string's byte: its lexer keeps it JSON, its DFA (a pattern or format) or its count of
// characters (lengths alone) keeps it valid; the closing quote only where the DFA accepts and
// minLength is met.
bool SchemaAutomaton::FeedString(uint8_t c) {
  const SchemaNode& n = node(value_node_);
  StringLexer lexer = string_;
  const LexStep step = lexer.Feed(c);
  if (step == LexStep::kRejected) return false;
  if (step == LexStep::kClosed) {
    if (dfa_ != nullptr ? !dfa_->accepting[static_cast<size_t>(dfa_state_)] : chars_ < n.min_length) return false;
    EndValue();
    return true;
  }
  if (dfa_ != nullptr) {
    const int32_t next = dfa_->Step(dfa_state_, c);
    if (next < 0) return false;
    dfa_state_ = next;
  } else if (string_.AtCharBoundary()) {  // c begins a character (a byte, a UTF-8 lead, a backslash)
    if (n.max_length >= 0 && chars_ + 1 > n.max_length) return false;
    ++chars_;
  }
  string_ = lexer;
  return true;
}

int64_t SchemaAutomaton::FreeStringBudget() const {
  if (lex_ != Lex::kString || dfa_ != nullptr) return -1;
  const SchemaNode& n = node(value_node_);
  return n.max_length < 0 ? -1 : n.max_length - chars_;
}

// The token in progress (a number, or a literal another could extend) ends before c, which
// must then be taken as what follows it; else nothing changes.
bool SchemaAutomaton::EndedBefore(uint8_t c) {
  const SchemaAutomaton before = *this;
  EndValue();
  if (FeedStructural(c)) return true;
  *this = before;
  return false;
}

bool SchemaAutomaton::FeedStructural(uint8_t c) {
  if (done_) return false;  // nothing follows the value, not even whitespace
  if (IsJsonWhitespace(c)) {
    if (ws_ >= JsonAutomaton::kMaxWhitespace) return false;
    ++ws_;
    return true;
  }
  if (expect_ >= 0) return StartValue(expect_, c);
  Frame& f = frames_[depth_ - 1];  // not done and no value due: inside a container
  return node(f.node).kind == SchemaNode::Kind::kObject ? FeedObject(f, c) : FeedArray(f, c);
}

// Properties come in the schema's order: after property p, any later one up to and including
// the next required one; the object closes once no required one is left.
uint64_t SchemaAutomaton::KeyCandidates(const Frame& f) const {
  const auto& props = node(f.node).properties;
  uint64_t mask = 0;
  for (size_t j = static_cast<size_t>(f.count + 1); j < props.size(); ++j) {
    mask |= uint64_t{1} << j;
    if (props[j].required) break;
  }
  return mask;
}

bool SchemaAutomaton::CanClose(const Frame& f) const {
  const auto& props = node(f.node).properties;
  for (size_t j = static_cast<size_t>(f.count + 1); j < props.size(); ++j) {
    if (props[j].required) return false;
  }
  return true;
}

bool SchemaAutomaton::FeedObject(Frame& f, uint8_t c) {
  switch (f.phase) {
    case Phase::kObjectFirst:
    case Phase::kObjectAfter:
      if (c == '}' && CanClose(f)) {
        --depth_;
        EndValue();
        return true;
      }
      if (f.phase == Phase::kObjectAfter) {
        if (c != ',' || KeyCandidates(f) == 0) return false;
        f.phase = Phase::kObjectKey, ws_ = 0;
        return true;
      }
      [[fallthrough]];
    case Phase::kObjectKey: {
      const uint64_t candidates = KeyCandidates(f);
      if (c != '"' || candidates == 0) return false;
      lex_ = Lex::kKey, literal_node_ = f.node, alive_ = candidates, literal_at_ = 0, ws_ = 0;
      return FeedLiterals(c);  // every key starts with its quote
    }
    case Phase::kObjectColon:
      if (c != ':') return false;
      expect_ = node(f.node).properties[static_cast<size_t>(f.count)].node;
      f.phase = Phase::kObjectAfter, ws_ = 0;
      return true;
    default:
      return false;
  }
}

bool SchemaAutomaton::FeedArray(Frame& f, uint8_t c) {
  const SchemaNode& n = node(f.node);
  const size_t at = depth_ - 1u;
  switch (f.phase) {
    case Phase::kArrayFirst:
      if (c == ']') {
        if (n.min_items > 0) return false;
        --depth_;
        EndValue();
        return true;
      }
      if (n.max_items == 0) return false;
      [[fallthrough]];
    case Phase::kArrayValue: {
      const auto i = static_cast<size_t>(f.count);
      if (!StartValue(i < n.prefix_items.size() ? n.prefix_items[i] : n.items, c)) return false;
      // By index: StartValue may have pushed the item's own frame above this one.
      ++frames_[at].count;
      frames_[at].phase = Phase::kArrayAfter;
      return true;
    }
    case Phase::kArrayAfter:
      if (c == ',') {
        if ((n.max_items >= 0 && f.count >= n.max_items) || f.count == INT16_MAX) return false;
        f.phase = Phase::kArrayValue, ws_ = 0;
        return true;
      }
      if (c != ']' || f.count < n.min_items) return false;
      --depth_;
      EndValue();
      return true;
    default:
      return false;
  }
}

bool SchemaAutomaton::StartValue(int32_t id, uint8_t c) {
  const SchemaNode& n = node(id);
  if (!n.first_bytes[c]) return false;
  using Kind = SchemaNode::Kind;
  if (n.kind == Kind::kUnion) {
    for (int32_t alt : n.alternatives) {
      if (node(alt).first_bytes[c]) return StartValue(alt, c);  // at most one: they start differently
    }
    return false;
  }
  if ((n.kind == Kind::kObject || n.kind == Kind::kArray) && depth_ >= kMaxDepth) return false;
  expect_ = -1, ws_ = 0;
  switch (n.kind) {
    case Kind::kObject: frames_[depth_++] = {id, -1, Phase::kObjectFirst}; return true;
    case Kind::kArray: frames_[depth_++] = {id, 0, Phase::kArrayFirst}; return true;
    case Kind::kString: {
      lex_ = Lex::kString, string_ = {}, value_node_ = id, chars_ = 0, dfa_ = nullptr, dfa_state_ = 0;
      const bool counted = n.dfa < 0 && (n.min_length > 0 || n.max_length >= 0);
      string_.no_unicode_escape = counted;  // a DFA takes no \u either
      if (n.dfa >= 0) {
        dfa_ = graph_->dfas[static_cast<size_t>(n.dfa)].get();
        dfa_state_ = dfa_->start;
      }
      return true;
    }
    case Kind::kNumber:
    case Kind::kInteger:
      if (n.dfa >= 0) {  // a bounded number: its range's DFA
        lex_ = Lex::kRange, value_node_ = id, dfa_ = graph_->dfas[static_cast<size_t>(n.dfa)].get();
        dfa_state_ = dfa_->Step(dfa_->start, c);
        return dfa_state_ >= 0;
      }
      lex_ = Lex::kNumber;
      return number_.Start(c, n.kind == Kind::kInteger);
    case Kind::kLiterals:
      lex_ = Lex::kLiteral, literal_node_ = id, literal_at_ = 0;
      alive_ = n.literals.size() >= 64 ? ~uint64_t{0} : (uint64_t{1} << n.literals.size()) - 1;
      return FeedLiterals(c);
    case Kind::kAnyValue:
    case Kind::kAnyObject:
      lex_ = Lex::kAny, any_ = JsonAutomaton(n.kind == Kind::kAnyObject);
      return any_.Feed(c);
    case Kind::kUnion: break;
  }
  return false;
}

// Literals (an enum's texts) or keys (an object's quoted names) still matching: narrowed by c.
// A literal that no other extends ends at its last byte; one that another could extend ("1"
// and "12") ends when the next byte extends none.
bool SchemaAutomaton::FeedLiterals(uint8_t c) {
  const SchemaNode& n = node(literal_node_);
  const bool keys = lex_ == Lex::kKey;
  auto text = [&](int i) -> const std::string& {
    return keys ? n.properties[static_cast<size_t>(i)].key : n.literals[static_cast<size_t>(i)];
  };
  uint64_t next = 0;
  bool whole = false;  // a literal ends exactly where the bytes so far do
  for (uint64_t m = alive_; m != 0; m &= m - 1) {
    const int i = std::countr_zero(m);
    const std::string& t = text(i);
    if (t.size() == literal_at_) whole = true;
    if (t.size() > literal_at_ && static_cast<uint8_t>(t[literal_at_]) == c) next |= uint64_t{1} << i;
  }
  if (next == 0) return whole && !keys && EndedBefore(c);
  alive_ = next;
  ++literal_at_;
  bool ends = false, longer = false;
  for (uint64_t m = alive_; m != 0; m &= m - 1) {
    const int i = std::countr_zero(m);
    (text(i).size() == literal_at_ ? ends : longer) = true;
  }
  if (!ends || longer) return true;
  if (keys) {
    Frame& f = frames_[depth_ - 1];
    f.count = static_cast<int16_t>(std::countr_zero(alive_));  // keys are distinct: one ends here
    f.phase = Phase::kObjectColon;
    lex_ = Lex::kNone, ws_ = 0;
  } else {
    SelectTagged();
    EndValue();
  }
  return true;
}

// A tagged union's tag value just ended (one literal, alive_): the object it names takes the
// frame, from its second property on.
void SchemaAutomaton::SelectTagged() {
  if (depth_ == 0) return;
  Frame& f = frames_[depth_ - 1];
  const SchemaNode& n = node(f.node);
  if (n.tag_targets.empty() || f.count != 0 || literal_node_ != n.properties[0].node) return;
  f.node = n.tag_targets[static_cast<size_t>(std::countr_zero(alive_))];
}

// The value in progress is whole: back to its container, or done at the top.
void SchemaAutomaton::EndValue() {
  lex_ = Lex::kNone, ws_ = 0, expect_ = -1;
  if (depth_ == 0) {
    done_ = true;
    return;
  }
  Frame& f = frames_[depth_ - 1];
  f.phase = node(f.node).kind == SchemaNode::Kind::kObject ? Phase::kObjectAfter : Phase::kArrayAfter;
}

bool SchemaAutomaton::Accepted() const {
  if (done_) return true;
  if (depth_ != 0 || expect_ >= 0) return false;
  switch (lex_) {
    case Lex::kNumber: return number_.Complete();
    case Lex::kRange: return dfa_->accepting[static_cast<size_t>(dfa_state_)];
    case Lex::kAny: return any_.Complete();
    case Lex::kLiteral: {
      const auto& literals = node(literal_node_).literals;
      for (uint64_t m = alive_; m != 0; m &= m - 1) {
        if (literals[static_cast<size_t>(std::countr_zero(m))].size() == literal_at_) return true;
      }
      return false;
    }
    default: return false;
  }
}

std::string SchemaAutomaton::Key() const {
  std::string key;
  key.reserve(32 + depth_ * 8u);
  Append(key, done_), Append(key, expect_), Append(key, depth_), Append(key, lex_);
  for (size_t i = 0; i < depth_; ++i) Append(key, frames_[i].node), Append(key, frames_[i].count), Append(key, frames_[i].phase);
  switch (lex_) {
    case Lex::kNone: Append(key, ws_); break;
    case Lex::kString: {
      Append(key, string_.sub), Append(key, string_.utf8_left), Append(key, string_.utf8_first);
      Append(key, value_node_), Append(key, dfa_state_);
      // The count matters up to minLength without a maxLength, exactly with one.
      const SchemaNode& n = node(value_node_);
      const uint32_t chars = n.max_length >= 0 ? chars_ : static_cast<uint32_t>(std::min<int64_t>(chars_, n.min_length));
      Append(key, chars);
      break;
    }
    case Lex::kNumber: Append(key, number_.state), Append(key, number_.integer); break;
    case Lex::kRange: Append(key, value_node_), Append(key, dfa_state_); break;
    case Lex::kLiteral:
    case Lex::kKey: Append(key, alive_), Append(key, literal_at_), Append(key, literal_node_); break;
    case Lex::kAny: key += any_.Key(); break;
  }
  return key;
}

}  // namespace ferry::worker
