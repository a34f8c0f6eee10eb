// Prompt lookup (vLLM's "ngram" speculative method): the drafts are the tokens that followed an
// earlier occurrence of the context's last n tokens. Needs no model: it pays off where the output
// copies its input (editing, summarising, code, quoting) or repeats itself.
#pragma once

#include <cstdint>
#include <span>
#include <vector>

namespace ferry::worker {

// For the largest n in [min_n, max_n] whose last n tokens occurred before, the latest such
// occurrence; the drafts are what followed it, up to max_drafts. Where the occurrence overlaps the
// suffix (a repeating pattern of period p), the pattern is continued: draft j beyond the context
// is draft j - p. Writes them into `drafts` (cleared first); returns how many (0: no match).
// tokens: [num_tokens], the prompt and every generated token. Deterministic: every
// tensor-parallel rank proposes the same.
int32_t ProposeNgram(std::span<const int32_t> tokens, int32_t min_n, int32_t max_n, int32_t max_drafts,
                     std::vector<int32_t>& drafts);

}  // namespace ferry::worker
