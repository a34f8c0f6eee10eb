// Limits of speculative decoding shared by the gateway (validation), the scheduler (KV slots it
// reserves) and the worker (drafts it proposes): proto/ferry/v1/sampling.proto SpeculativeDecoding.
#pragma once

#include <cstdint>
#include <string_view>

namespace ferry {

// Most draft tokens one step verifies for one sequence.
inline constexpr int32_t kMaxSpeculativeTokens = 15;
// num_speculative_tokens when a request names a method and neither it nor the server gives one.
inline constexpr int32_t kDefaultSpeculativeTokens = 4;

// Method names on the wire: "" (the server's default), "none", "ngram", "draft_model".
inline constexpr std::string_view kSpeculativeNone = "none";
inline constexpr std::string_view kSpeculativeNgram = "ngram";
inline constexpr std::string_view kSpeculativeDraftModel = "draft_model";

}  // namespace ferry
