#include "worker/engine/ngram_proposer.h"

#include <algorithm>

namespace ferry::worker {
namespace {

// The latest start i < len - n with tokens[i, i + n) equal to the last n tokens; -1 if none.
int64_t LatestOccurrence(std::span<const int32_t> tokens, int32_t n) {
  const auto len = static_cast<int64_t>(tokens.size());
  const int32_t* suffix = tokens.data() + (len - n);
  const int32_t last = suffix[n - 1];
  for (int64_t i = len - n - 1; i >= 0; --i) {
    if (tokens[static_cast<size_t>(i + n - 1)] != last) continue;  // cheap first test
    if (std::equal(suffix, suffix + n, tokens.data() + i)) return i;
  }
  return -1;
}

}  // namespace

int32_t ProposeNgram(std::span<const int32_t> tokens, int32_t min_n, int32_t max_n, int32_t max_drafts,
                     std::vector<int32_t>& drafts) {
  drafts.clear();
  const auto len = static_cast<int64_t>(tokens.size());
  if (max_drafts <= 0 || min_n < 1) return 0;
  // The suffix must leave at least one earlier token to match against.
  for (int64_t n = std::min<int64_t>(max_n, len - 1); n >= min_n; --n) {
    const int64_t start = LatestOccurrence(tokens, static_cast<int32_t>(n));
    if (start < 0) continue;
    // Position start + n + j predicts len + j; shift = how far back the prediction reads.
    const int64_t shift = len - (start + n);
    for (int64_t j = 0; j < max_drafts; ++j) {
      const int64_t from = start + n + j;
      drafts.push_back(from < len ? tokens[static_cast<size_t>(from)] : drafts[static_cast<size_t>(j - shift)]);
    }
    return static_cast<int32_t>(drafts.size());
  }
  return 0;
}

}  // namespace ferry::worker
