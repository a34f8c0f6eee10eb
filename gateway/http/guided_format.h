// The HTTP fields that ask for structured output (guided decoding), read into one
// ferry.v1.GuidedDecoding: OpenAI's response_format (json_object, json_schema), vLLM's
// guided_choice, guided_json, guided_regex, guided_grammar and structured_outputs. At most one per
// request; a schema, regex or grammar is compiled here, so that a 400 names the HTTP field.
#pragma once

#include <optional>
#include <string_view>

#include "gateway/http/openai_format.h"

namespace ferry::gateway::http {

// body_text: the text body was parsed from; a schema given as an object is taken from it, so that
// its keys keep their order (properties are generated in it).
std::optional<ApiError> ParseGuided(const json& body, std::string_view body_text, ferry::v1::SamplingParams& s);

}  // namespace ferry::gateway::http
