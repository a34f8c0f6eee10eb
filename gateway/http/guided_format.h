// The HTTP fields that ask for structured output (guided decoding), read into one
// ferry.v1.GuidedDecoding: OpenAI's response_format (json_object, json_schema), vLLM's
// guided_choice, guided_json, guided_regex, guided_grammar and structured_outputs. At most one per
// request; a schema, regex or grammar is compiled here, so that a 400 names the HTTP field.
#pragma once

#include <optional>
#include <string>
#include <string_view>

#include "gateway/http/openai_format.h"

namespace ferry::gateway::http {

// body_text: the text body was parsed from; a schema given as an object is taken from it, so that
// its keys keep their order (properties are generated in it).
std::optional<ApiError> ParseGuided(const json& body, std::string_view body_text, ferry::v1::SamplingParams& s);

// A JSON schema's text checked as the worker will compile it (and its size against the gateway's
// limit), so that a schema the engine cannot keep is a 400 whose param is `field` (the request's
// field) and whose message names `where` (the schema's place in it). For every API's schema field.
std::optional<ApiError> CheckJsonSchemaText(const std::string& text, const std::string& field, const std::string& where);

}  // namespace ferry::gateway::http
