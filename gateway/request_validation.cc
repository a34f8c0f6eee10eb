#include "gateway/request_validation.h"

#include <algorithm>
#include <cmath>

#include "structured/ebnf_grammar.h"
#include "structured/json_schema.h"
#include "structured/regex_dfa.h"
#include "common/speculative.h"
#include "common/status.h"
#include "proto/speculative.h"

namespace ferry::gateway {

namespace {

constexpr int kMaxStopStrings = 16;
constexpr size_t kMaxStopBytes = 256;
constexpr size_t kQuotedValueBytes = 32;  // of a long string quoted back in a message

// The start of `s` (cut at a UTF-8 character boundary) for an error message; `s` is valid UTF-8.
std::string Shortened(const std::string& s) {
  if (s.size() <= kQuotedValueBytes) return s;
  size_t end = kQuotedValueBytes;
  while (end > 0 && (static_cast<unsigned char>(s[end]) & 0xC0) == 0x80) --end;
  return s.substr(0, end) + "...";
}

// Returns a message for a bad choice list, or an empty string.
std::string CheckChoices(const ferry::v1::GuidedChoice& choice) {
  const auto& choices = choice.choices();
  if (choices.empty() || choices.size() > kMaxGuidedChoices) {
    return FieldMessage("sampling.guided.choice.choices (count)", choices.size(),
                        fmt::format("must be in [1, {}]", kMaxGuidedChoices));
  }
  for (int i = 0; i < choices.size(); ++i) {
    const std::string& text = choices[i];
    const std::string field = fmt::format("sampling.guided.choice.choices[{}]", i);
    if (text.empty()) return FieldMessage(field, "", "must be non-empty");
    if (!IsValidUtf8(text)) return field + " is not valid UTF-8";
    if (text.size() > kMaxGuidedChoiceBytes) {
      return FieldMessage(field, Shortened(text),
                          fmt::format("is {} bytes, over the limit of {}", text.size(), kMaxGuidedChoiceBytes));
    }
  }
  return {};
}

// Compiled here, as the worker will, so that a schema the engine cannot keep is refused before
// it is queued (the compiler's message names the place and the keyword).
std::string CheckJsonSchema(const std::string& schema) {
  if (schema.size() > kMaxGuidedJsonSchemaBytes) {
    return FieldMessage("sampling.guided.json_schema (bytes)", schema.size(),
                        fmt::format("exceeds the limit of {}", kMaxGuidedJsonSchemaBytes));
  }
  try {
    CompileJsonSchemaCached(schema);
  } catch (const JsonSchemaError& e) {
    return std::string("sampling.guided.json_schema: ") + e.what();
  }
  return {};
}

// Compiled here for the same reason as a schema: the compiler's message names the construct it
// refuses and its byte offset in the pattern.
std::string CheckRegex(const std::string& pattern) {
  if (pattern.size() > kMaxRegexBytes) {
    return FieldMessage("sampling.guided.regex (bytes)", pattern.size(),
                        fmt::format("exceeds the limit of {}", kMaxRegexBytes));
  }
  try {
    CompileRegexCached(pattern);
  } catch (const RegexError& e) {
    return std::string("sampling.guided.regex: ") + e.what();
  }
  return {};
}

// A grammar is expanded to a regex and compiled here, as the worker will: a recursive or
// too large one is refused naming the line and column, or the regex construct it expanded to.
std::string CheckGrammar(const std::string& grammar) {
  if (grammar.size() > kMaxGrammarBytes) {
    return FieldMessage("sampling.guided.grammar (bytes)", grammar.size(),
                        fmt::format("exceeds the limit of {}", kMaxGrammarBytes));
  }
  try {
    CheckGrammarCached(grammar);
  } catch (const GrammarError& e) {
    return std::string("sampling.guided.grammar: ") + e.what();
  }
  return {};
}

// Returns a message for a bad structured output constraint, or an empty string. A json_object
// set to false is refused rather than read as "unset": the client meant something by setting it.
std::string CheckGuided(const ferry::v1::GuidedDecoding& g) {
  switch (g.kind_case()) {
    case ferry::v1::GuidedDecoding::kJsonObject:
      if (g.json_object()) return {};
      return FieldMessage("sampling.guided.json_object", false,
                          "must be true when set (leave guided unset for no constraint)");
    case ferry::v1::GuidedDecoding::kChoice: return CheckChoices(g.choice());
    case ferry::v1::GuidedDecoding::kJsonSchema: return CheckJsonSchema(g.json_schema());
    case ferry::v1::GuidedDecoding::kRegex: return CheckRegex(g.regex());
    case ferry::v1::GuidedDecoding::kGrammar: return CheckGrammar(g.grammar());
    default: return {};
  }
}

// The names and range; whether the replica's workers can propose with a method is the scheduler's
// check (SchedulerInfo.speculative_methods).
std::string CheckSpeculative(const ferry::v1::SpeculativeDecoding& s) {
  if (!FromProto(s.method())) {  // a value this server's enum does not have
    return FieldMessage("sampling.speculative.method", s.method(),
                        "is not a SpeculativeMethod (DEFAULT, NONE, NGRAM, DRAFT_MODEL)");
  }
  if (s.has_num_speculative_tokens() &&
      (s.num_speculative_tokens() < 0 || s.num_speculative_tokens() > kMaxSpeculativeTokens)) {
    return FieldMessage("sampling.speculative.num_speculative_tokens", s.num_speculative_tokens(),
                        fmt::format("must be in [0, {}] (0 turns it off)", kMaxSpeculativeTokens));
  }
  return {};
}

// Returns a message for the first bad sampling field, or an empty string.
std::string CheckSampling(const ferry::v1::SamplingParams& s) {
  if (s.has_max_tokens() && s.max_tokens() <= 0) {
    return FieldMessage("sampling.max_tokens", s.max_tokens(), "must be > 0");
  }
  if (!std::isfinite(s.temperature()) || s.temperature() < 0) {
    return FieldMessage("sampling.temperature", s.temperature(), "must be >= 0");
  }
  if (s.has_top_p() && !(s.top_p() > 0 && s.top_p() <= 1)) {
    return FieldMessage("sampling.top_p", s.top_p(), "must be in (0, 1]");
  }
  if (s.top_k() < 0) return FieldMessage("sampling.top_k", s.top_k(), "must be >= 0 (0 disables top-k)");
  if (s.has_min_p() && !(s.min_p() >= 0 && s.min_p() <= 1)) {
    return FieldMessage("sampling.min_p", s.min_p(), "must be in [0, 1]");
  }
  if (!(s.presence_penalty() >= -2 && s.presence_penalty() <= 2)) {
    return FieldMessage("sampling.presence_penalty", s.presence_penalty(), "must be in [-2, 2]");
  }
  if (!(s.frequency_penalty() >= -2 && s.frequency_penalty() <= 2)) {
    return FieldMessage("sampling.frequency_penalty", s.frequency_penalty(), "must be in [-2, 2]");
  }
  if (s.has_repetition_penalty() && !(s.repetition_penalty() > 0 && std::isfinite(s.repetition_penalty()))) {
    return FieldMessage("sampling.repetition_penalty", s.repetition_penalty(), "must be > 0 (1 disables it)");
  }
  if (s.has_logprobs() && (s.logprobs() < 0 || s.logprobs() > kMaxLogprobs)) {
    return FieldMessage("sampling.logprobs", s.logprobs(), fmt::format("must be in [0, {}]", kMaxLogprobs));
  }
  if (s.has_prompt_logprobs() && (s.prompt_logprobs() < 0 || s.prompt_logprobs() > kMaxLogprobs)) {
    return FieldMessage("sampling.prompt_logprobs", s.prompt_logprobs(), fmt::format("must be in [0, {}]", kMaxLogprobs));
  }
  if (s.stop_size() > kMaxStopStrings) {
    return FieldMessage("sampling.stop (count)", s.stop_size(), fmt::format("exceeds the limit of {}", kMaxStopStrings));
  }
  for (int i = 0; i < s.stop_size(); ++i) {
    const std::string& stop = s.stop(i);
    const std::string field = fmt::format("sampling.stop[{}]", i);
    if (stop.empty()) return field + " is empty; stop strings must be non-empty";
    if (stop.size() > kMaxStopBytes) {
      return FieldMessage(field + " (bytes)", stop.size(), fmt::format("exceeds the limit of {}", kMaxStopBytes));
    }
    if (!IsValidUtf8(stop)) return field + " is not valid UTF-8";
  }
  if (std::string e = CheckSpeculative(s.speculative()); !e.empty()) return e;
  return CheckGuided(s.guided());
}

// Tokenises or checks the prompt; returns an error message or fills ids.
std::string PreparePrompt(const ferry::v1::GenerateRequest& r, const ModelLimits& limits,
                          const tokenizer::Tokenizer& tokenizer, std::vector<int32_t>& ids) {
  if (r.has_token_ids()) {
    const auto& in = r.token_ids().ids();
    if (in.empty()) return "prompt is empty: token_ids.ids has no tokens";
    for (int i = 0; i < in.size(); ++i) {
      if (in[i] < 0 || in[i] >= limits.vocab_size) {
        return FieldMessage(fmt::format("token_ids.ids[{}]", i), in[i],
                            fmt::format("is outside the vocabulary [0, {})", limits.vocab_size));
      }
    }
    ids.assign(in.begin(), in.end());
    return {};
  }
  if (r.text().empty()) return "prompt is empty: set text or token_ids";
  if (!IsValidUtf8(r.text())) return "text is not valid UTF-8";
  // A text too long for the context is refused before it is encoded (~56 ns a byte, on the
  // thread that serves the call).
  if (const int64_t at_least = tokenizer.MinTokensFor(r.text().size()); at_least > limits.max_model_len) {
    return fmt::format("text is {} bytes, at least {} tokens: more than max_model_len {}", r.text().size(),
                       at_least, limits.max_model_len);
  }
  ids = tokenizer.Encode(r.text(), AddsSpecialTokens(r));
  if (ids.empty()) return "prompt is empty: text produced no tokens";
  return {};
}

// Returns a message for the first bad field that names tokens or counts them (stop token ids,
// min_tokens, logit bias): they need the vocabulary and the resolved max_tokens.
std::string CheckTokenFields(const ferry::v1::SamplingParams& s, int32_t max_tokens, int32_t vocab_size) {
  if (s.stop_token_ids_size() > kMaxStopTokenIds) {
    return FieldMessage("sampling.stop_token_ids (count)", s.stop_token_ids_size(),
                        fmt::format("exceeds the limit of {}", kMaxStopTokenIds));
  }
  for (int i = 0; i < s.stop_token_ids_size(); ++i) {
    if (s.stop_token_ids(i) < 0 || s.stop_token_ids(i) >= vocab_size) {
      return FieldMessage(fmt::format("sampling.stop_token_ids[{}]", i), s.stop_token_ids(i),
                          fmt::format("is outside the vocabulary [0, {})", vocab_size));
    }
  }
  if (s.min_tokens() < 0 || s.min_tokens() > max_tokens) {
    return FieldMessage("sampling.min_tokens", s.min_tokens(), fmt::format("must be in [0, max_tokens = {}]", max_tokens));
  }
  if (s.allowed_token_ids_size() > kMaxAllowedTokenIds) {
    return FieldMessage("sampling.allowed_token_ids (count)", s.allowed_token_ids_size(),
                        fmt::format("exceeds the limit of {}", kMaxAllowedTokenIds));
  }
  for (int i = 0; i < s.allowed_token_ids_size(); ++i) {
    if (s.allowed_token_ids(i) < 0 || s.allowed_token_ids(i) >= vocab_size) {
      return FieldMessage(fmt::format("sampling.allowed_token_ids[{}]", i), s.allowed_token_ids(i),
                          fmt::format("is outside the vocabulary [0, {})", vocab_size));
    }
  }
  if (s.allowed_token_ids_size() > 0 && s.guided().kind_case() != ferry::v1::GuidedDecoding::KIND_NOT_SET) {
    return "sampling.allowed_token_ids and sampling.guided cannot both be set: a request takes one constraint on "
           "its tokens";
  }
  if (s.logit_bias_size() > kMaxLogitBias) {
    return FieldMessage("sampling.logit_bias", s.logit_bias_size(),
                        fmt::format("entries exceed the limit of {}", kMaxLogitBias));
  }
  for (const auto& [token, bias] : s.logit_bias()) {
    const std::string field = fmt::format("sampling.logit_bias[{}]", token);
    if (token < 0 || token >= vocab_size) {
      return FieldMessage(field, token, fmt::format("names a token outside the vocabulary [0, {})", vocab_size));
    }
    if (!(bias >= -100 && bias <= 100)) return FieldMessage(field, bias, "must be in [-100, 100]");
  }
  return {};
}

// The scheduler's request for a valid one: the client's sampling message with every optional
// field resolved (the request's value, else the model's default, else the API's); stop strings
// stay here (the gateway applies them to the text).
ValidatedRequest BuildSubmit(const ferry::v1::GenerateRequest& r, const std::vector<int32_t>& ids,
                             int32_t max_tokens, const ferry::v1::GenerationDefaults& d, const Lane& lane) {
  ValidatedRequest out;
  auto& sub = out.submit;
  sub.set_request_id(r.request_id());
  sub.set_idempotency_key(r.idempotency_key());  // scoped by the front
  sub.mutable_prompt_token_ids()->Add(ids.begin(), ids.end());
  ferry::v1::SamplingParams& p = *sub.mutable_sampling() = r.sampling();
  out.stop.assign(p.stop().begin(), p.stop().end());
  out.include_stop = p.include_stop_str_in_output();
  out.skip_special_tokens = !p.has_skip_special_tokens() || p.skip_special_tokens();
  p.clear_stop();
  p.clear_include_stop_str_in_output();
  p.clear_skip_special_tokens();
  if (p.guided().kind_case() == ferry::v1::GuidedDecoding::KIND_NOT_SET) p.clear_guided();  // no constraint
  p.set_max_tokens(max_tokens);
  if (!p.has_temperature()) p.set_temperature(d.has_temperature() ? d.temperature() : 0.f);
  if (!p.has_top_p()) p.set_top_p(d.has_top_p() ? d.top_p() : 1.f);
  if (!p.has_top_k()) p.set_top_k(d.has_top_k() ? d.top_k() : 0);
  if (!p.has_min_p()) p.set_min_p(d.has_min_p() ? d.min_p() : 0.f);
  if (!p.has_repetition_penalty()) p.set_repetition_penalty(d.has_repetition_penalty() ? d.repetition_penalty() : 1.f);
  sub.set_priority(lane.priority);
  sub.set_lane(lane.name);
  sub.set_lora_name(r.lora_name());
  sub.set_queue_timeout_ms(lane.queue_timeout_ms);
  out.lane = lane.name;
  out.lane_rules = lane;
  return out;
}

}  // namespace

std::string CheckRequestId(const std::string& id) {
  if (id.size() > kMaxRequestIdBytes) {
    return FieldMessage("request_id (bytes)", id.size(), fmt::format("exceeds the limit of {}", kMaxRequestIdBytes));
  }
  for (size_t i = 0; i < id.size(); ++i) {
    const auto c = static_cast<unsigned char>(id[i]);
    if (c < 0x20 || c == 0x7f) {
      return fmt::format("request_id has a control character (byte 0x{:02x} at {}); it must be printable", c, i);
    }
  }
  return {};
}

std::string CheckIdempotencyKey(const std::string& key, const std::string& field) {
  if (key.size() > kMaxIdempotencyKeyBytes) {
    return FieldMessage(field + " (bytes)", key.size(), fmt::format("exceeds the limit of {}", kMaxIdempotencyKeyBytes));
  }
  for (size_t i = 0; i < key.size(); ++i) {
    const auto c = static_cast<unsigned char>(key[i]);
    if (c < 0x20 || c == 0x7f) return fmt::format("{} has a control character (byte 0x{:02x} at {})", field, c, i);
  }
  return {};
}

std::string ScopeIdempotencyKey(const std::string& tenant, const std::string& key) {
  return fmt::format("{}:{}:{}", tenant.size(), tenant, key);
}

std::variant<ValidatedRequest, ValidationError> ValidateRequest(const ferry::v1::GenerateRequest& r,
                                                                const ModelLimits& limits,
                                                                const LaneTable& lanes,
                                                                const tokenizer::Tokenizer& tokenizer) {
  if (std::string e = CheckRequestId(r.request_id()); !e.empty()) return ValidationError{e};
  const auto lane = lanes.Find(r.lane());
  if (!lane) return ValidationError{FieldMessage("lane", r.lane(), "is not a known lane (" + lanes.Names() + ")")};
  if (!r.lora_name().empty() && !limits.adapters->Has(r.lora_name())) {
    // The served adapters are not listed: some may be other tenants' (gateway/auth).
    return ValidationError{FieldMessage("lora_name", r.lora_name(),
                                        limits.adapters->empty()
                                            ? std::string("is not served: the model serves no LoRA adapters")
                                            : std::string("is not a LoRA adapter this model serves"))};
  }
  const auto& s = r.sampling();
  if (std::string e = CheckSampling(s); !e.empty()) return ValidationError{e};
  std::vector<int32_t> ids;
  if (std::string e = PreparePrompt(r, limits, tokenizer, ids); !e.empty()) return ValidationError{e};

  int32_t max_tokens = s.has_max_tokens() ? s.max_tokens() : kDefaultMaxTokens;
  if (lane->max_tokens > 0 && max_tokens > lane->max_tokens) {
    if (s.has_max_tokens()) {
      return ValidationError{FieldMessage("sampling.max_tokens", max_tokens,
                                          fmt::format("exceeds lane \"{}\"'s cap of {}", lane->name, lane->max_tokens))};
    }
    max_tokens = lane->max_tokens;
  }
  const int64_t total = static_cast<int64_t>(ids.size()) + max_tokens;
  if (total > limits.max_model_len) {
    return ValidationError{fmt::format(
        "prompt tokens ({}) + sampling.max_tokens ({}) = {} exceeds max_model_len {}", ids.size(), max_tokens,
        total, limits.max_model_len)};
  }
  if (std::string e = CheckTokenFields(s, max_tokens, limits.vocab_size); !e.empty()) return ValidationError{e};
  return BuildSubmit(r, ids, max_tokens, limits.defaults, *lane);
}

}  // namespace ferry::gateway
