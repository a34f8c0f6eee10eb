// What every HTTP route of the gateway shares: the caller's bearer key and OpenAI's error shape.
#pragma once

#include <optional>
#include <string>
#include <string_view>

#include <httplib.h>

#include "gateway/http/openai_format.h"

namespace ferry::gateway::http {

inline void SendError(httplib::Response& res, const ApiError& error) {
  res.status = error.http_status;
  if (error.retry_after_s > 0) res.set_header("Retry-After", std::to_string(error.retry_after_s));
  // A message may quote a client's text cut mid-character: never throw on it.
  res.set_content(ErrorJson(error).dump(-1, ' ', false, json::error_handler_t::replace), "application/json");
}

inline std::optional<std::string> Bearer(const httplib::Request& req) {
  const std::string header = req.get_header_value("Authorization");
  constexpr std::string_view kPrefix = "Bearer ";
  if (header.rfind(kPrefix, 0) != 0) return std::nullopt;
  return header.substr(kPrefix.size());
}

}  // namespace ferry::gateway::http
