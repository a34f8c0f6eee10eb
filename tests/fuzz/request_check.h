// The check the two request fuzzers share: a GenerateRequest either passes the gateway's
// validation (gateway/request_validation.h) into a SubmitRequest the scheduler can trust, or is
// refused with a message; it never crashes or throws.
#pragma once

#include <variant>

#include "gateway/request_validation.h"
#include "tests/fuzz/demo_tokenizer.h"
#include "tests/fuzz/fuzz_check.h"

namespace ferry::fuzz {

inline void CheckValidation(const ferry::v1::GenerateRequest& request) {
  static const gateway::LaneTable lanes = gateway::LaneTable::Defaults();
  const tokenizer::Tokenizer& tok = DemoTokenizer();
  const gateway::ModelLimits limits{4096, tok.vocab_size(), {}};
  std::variant<gateway::ValidatedRequest, gateway::ValidationError> out;
  ExpectNoThrow([&] { out = gateway::ValidateRequest(request, limits, lanes, tok); });
  if (const auto* error = std::get_if<gateway::ValidationError>(&out)) {
    FUZZ_CHECK(!error->message.empty(), "a refusal without a message");
    return;
  }
  const auto& submit = std::get<gateway::ValidatedRequest>(out).submit;
  FUZZ_CHECK(submit.prompt_token_ids_size() < limits.max_model_len, "%d prompt tokens pass a %d-token context",
             submit.prompt_token_ids_size(), limits.max_model_len);
  for (int32_t id : submit.prompt_token_ids()) {
    FUZZ_CHECK(id >= 0 && id < limits.vocab_size, "prompt token %d of %d", id, limits.vocab_size);
  }
  const int64_t max_tokens = submit.sampling().max_tokens();
  FUZZ_CHECK(max_tokens >= 0 && submit.prompt_token_ids_size() + max_tokens <= limits.max_model_len,
             "%d prompt tokens + max_tokens %lld pass a %d-token context", submit.prompt_token_ids_size(),
             static_cast<long long>(max_tokens), limits.max_model_len);
}

}  // namespace ferry::fuzz
