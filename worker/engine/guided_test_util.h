// Helpers shared by the guided-decoding tests: one random edit of a text, the texts an oracle
// parser cannot judge, and a mask's members.
#pragma once

#include <cstdint>
#include <random>
#include <regex>
#include <string>
#include <vector>

#include "worker/engine/guided_decoding.h"

namespace ferry::worker::testing {

// text with one byte deleted, replaced or inserted (from alphabet) at a random place.
inline std::string Mutated(std::string text, std::mt19937& rng, const std::string& alphabet) {
  const size_t at = rng() % (text.size() + 1);
  const char c = alphabet[rng() % alphabet.size()];
  if (rng() % 3 == 0 && at < text.size()) {
    text.erase(at, 1);
  } else if (rng() % 2 == 0 && at < text.size()) {
    text[at] = c;
  } else {
    text.insert(at, 1, c);
  }
  return text;
}

// nlohmann refuses numbers past double's range, which JSON's grammar allows: such a text is no
// test of an automaton against it.
inline bool HasHugeExponent(const std::string& text) {
  static const std::regex kHugeExponent("[eE][+-]?[0-9]{3,}");
  return std::regex_search(text, kHugeExponent);
}

inline std::vector<int32_t> Members(const TokenMask& m) {
  std::vector<int32_t> out;
  for (int32_t id = 0; id < m.size(); ++id) {
    if (m.Test(id)) out.push_back(id);
  }
  return out;
}

}  // namespace ferry::worker::testing
