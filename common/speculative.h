// Limits of speculative decoding shared by the gateway (validation), the scheduler (KV slots it
// reserves) and the worker (drafts it proposes): proto/ferry/v1/sampling.proto SpeculativeDecoding.
#pragma once

#include <cstdint>
#include <optional>
#include <string_view>

namespace ferry {

// Most draft tokens one step verifies for one sequence.
inline constexpr int32_t kMaxSpeculativeTokens = 15;
// num_speculative_tokens when a request names a method and neither it nor the server gives one.
inline constexpr int32_t kDefaultSpeculativeTokens = 4;

// How a sequence speculates, for the code that does not read proto (the scheduler core, the worker's
// model): the values of ferry.v1.SpeculativeMethod (proto/speculative.h converts, and checks they agree).
enum class SpeculativeMethod : int32_t {
  kDefault = 0,  // a request: the server's default; a server or a sequence: off
  kNone = 1,
  kNgram = 2,
  kDraftModel = 3,
};

// vLLM's names, as HTTP requests and the worker's --speculative-config give them: "" (kDefault), "none",
// "ngram", "draft_model".
inline std::string_view SpeculativeMethodName(SpeculativeMethod method) {
  switch (method) {
    case SpeculativeMethod::kDefault: return "";
    case SpeculativeMethod::kNone: return "none";
    case SpeculativeMethod::kNgram: return "ngram";
    case SpeculativeMethod::kDraftModel: return "draft_model";
  }
  return "?";
}
// The method vLLM's `name` gives; nullopt for a name that is none of them.
inline std::optional<SpeculativeMethod> ParseSpeculativeMethodName(std::string_view name) {
  for (SpeculativeMethod m : {SpeculativeMethod::kDefault, SpeculativeMethod::kNone, SpeculativeMethod::kNgram,
                              SpeculativeMethod::kDraftModel}) {
    if (name == SpeculativeMethodName(m)) return m;
  }
  return std::nullopt;
}
// The method speculates: neither kDefault (unresolved, or off) nor kNone.
inline bool Speculates(SpeculativeMethod method) {
  return method != SpeculativeMethod::kDefault && method != SpeculativeMethod::kNone;
}

}  // namespace ferry
