#include "gateway/store/batch_input.h"

#include <algorithm>
#include <optional>
#include <string>

#include <nlohmann/json.hpp>

namespace ferry::gateway::store {
namespace {

bool IsBlank(std::string_view line) {
  return line.find_first_not_of(" \t\r") == std::string_view::npos;
}

// The fields of a request line; any other is refused by name, so a typo ("boby") is not a request
// with an empty body.
constexpr std::string_view kFields[] = {"custom_id", "method", "url", "body"};

// One line's request, or the reason it is not one (`error.code` empty: valid).
BatchLine ParseLine(std::string_view text, int64_t number, std::string_view endpoint,
                    const BatchInputLimits& limits, BatchLineError& error) {
  error = BatchLineError{number, std::nullopt, "", ""};
  const auto fail = [&](const char* code, std::string message) {
    error.code = code;
    error.message = "line " + std::to_string(number) + ": " + std::move(message);
    return BatchLine{};
  };
  const nlohmann::json j = nlohmann::json::parse(text, nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded()) return fail("invalid_json", "not valid JSON");
  if (!j.is_object()) return fail("invalid_request", std::string("want a JSON object, got ") + j.type_name());
  const auto id = j.find("custom_id");
  if (id != j.end() && id->is_string()) error.custom_id = id->get<std::string>();
  for (const auto& [key, value] : j.items()) {
    bool known = false;
    for (std::string_view f : kFields) known = known || key == f;
    if (!known) return fail("invalid_request", "unknown field '" + key + "' (want custom_id, method, url, body)");
  }
  if (id == j.end() || !id->is_string() || id->get_ref<const std::string&>().empty()) {
    return fail("missing_custom_id", "custom_id must be a non-empty string");
  }
  const std::string& custom_id = id->get_ref<const std::string&>();
  if (static_cast<int64_t>(custom_id.size()) > limits.max_custom_id_chars) {
    return fail("invalid_custom_id", "custom_id is " + std::to_string(custom_id.size()) + " bytes, limit " +
                                         std::to_string(limits.max_custom_id_chars));
  }
  const auto method = j.find("method");
  if (method == j.end() || !method->is_string() || *method != "POST") {
    return fail("invalid_method", "method must be \"POST\", got " + (method == j.end() ? "none" : method->dump()));
  }
  const auto url = j.find("url");
  if (url == j.end() || !url->is_string() || *url != endpoint) {
    return fail("invalid_url", "url must be the batch's endpoint \"" + std::string(endpoint) + "\", got " +
                                   (url == j.end() ? "none" : url->dump()));
  }
  const auto body = j.find("body");
  if (body == j.end() || !body->is_object()) {
    return fail("invalid_body", std::string("body must be a JSON object, got ") +
                                    (body == j.end() ? "none" : body->type_name()));
  }
  return BatchLine{number, custom_id, "POST", std::string(endpoint), body->dump()};
}

}  // namespace

ParsedInput ParseBatchInput(std::string_view jsonl, std::string_view endpoint, const BatchInputLimits& limits) {
  ParsedInput out;
  int64_t number = 0, requests = 0;
  size_t pos = 0;
  while (pos < jsonl.size()) {
    const size_t end = std::min(jsonl.find('\n', pos), jsonl.size());
    const std::string_view text = jsonl.substr(pos, end - pos);
    pos = end + 1;
    ++number;
    if (IsBlank(text)) continue;
    if (++requests > limits.max_lines) {
      throw StoreError(StoreErrorKind::kInvalid, "input_file_id: more than " + std::to_string(limits.max_lines) +
                                                     " request lines (the limit per batch)");
    }
    BatchLineError error;
    BatchLine line = ParseLine(text, number, endpoint, limits, error);
    if (error.code.empty()) {
      out.lines.push_back(std::move(line));
    } else {
      out.errors.push_back(std::move(error));
    }
  }
  if (requests == 0) throw StoreError(StoreErrorKind::kInvalid, "input_file_id: the file holds no request line");
  return out;
}

}  // namespace ferry::gateway::store
