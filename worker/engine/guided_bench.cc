// ferry-guided-bench: what guided decoding costs a step at Qwen2's vocabulary size. Builds a
// synthetic byte vocabulary of 151,643 tokens (the 256 bytes, then words with and without a
// leading space, digit runs, punctuation runs and CJK characters), or reads a real
// tokenizer.json with --tokenizer, then times the trie build and each JSON state's mask, first
// walked and then from the cache, along one short JSON text; and one choice mask.
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <random>
#include <set>
#include <string>
#include <vector>

#include "structured/regex_dfa.h"
#include "worker/engine/guided_decoding.h"
#include "worker/engine/sampler.h"

namespace ferry::worker {
namespace {

constexpr int32_t kVocab = 151936;  // Qwen2's embedding rows
constexpr int32_t kEos = 151643;

std::vector<std::string> SyntheticVocab() {
  std::mt19937 rng(1);
  std::set<std::string> seen;
  std::vector<std::string> bytes;
  for (int b = 0; b < 256; ++b) bytes.emplace_back(1, static_cast<char>(b));
  const std::string letters = "etaoinshrdlucmfwypvbgkjqxz";
  const std::string punct = "{}[]:,\"'()<>=+-*/.;!?#\n\t ";
  while (bytes.size() < static_cast<size_t>(kEos)) {
    std::string t;
    const unsigned kind = rng() % 10;
    if (kind < 6) {  // words, skewed to common letters
      if (rng() % 2) t = " ";
      for (unsigned n = 1 + rng() % 9; n-- > 0;) t += letters[std::min(rng() % 26, rng() % 26)];
    } else if (kind < 7) {
      for (unsigned n = 1 + rng() % 4; n-- > 0;) t += static_cast<char>('0' + rng() % 10);
    } else if (kind < 8) {
      for (unsigned n = 1 + rng() % 3; n-- > 0;) t += punct[rng() % punct.size()];
    } else {  // U+4E00.. CJK, three bytes each
      for (unsigned n = 1 + rng() % 3; n-- > 0;) t += std::string("\xE4\xB8") + static_cast<char>(0x80 + rng() % 64);
    }
    if (seen.insert(t).second || t.size() == 1) bytes.push_back(t);
  }
  bytes.resize(kVocab);  // special tokens and padding rows: no bytes
  return bytes;
}

double Ms(std::chrono::steady_clock::time_point a, std::chrono::steady_clock::time_point b) {
  return std::chrono::duration<double, std::milli>(b - a).count();
}

int32_t IdOf(const GuidedVocab& vocab, const std::string& bytes) {
  for (int32_t id = 0; id < vocab.size(); ++id) {
    if (vocab.bytes(id) == bytes) return id;
  }
  return -1;
}

// What the mask adds to one greedy sample over the whole vocabulary (a string state: most
// tokens allowed).
void TimeSampling(GuidedVocab& vocab) {
  std::mt19937 rng(2);
  std::normal_distribution<float> dist(0.f, 2.f);
  std::vector<float> logits(static_cast<size_t>(vocab.size()));
  for (float& l : logits) l = dist(rng);
  auto m = MakeGuidedMatcher({GuidedSpec::Kind::kJsonObject, {}}, vocab);
  for (char c : std::string("{\"")) m->Advance(IdOf(vocab, std::string(1, c)));
  const TokenMask& mask = m->Allowed();
  Sampler sampler;
  constexpr int kRuns = 200;
  double plain = 0, masked = 0;
  for (int i = 0; i < kRuns; ++i) {
    const auto a = std::chrono::steady_clock::now();
    sampler.Sample(logits.data(), vocab.size(), SamplingOptions{}, nullptr, i);
    const auto b = std::chrono::steady_clock::now();
    sampler.Sample(logits.data(), vocab.size(), SamplingOptions{}, nullptr, i, &mask);
    const auto c = std::chrono::steady_clock::now();
    plain += Ms(a, b), masked += Ms(b, c);
  }
  std::printf("\ngreedy sample over %d logits: %.3f ms plain, %.3f ms with a mask (mean of %d)\n", vocab.size(),
              plain / kRuns, masked / kRuns, kRuns);
}

// What compiling a constraint costs (each process does it once per text: CompileRegexCached).
void TimeCompiles() {
  std::printf("\n");
  for (const char* pattern : {R"(\(\d{3}\) \d{3}-\d{4})", R"(\w+@\w+\.(com|org|net))", "(a|b)*a(a|b){10}", "[^\\n]{1,200}"}) {
    const auto a = std::chrono::steady_clock::now();
    const RegexDfa dfa = CompileRegex(pattern);
    std::printf("compile regex %s: %d DFA states, %.2f ms\n", pattern, dfa.num_states(), Ms(a, std::chrono::steady_clock::now()));
  }
}

// A recursive grammar (a pushdown automaton, structured/grammar_pda.h): llama.cpp's json.gbnf,
// a byte a token, walked (nothing cached: a new grammar text each run would see the same).
void TimeGrammar(GuidedVocab& vocab) {
  const std::string json_gbnf = R"g(root   ::= object
value  ::= object | array | string | number | ("true" | "false" | "null") ws
object ::= "{" ws ( string ":" ws value ("," ws string ":" ws value)* )? "}" ws
array  ::= "[" ws ( value ("," ws value)* )? "]" ws
string ::= "\"" ( [^"\\\x7F\x00-\x1F] | "\\" (["\\bfnrt] | "u" [0-9a-fA-F]{4}) )* "\"" ws
number ::= ("-"? ([0-9] | [1-9] [0-9]{0,15})) ("." [0-9]+)? ([eE] [-+]? [0-9] [1-9]{0,15})? ws
ws ::= | " " | "\n" [ \t]{0,20})g";
  GuidedSpec spec;
  spec.kind = GuidedSpec::Kind::kGrammar;
  spec.grammar = json_gbnf;
  const auto c0 = std::chrono::steady_clock::now();
  auto m = MakeGuidedMatcher(spec, vocab);
  std::printf("\ngrammar json.gbnf (pushdown automaton), compiled in %.2f ms, a byte a token:\n"
              "| next byte | allowed | walk ms |\n|---|---|---|\n",
              Ms(c0, std::chrono::steady_clock::now()));
  double total = 0;
  const std::string text = R"({"name": "x y", "tags": [12, {"k": [true]}]})";
  for (char next : text) {
    const auto a = std::chrono::steady_clock::now();
    const int32_t allowed = m->Allowed().Count();
    const double ms = Ms(a, std::chrono::steady_clock::now());
    total += ms;
    std::printf("| `%c` | %d | %.2f |\n", next, allowed, ms);
    if (!m->Advance(IdOf(vocab, std::string(1, next)))) {
      std::printf("refused '%c'\n", next);
      return;
    }
  }
  std::printf("accepted: %s; %zu bytes, mean walk %.2f ms\n", m->Accepted() ? "yes" : "no", text.size(),
              total / static_cast<double>(text.size()));
}

int Run(int argc, char** argv) {
  const auto t0 = std::chrono::steady_clock::now();
  std::unique_ptr<GuidedVocab> vocab =
      argc > 2 && std::string(argv[1]) == "--tokenizer"
          ? GuidedVocab::FromTokenizerJson(argv[2], kVocab, {kEos})
          : std::make_unique<GuidedVocab>(SyntheticVocab(), std::vector<int32_t>{kEos});
  const auto t1 = std::chrono::steady_clock::now();
  std::printf("vocabulary %d ids, trie %zu nodes, loaded and built in %.1f ms\n", vocab->size(),
              vocab->trie().size(), Ms(t0, t1));
  // Two sequences writing the same text: the first walks each new state, the second finds it cached.
  auto json = MakeGuidedMatcher({GuidedSpec::Kind::kJsonObject, {}}, *vocab);
  auto twin = MakeGuidedMatcher({GuidedSpec::Kind::kJsonObject, {}}, *vocab);
  std::printf("| next token | allowed | walk ms | cached ms |\n|---|---|---|---|\n");
  for (const char* next : {"{", "\"", "a", " b", "\"", ":", " ", "[", "1", "2", ",", "\"", "x", "\"", "]", "}"}) {
    const auto a = std::chrono::steady_clock::now();
    const int32_t allowed = json->Allowed().Count();
    const auto b = std::chrono::steady_clock::now();
    twin->Allowed();
    const auto c = std::chrono::steady_clock::now();
    const int32_t id = IdOf(*vocab, next);
    const std::string shown = next[0] == '\n' ? "\\n" : next;
    std::printf("| `%s` | %d | %.2f | %.4f |\n", shown.c_str(), allowed, Ms(a, b), Ms(b, c));
    if (id < 0 || !json->Advance(id) || !twin->Advance(id)) {
      std::printf("no token for '%s' in this vocabulary\n", next);
      return 1;
    }
  }
  std::printf("accepted: %s\n", json->Accepted() ? "yes" : "no");
  const std::string schema = R"({"type": "object", "required": ["name", "tags"], "properties": {
      "name": {"type": "string"}, "tags": {"type": "array", "items": {"enum": ["a", "b"]}}}})";
  auto typed = MakeGuidedMatcher({GuidedSpec::Kind::kJsonSchema, {}, schema}, *vocab);
  // One byte a token, since every byte-level vocabulary has the single bytes.
  std::printf("\njson_schema {name: string, tags: [enum]}, a byte a token:\n| next byte | allowed | walk ms |\n|---|---|---|\n");
  for (char next : std::string(R"({"name":"x","tags":["a"]})")) {
    const auto a = std::chrono::steady_clock::now();
    const int32_t allowed = typed->Allowed().Count();
    std::printf("| `%c` | %d | %.2f |\n", next, allowed, Ms(a, std::chrono::steady_clock::now()));
    const int32_t id = IdOf(*vocab, std::string(1, next));
    if (id < 0 || !typed->Advance(id)) {
      std::printf("no token for '%c' in this vocabulary\n", next);
      return 1;
    }
  }
  std::printf("accepted: %s\n", typed->Accepted() ? "yes" : "no");
  // String assertions: a counted string (maxLength) takes the precomputed classes while the
  // tokens fit, and a format is a DFA over the string's text.
  const std::string constrained = R"({"type": "object", "required": ["title", "day"], "properties": {
      "title": {"type": "string", "maxLength": 12}, "day": {"type": "string", "format": "date"}}})";
  const auto cc0 = std::chrono::steady_clock::now();
  auto strict = MakeGuidedMatcher({GuidedSpec::Kind::kJsonSchema, {}, constrained}, *vocab);
  std::printf("\njson_schema {title: maxLength 12, day: format date}, compiled in %.1f ms, a byte a token:\n"
              "| next byte | allowed | walk ms |\n|---|---|---|\n",
              Ms(cc0, std::chrono::steady_clock::now()));
  for (char next : std::string(R"({"title":"a short one","day":"2024-02-29"})")) {
    const auto a = std::chrono::steady_clock::now();
    const int32_t allowed = strict->Allowed().Count();
    std::printf("| `%c` | %d | %.2f |\n", next, allowed, Ms(a, std::chrono::steady_clock::now()));
    const int32_t id = IdOf(*vocab, std::string(1, next));
    if (id < 0 || !strict->Advance(id)) {
      std::printf("refused '%c'\n", next);
      return 1;
    }
  }
  std::printf("accepted: %s\n", strict->Accepted() ? "yes" : "no");
  // A regular expression: a DFA state per step, the cheapest automaton to copy.
  auto phone = MakeGuidedMatcher({GuidedSpec::Kind::kRegex, {}, {}, R"(\(\d{3}\) \d{3}-\d{4})"}, *vocab);
  double slowest = 0;
  for (char next : std::string("(555) 123-4567")) {
    const auto a = std::chrono::steady_clock::now();
    phone->Allowed();
    slowest = std::max(slowest, Ms(a, std::chrono::steady_clock::now()));
    phone->Advance(IdOf(*vocab, std::string(1, next)));
  }
  std::printf("\nregex (\\d{3}) \\d{3}-\\d{4}, a byte a token: slowest walk %.2f ms, accepted: %s\n", slowest,
              phone->Accepted() ? "yes" : "no");
  auto free_text = MakeGuidedMatcher({GuidedSpec::Kind::kRegex, {}, {}, "[^\\n]{1,200}"}, *vocab);
  const auto fa = std::chrono::steady_clock::now();
  const int32_t free_allowed = free_text->Allowed().Count();
  std::printf("regex [^\\n]{1,200}: %d allowed, walk %.2f ms\n", free_allowed, Ms(fa, std::chrono::steady_clock::now()));
  TimeGrammar(*vocab);
  TimeCompiles();
  TimeSampling(*vocab);
  auto choice = MakeGuidedMatcher({GuidedSpec::Kind::kChoice, {"positive", "negative", "neutral"}}, *vocab);
  const auto a = std::chrono::steady_clock::now();
  const int32_t n = choice->Allowed().Count();
  std::printf("choice of 3: %d allowed, walk %.3f ms\n", n, Ms(a, std::chrono::steady_clock::now()));
  return 0;
}

}  // namespace
}  // namespace ferry::worker

int main(int argc, char** argv) { return ferry::worker::Run(argc, argv); }
