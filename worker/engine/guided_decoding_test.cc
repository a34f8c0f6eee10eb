#include "worker/engine/guided_decoding.h"

#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <random>

#include "structured/json_schema.h"
#include "worker/engine/guided_automata.h"
#include "worker/engine/guided_schema.h"
#include "worker/engine/guided_test_util.h"

namespace ferry::worker {
namespace {

// How many leading bytes of text the automaton takes (text.size() when all).
template <class Automaton>
size_t Taken(Automaton a, const std::string& text) {
  for (size_t i = 0; i < text.size(); ++i) {
    if (!a.Feed(static_cast<uint8_t>(text[i]))) return i;
  }
  return text.size();
}

bool JsonAccepts(const std::string& text) {
  JsonAutomaton a;
  for (char c : text) {
    if (!a.Feed(static_cast<uint8_t>(c))) return false;
  }
  return a.Accepted();
}

TEST(JsonAutomatonTest, AcceptsObjectsOfEveryKindOfValue) {
  for (const std::string text : {
           R"({})", R"({"a":1})", R"({ "a" : [1, -2.5e+3, 0, 0.5E-2, 10, true, false, null, [], {}] })",
           R"({"k":"x\n\"\\\/\b\f\r\t\u00e9\uABCD"})", "{\"utf8\":\"\xC3\xA9\xE4\xB8\xAD\xF0\x9F\x98\x80\"}",
           "{\n  \"a\": {\n    \"b\": [\n      1\n    ]\n  }\n}", R"({"":""})"}) {
    EXPECT_TRUE(JsonAccepts(text)) << text;
  }
}

TEST(JsonAutomatonTest, RejectsAtTheFirstByteThatCannotLeadToAnObject) {
  // (text, bytes taken before the rejected one)
  const std::vector<std::pair<std::string, size_t>> cases = {
      {"[1]", 0},          {"\"x\"", 0},        {"{a", 1},           {R"({"a" 1)", 5},
      {R"({"a":01)", 6},   {R"({"a":1.})", 7},  {R"({"a":-})", 6},   {R"({"a":tru})", 8},
      {"{\"a\":\"\x01", 6}, {R"({"a":"\q")", 7}, {R"({"a":1}})", 7},  {R"({"a":1} )", 7},
      {R"({"a":1,})", 7},  {R"({,})", 1},       {R"({"a":[1,]})", 8}, {R"({"a":1]})", 6},
      {"{\"a\":\"\xC0\x80", 6},                  {"{\"a\":\"\xED\xA0\x80", 7},  // overlong, surrogate
      {"{\"a\":\"\xF4\x90", 7},                  {"{\"a\":\"\xC3(", 7},          // past U+10FFFF, cut
      {R"({"a":"\u12G4"})", 10},                 {R"({"a":1e})", 7}, {R"({"a":nul})", 8}};
  for (const auto& [text, taken] : cases) {
    EXPECT_EQ(Taken(JsonAutomaton{}, text), taken) << text;
  }
}

TEST(JsonAutomatonTest, AcceptedOnlyOnceTheObjectCloses) {
  JsonAutomaton a;
  for (char c : std::string(R"({"a":[1,{"b":2}]})")) {
    EXPECT_FALSE(a.Accepted());
    ASSERT_TRUE(a.Feed(static_cast<uint8_t>(c)));
  }
  EXPECT_TRUE(a.Accepted());
  EXPECT_FALSE(a.Feed(' ')) << "nothing follows the object";
}

TEST(JsonAutomatonTest, BoundsWhitespaceRunsAndDepth) {
  EXPECT_EQ(Taken(JsonAutomaton{}, std::string(40, ' ') + "{}"), size_t{JsonAutomaton::kMaxWhitespace});
  EXPECT_TRUE(JsonAccepts(std::string(JsonAutomaton::kMaxWhitespace, '\n') + "{}"));
  std::string deep = R"({"a":)";
  for (size_t i = 1; i < JsonAutomaton::kMaxDepth; ++i) deep += "[";
  EXPECT_EQ(Taken(JsonAutomaton{}, deep + "["), deep.size()) << "one level too deep";
}

TEST(JsonAutomatonTest, FailedFeedLeavesTheStateAsItWas) {
  JsonAutomaton a;
  ASSERT_EQ(Taken(a, R"({"a":12)"), 7u);
  for (char c : std::string(R"({"a":12)")) a.Feed(static_cast<uint8_t>(c));
  const std::string key = a.Key();
  EXPECT_FALSE(a.Feed('x'));
  EXPECT_FALSE(a.Feed(':'));  // ends the number, then is rejected after it
  EXPECT_EQ(a.Key(), key);
  EXPECT_TRUE(a.Feed('}'));
  EXPECT_TRUE(a.Accepted());
}

// A random JSON value; objects at the top.
nlohmann::json RandomValue(std::mt19937& rng, int depth) {
  const int kind = static_cast<int>(rng() % (depth >= 4 ? 5u : 7u));
  switch (kind) {
    case 0: return nullptr;
    case 1: return rng() % 2 == 0;
    case 2: return static_cast<int64_t>(rng() % 20001) - 10000;
    case 3: return std::ldexp(static_cast<double>(rng() % 100000) - 50000, -static_cast<int>(rng() % 40));
    case 4: {
      static const char* const kUnits[] = {"a", "b", "\"", "\\", "\n", "\x01", " ", "\xC3\xA9", "\xE2\x82\xAC"};
      std::string s;
      for (size_t n = rng() % 6; n-- > 0;) s += kUnits[rng() % 9];
      return s;
    }
    case 5: {
      nlohmann::json a = nlohmann::json::array();
      for (size_t n = rng() % 4; n-- > 0;) a.push_back(RandomValue(rng, depth + 1));
      return a;
    }
    default: {
      nlohmann::json o = nlohmann::json::object();
      for (size_t n = rng() % 4; n-- > 0;) o["k" + std::to_string(rng() % 10)] = RandomValue(rng, depth + 1);
      return o;
    }
  }
}

bool ValidUtf8Json(const std::string& s) { return nlohmann::json::accept(s); }

// The automaton against nlohmann's parser: dumped documents are accepted whole, and a mutated
// one is accepted exactly when nlohmann accepts it and it is an object with nothing after it.
TEST(JsonAutomatonTest, AgreesWithAParserOnRandomAndMutatedDocuments) {
  std::mt19937 rng(7);
  const std::string alphabet = "{}[]:,\" \\0123456789.eE+-truefalsnl\n\x01\xC3\xA9";
  int mutated_accepted = 0;
  for (int i = 0; i < 3000; ++i) {
    nlohmann::json doc = nlohmann::json::object();
    for (size_t n = rng() % 4; n-- > 0;) doc["key" + std::to_string(n)] = RandomValue(rng, 1);
    const std::string text = doc.dump(rng() % 2 == 0 ? -1 : 2);
    ASSERT_TRUE(JsonAccepts(text)) << text;
    const std::string m = testing::Mutated(text, rng, alphabet);
    if (testing::HasHugeExponent(m)) continue;
    // Leading whitespace is allowed (within the run limit), trailing is not.
    const size_t first = m.find_first_not_of(" \t\n\r");
    const bool oracle = ValidUtf8Json(m) && first != std::string::npos && m[first] == '{' && m.back() == '}';
    ASSERT_EQ(JsonAccepts(m), oracle) << m;
    mutated_accepted += oracle;
  }
  EXPECT_GT(mutated_accepted, 300) << "mutations must also produce valid documents to compare on";
}

TEST(ChoiceAutomatonTest, TakesExactlyTheChoices) {
  const std::vector<std::string> choices = {"no", "yes", "yes sir"};  // sorted
  ChoiceAutomaton a(&choices);
  EXPECT_FALSE(a.Accepted());
  for (char c : std::string("yes")) ASSERT_TRUE(a.Feed(static_cast<uint8_t>(c)));
  EXPECT_TRUE(a.Accepted());
  ASSERT_TRUE(a.Feed(' '));
  EXPECT_FALSE(a.Accepted());
  EXPECT_EQ(Taken(a, "sir!"), 3u);
  EXPECT_EQ(Taken(ChoiceAutomaton(&choices), "nope"), 2u);
  EXPECT_EQ(Taken(ChoiceAutomaton(&choices), "maybe"), 0u);
}

// ---------------------------------------------------------------------------------------------
// Vocabulary walk and matchers

constexpr int32_t kEos = 3;

// Every token whose bytes the automaton takes whole: what the trie walk must find.
template <class Automaton>
std::vector<int32_t> BruteForce(const std::vector<std::string>& bytes, const Automaton& a) {
  std::vector<int32_t> out;
  for (int32_t id = 0; id < static_cast<int32_t>(bytes.size()); ++id) {
    if (!bytes[id].empty() && id != kEos && Taken(a, bytes[id]) == bytes[id].size()) out.push_back(id);
  }
  return out;
}

using testing::Members;

std::vector<std::string> RandomVocab(std::mt19937& rng) {
  const std::string alphabet = "{}[]:,\" \\0123.e-tfnaurls\n\xC3\xA9";
  std::vector<std::string> v;
  for (int i = 0; i < 256; ++i) v.push_back(std::string(1, static_cast<char>(i)));  // every byte
  for (int i = 0; i < 3000; ++i) {
    std::string t;
    for (size_t n = 1 + rng() % 6; n-- > 0;) t += alphabet[rng() % alphabet.size()];
    v.push_back(t);
  }
  v.push_back(v[300]);  // a duplicate byte string
  v.push_back("");      // a special token
  return v;
}

TEST(GuidedVocabTest, WalkFindsExactlyTheTokensTheAutomatonTakes) {
  std::mt19937 rng(3);
  const std::vector<std::string> bytes = RandomVocab(rng);
  GuidedVocab vocab(bytes, {kEos});
  for (int run = 0; run < 20; ++run) {
    std::unique_ptr<GuidedMatcher> m = MakeGuidedMatcher({GuidedSpec::Kind::kJsonObject, {}}, vocab);
    JsonAutomaton mirror;
    for (int step = 0; step < 40 && !m->Accepted(); ++step) {
      std::vector<int32_t> expected = BruteForce(bytes, mirror);
      std::vector<int32_t> got = Members(m->Allowed());
      ASSERT_EQ(got, expected) << "run " << run << " step " << step;
      ASSERT_FALSE(got.empty());
      const int32_t pick = got[rng() % got.size()];
      ASSERT_TRUE(m->Advance(pick));
      for (char c : bytes[pick]) mirror.Feed(static_cast<uint8_t>(c));
    }
  }
}

// Inside a free string a mask is the lexer's precomputed `inside` set plus short walks under
// the tokens that close the string (GuidedVocab::StringClassesFor): it must be exactly what the
// automaton takes, in every lexer state (plain, after a backslash, inside \u, between UTF-8
// bytes), for keys and values at any nesting, for a schema's strings and for a string inside a
// schema value of any shape.
TEST(GuidedVocabTest, FreeStringMasksAreExactlyWhatTheAutomatonTakes) {
  std::mt19937 rng(9);
  std::vector<std::string> bytes = RandomVocab(rng);
  for (const char* t : {"\"", "\\\"", "a\"", "\"}", "\":", "\",\"", "\\u00", "\xC3", "\xA9\"", "\xF0\x9F", "\x98\x80"}) {
    bytes.push_back(t);
  }
  bytes.push_back("\",");  // a duplicate of an exit token
  bytes.push_back("\",");
  GuidedVocab vocab(bytes, {kEos});
  ASSERT_FALSE(vocab.duplicates().empty());
  const size_t precomputed = vocab.string_classes_computed();
  const std::vector<std::string> string_ends = {"", "ab", "\\", "\\u", "\\u0", "\\u00e", "\xC3", "\xE0", "\xED", "\xF0", "\xF0\x90", "\xF4\x8F\xBF"};
  const std::string schema = R"({"type": "object", "properties": {"s": {"type": "string"}, "any": {}}})";
  const SchemaGraph graph = CompileJsonSchema(schema);
  for (const std::string& end : string_ends) {
    for (const std::string& json_prefix : {"{\"", "{\"k\": \"", "{\"k\": [1, {\"x\": [\""}) {
      auto m = MakeGuidedMatcher({GuidedSpec::Kind::kJsonObject, {}}, vocab);
      JsonAutomaton mirror;
      const std::string text = json_prefix + end;
      ASSERT_EQ(Taken(mirror, text), text.size()) << text;
      for (char c : text) ASSERT_TRUE(m->Advance(static_cast<unsigned char>(c))) << text;  // ids 0-255: bytes
      for (char c : text) mirror.Feed(static_cast<uint8_t>(c));
      ASSERT_NE(mirror.FreeString(), nullptr) << text;
      EXPECT_EQ(Members(m->Allowed()), BruteForce(bytes, mirror)) << text;
    }
    for (const std::string& schema_prefix : {"{\"s\":\"", "{\"any\":[\"", "{\"any\":{\"k\":\""}) {
      auto m = MakeGuidedMatcher({GuidedSpec::Kind::kJsonSchema, {}, schema}, vocab);
      SchemaAutomaton mirror(&graph);
      const std::string text = schema_prefix + end;
      ASSERT_EQ(Taken(mirror, text), text.size()) << text;
      for (char c : text) ASSERT_TRUE(m->Advance(static_cast<unsigned char>(c))) << text;
      for (char c : text) mirror.Feed(static_cast<uint8_t>(c));
      ASSERT_NE(mirror.FreeString(), nullptr) << text;
      EXPECT_EQ(Members(m->Allowed()), BruteForce(bytes, mirror)) << text;
    }
  }
  EXPECT_GT(vocab.string_classes_computed(), precomputed) << "the lexer states past the plain one were classified";
  // Counted strings (maxLength: tokens past the characters left are dropped; minLength: the
  // string closes only once long enough), with every count up to the limit.
  const std::string counted = R"({"type": "object", "properties": {"s": {"type": "string", "maxLength": 4},
      "m": {"type": "string", "minLength": 3}}})";
  const SchemaGraph counted_graph = CompileJsonSchema(counted);
  int compared = 0;
  for (const std::string prefix : {"{\"s\":\"", "{\"m\":\""}) {
    for (const std::string end : {"", "a", "ab", "abc", "abcd", "\\", "a\\", "\xC3", "ab\\n", "a\xC3\xA9b"}) {
      SchemaAutomaton mirror(&counted_graph);
      const std::string text = prefix + end;
      if (Taken(mirror, text) != text.size()) continue;
      auto m = MakeGuidedMatcher({GuidedSpec::Kind::kJsonSchema, {}, counted}, vocab);
      for (char c : text) ASSERT_TRUE(m->Advance(static_cast<unsigned char>(c))) << text;
      for (char c : text) mirror.Feed(static_cast<uint8_t>(c));
      ASSERT_NE(mirror.FreeString(), nullptr) << text;
      EXPECT_EQ(Members(m->Allowed()), BruteForce(bytes, mirror)) << text;
      ++compared;
    }
  }
  EXPECT_GE(compared, 16);
}

TEST(GuidedMatcherTest, JsonEndsOnlyWithTheObjectAndThenOnlyEnds) {
  const std::vector<std::string> bytes = {"{", "}", "\"a\"", "", ":1", " ", "}}"};
  GuidedVocab vocab(bytes, {kEos});
  auto m = MakeGuidedMatcher({GuidedSpec::Kind::kJsonObject, {}}, vocab);
  EXPECT_EQ(Members(m->Allowed()), (std::vector<int32_t>{0, 5}));
  EXPECT_FALSE(m->Advance(kEos)) << "no end before the object";
  EXPECT_FALSE(m->Advance(1));
  ASSERT_TRUE(m->Advance(0));
  EXPECT_EQ(Members(m->Allowed()), (std::vector<int32_t>{1, 2, 5}));
  for (int32_t id : {2, 4}) ASSERT_TRUE(m->Advance(id));
  EXPECT_FALSE(m->Advance(6)) << "}} closes one brace too many";
  ASSERT_TRUE(m->Advance(1));
  EXPECT_TRUE(m->Accepted());
  EXPECT_EQ(Members(m->Allowed()), (std::vector<int32_t>{kEos}));
  EXPECT_TRUE(m->Advance(kEos));
  EXPECT_TRUE(m->Accepted());
}

TEST(GuidedMatcherTest, JsonMasksAreSharedByState) {
  std::mt19937 rng(5);
  GuidedVocab vocab(RandomVocab(rng), {kEos});
  auto a = MakeGuidedMatcher({GuidedSpec::Kind::kJsonObject, {}}, vocab);
  auto b = MakeGuidedMatcher({GuidedSpec::Kind::kJsonObject, {}}, vocab);
  EXPECT_EQ(&a->Allowed(), &b->Allowed()) << "the same state's mask is computed once";
}

TEST(GuidedVocabTest, MaskCacheEvictsTheLeastRecentlyUsed) {
  GuidedVocab vocab({"a", "b"}, {});
  auto mask = std::make_shared<const TokenMask>(2);
  for (size_t i = 0; i < GuidedVocab::kMaskCacheEntries; ++i) vocab.CacheMask("k" + std::to_string(i), mask);
  ASSERT_EQ(vocab.cached_masks(), GuidedVocab::kMaskCacheEntries);
  ASSERT_NE(vocab.CachedMask("k0"), nullptr);  // now the most recently used
  vocab.CacheMask("new", mask);
  EXPECT_EQ(vocab.cached_masks(), GuidedVocab::kMaskCacheEntries) << "one out for one in";
  EXPECT_NE(vocab.CachedMask("k0"), nullptr) << "used recently: kept";
  EXPECT_EQ(vocab.CachedMask("k1"), nullptr) << "the least recently used goes";
  EXPECT_NE(vocab.CachedMask("k2"), nullptr);
  EXPECT_NE(vocab.CachedMask("new"), nullptr);
}

TEST(GuidedMatcherTest, ChoiceAllowsPrefixesAndEndsOnAWholeChoice) {
  // ids: 0 "y", 1 "es", 2 "yes", 3 eos, 4 "no", 5 " sir", 6 "n", 7 "x"
  const std::vector<std::string> bytes = {"y", "es", "yes", "", "no", " sir", "n", "x"};
  GuidedVocab vocab(bytes, {kEos});
  auto m = MakeGuidedMatcher({GuidedSpec::Kind::kChoice, {"yes", "no", "yes sir", "no"}}, vocab);
  EXPECT_EQ(Members(m->Allowed()), (std::vector<int32_t>{0, 2, 4, 6}));
  ASSERT_TRUE(m->Advance(0));
  EXPECT_EQ(Members(m->Allowed()), (std::vector<int32_t>{1}));
  ASSERT_TRUE(m->Advance(1));
  EXPECT_TRUE(m->Accepted());
  EXPECT_EQ(Members(m->Allowed()), (std::vector<int32_t>{kEos, 5})) << "end, or go on to 'yes sir'";
  EXPECT_FALSE(m->Advance(7));
  EXPECT_TRUE(m->Advance(kEos));
  EXPECT_THROW(MakeGuidedMatcher({GuidedSpec::Kind::kChoice, {""}}, vocab), std::invalid_argument);
}

TEST(GuidedMatcherTest, RegexAllowsWhatCanStillMatchAndEndsOnAMatch) {
  // ids: 0 "1", 1 "23", 2 eos, 3 "-", 4 "4-", 5 "x", 6 "12345"
  const std::vector<std::string> bytes = {"1", "23", "", "-", "4-", "x", "12345"};
  GuidedVocab vocab(bytes, {2});
  GuidedSpec spec{GuidedSpec::Kind::kRegex, {}, {}, R"(\d{3}-\d{2})"};
  auto m = MakeGuidedMatcher(spec, vocab);
  EXPECT_EQ(Members(m->Allowed()), (std::vector<int32_t>{0, 1}));
  for (int32_t id : {0, 1}) ASSERT_TRUE(m->Advance(id));
  EXPECT_EQ(Members(m->Allowed()), (std::vector<int32_t>{3}));
  EXPECT_FALSE(m->Advance(2)) << "no end before a match";
  ASSERT_TRUE(m->Advance(3));
  EXPECT_EQ(Members(m->Allowed()), (std::vector<int32_t>{0, 1}));
  ASSERT_TRUE(m->Advance(1));
  EXPECT_TRUE(m->Accepted());
  EXPECT_EQ(Members(m->Allowed()), (std::vector<int32_t>{2}));
  auto twin = MakeGuidedMatcher(spec, vocab);
  EXPECT_EQ(&twin->Allowed(), &MakeGuidedMatcher(spec, vocab)->Allowed()) << "masks shared by pattern and state";
  spec.regex = "(a)\\1";
  EXPECT_THROW(MakeGuidedMatcher(spec, vocab), std::invalid_argument);
}

TEST(GuidedVocabTest, ReadsAByteLevelTokenizerJson) {
  const auto path = std::filesystem::temp_directory_path() / "ferry_guided_tokenizer.json";
  nlohmann::json j = {
      {"model", {{"type", "BPE"}, {"vocab", {{"\xC4\xA0" "a", 0}, {"b", 1}, {"\xC4\x8A", 2}, {"\xC3\xA9", 3}}}}},
      {"added_tokens", {{{"id", 4}, {"content", "<|end|>"}, {"special", true}},
                        {{"id", 5}, {"content", "<tool>"}, {"special", false}}}}};
  std::ofstream(path) << j.dump();
  const auto vocab = GuidedVocab::FromTokenizerJson(path.string(), 8, {4});
  EXPECT_EQ(vocab->size(), 8);
  EXPECT_EQ(vocab->bytes(0), " a");   // Ġ is the space byte
  EXPECT_EQ(vocab->bytes(2), "\n");   // Ċ is the newline byte
  EXPECT_EQ(vocab->bytes(3), "\xE9");  // é stands for the byte 0xE9, half a character
  EXPECT_EQ(vocab->bytes(4), "");
  EXPECT_EQ(vocab->bytes(5), "<tool>");
  EXPECT_EQ(vocab->bytes(7), "") << "an id the tokenizer lacks";
  EXPECT_TRUE(vocab->IsEos(4));
  std::ofstream(path) << R"({"model": {"type": "Unigram"}})";
  EXPECT_THROW(GuidedVocab::FromTokenizerJson(path.string(), 8, {}), std::runtime_error);
  std::filesystem::remove(path);
}

// Mistral's and Llama 2's tokenizer.json: "▁" is a space, "<0xHH>" one byte; in both published
// forms (byte fallback with Prepend/Replace normalisers, and the Metaspace decoder alone).
TEST(GuidedVocabTest, ReadsASentencePieceStyleTokenizerJson) {
  const auto path = std::filesystem::temp_directory_path() / "ferry_guided_sp_tokenizer.json";
  const std::string space = "\xE2\x96\x81";
  nlohmann::json vocab = {{"<unk>", 0}, {"<s>", 1}, {"</s>", 2}, {"<0x0A>", 3}, {"<0xE9>", 4},
                          {space + "{", 5}, {"{", 6}, {space + space + "a", 7}, {"<0x>", 8}};
  nlohmann::json added = {{{"id", 0}, {"content", "<unk>"}, {"special", true}},
                          {{"id", 1}, {"content", "<s>"}, {"special", true}},
                          {{"id", 2}, {"content", "</s>"}, {"special", true}}};
  for (const bool fallback : {true, false}) {
    nlohmann::json j = {{"model", {{"type", "BPE"}, {"byte_fallback", fallback}, {"vocab", vocab}}},
                        {"added_tokens", added}};
    if (!fallback) j["decoder"] = {{"type", "Metaspace"}, {"replacement", space}};
    std::ofstream(path) << j.dump();
    const auto v = GuidedVocab::FromTokenizerJson(path.string(), 9, {2});
    EXPECT_EQ(v->bytes(0), "");
    EXPECT_EQ(v->bytes(2), "");
    EXPECT_EQ(v->bytes(3), fallback ? "\n" : "<0x0A>") << "bytes only with byte fallback";
    EXPECT_EQ(v->bytes(4), fallback ? "\xE9" : "<0xE9>");
    EXPECT_EQ(v->bytes(5), " {");
    EXPECT_EQ(v->bytes(6), "{");
    EXPECT_EQ(v->bytes(7), "  a");
    EXPECT_EQ(v->bytes(8), "<0x>") << "not a byte token";
    // A constraint starting with "{" takes "{" first, never " {".
    GuidedSpec spec;
    spec.kind = GuidedSpec::Kind::kChoice;
    spec.choices = {"{"};
    auto m = MakeGuidedMatcher(spec, *v);
    EXPECT_EQ(Members(m->Allowed()), (std::vector<int32_t>{6}));
  }
  std::filesystem::remove(path);
}

}  // namespace
}  // namespace ferry::worker
