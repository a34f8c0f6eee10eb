// Checks a public GenerateRequest against the model's limits and turns it into
// the scheduler's request. Every error names the field, the value and the limit.
#pragma once

#include <memory>
#include <optional>
#include <string>
#include <variant>
#include <vector>

#include "common/utf8.h"
#include "common/sampling_limits.h"
#include "ferry/v1/generation.pb.h"
#include "ferry/v1/scheduler.pb.h"
#include "gateway/lanes.h"
#include "gateway/lora_catalog.h"
#include "gateway/tokenizer/tokenizer.h"

namespace ferry::gateway {

// Whether a text prompt is encoded with the tokenizer's special tokens (GenerateRequest's
// add_special_tokens; absent: true).
inline bool AddsSpecialTokens(const ferry::v1::GenerateRequest& r) {
  return !r.has_add_special_tokens() || r.add_special_tokens();
}

struct ModelLimits {
  int32_t max_model_len = 0;
  int32_t vocab_size = 0;
  // From the model's generation_config.json (via the scheduler's Info); a request's unset
  // optional sampling fields take these first.
  ferry::v1::GenerationDefaults defaults;
  // The LoRA adapters served (GenerateRequest.lora_name): the replicas' at start, then the admin
  // API's loads and unloads (lora_admin.h). Shared by every copy of the limits.
  std::shared_ptr<LoraCatalog> adapters = std::make_shared<LoraCatalog>();
};

using ferry::kMaxLogprobs;  // common/sampling_limits.h
// allowed_token_ids entries: enough for any class of tokens a request names one by one.
inline constexpr int kMaxAllowedTokenIds = 4096;
// OpenAI's limit on logit_bias entries.
inline constexpr int32_t kMaxLogitBias = 300;
// A choice constraint's list (sampling.guided.choice): bounded so that the worker's matcher, which
// walks every choice still possible at each step, stays cheap next to the forward pass.
inline constexpr int32_t kMaxGuidedChoices = 256;
inline constexpr size_t kMaxGuidedChoiceBytes = 1024;
// A JSON schema's text (sampling.guided.json_schema): compiled once in each process it passes
// (structured/README.md), and its automaton is bounded too (structured/json_schema.h's limits).
inline constexpr size_t kMaxGuidedJsonSchemaBytes = 64 * 1024;
// A regex (sampling.guided.regex) is bounded by structured/regex_dfa.h's kMaxRegexBytes (4,096) and
// compiled the same way.

inline constexpr int32_t kDefaultMaxTokens = 16;
// A client's request_id goes into every log line and chunk of its request: bounded and printable.
inline constexpr size_t kMaxRequestIdBytes = 128;
inline constexpr int32_t kMaxStopTokenIds = 1024;

// Empty when `id` may be a request id, else why not (naming the field and the limit).
std::string CheckRequestId(const std::string& id);

// GenerateRequest.idempotency_key: a client's is bounded and printable.
inline constexpr size_t kMaxIdempotencyKeyBytes = 256;
// Empty when `key` may be an idempotency key, else why not (naming `field` and the limit).
std::string CheckIdempotencyKey(const std::string& key, const std::string& field = "idempotency_key");
// The key as the scheduler sees it: the tenant's own, so two tenants' keys never meet
// ("<tenant length>:<tenant>:<key>"). Each front calls it once it knows the tenant.
std::string ScopeIdempotencyKey(const std::string& tenant, const std::string& key);

struct ValidatedRequest {
  ferry::v1::SubmitRequest submit;  // prompt tokenised, sampling resolved (sampling.proto)
  std::vector<std::string> stop;    // stop strings, valid UTF-8
  bool include_stop = false;        // the matched stop string ends the text, not cut from it
  bool skip_special_tokens = true;  // the text leaves out special tokens
  std::string lane;
  Lane lane_rules;  // the lane's admission rules
};

struct ValidationError {
  std::string message;
};

std::variant<ValidatedRequest, ValidationError> ValidateRequest(const ferry::v1::GenerateRequest& request,
                                                                const ModelLimits& limits,
                                                                const LaneTable& lanes,
                                                                const tokenizer::Tokenizer& tokenizer);

using ferry::IsValidUtf8;  // common/utf8.h

}  // namespace ferry::gateway
