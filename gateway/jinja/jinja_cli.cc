// Renders templates for the differential test against jinja2: each stdin line a JSON object
// {"template": text, "variables": {...}}, each stdout line {"output": text} or
// {"error": message, "line": n} (n: the template line, 0 when unknown).
#include <iostream>
#include <string>

#include <nlohmann/json.hpp>

#include "gateway/jinja/template.h"

int main() {
  using ferry::gateway::jinja::Error;
  using ferry::gateway::jinja::Template;
  using ferry::gateway::jinja::Value;
  std::string line;
  while (std::getline(std::cin, line)) {
    nlohmann::json out;
    const auto in = nlohmann::ordered_json::parse(line, nullptr, /*allow_exceptions=*/false);
    if (!in.is_object() || !in.contains("template") || !in["template"].is_string()) {
      out = {{"error", "each line must be an object with a string \"template\""}, {"line", 0}};
    } else {
      auto parsed = Template::Parse(in["template"].get<std::string>());
      std::variant<std::string, Error> rendered = Error{};
      if (auto* e = std::get_if<Error>(&parsed)) {
        rendered = *e;
      } else {
        try {
          const Value variables = Value::FromJson(in.value("variables", nlohmann::ordered_json::object()));
          rendered = variables.is_dict() ? std::get<Template>(parsed).Render(variables.dict())
                                         : std::variant<std::string, Error>(Error{"\"variables\" must be an object"});
        } catch (const Error& e) {  // variables nested past the engine's bound
          rendered = e;
        }
      }
      if (auto* s = std::get_if<std::string>(&rendered)) {
        out = {{"output", *s}};
      } else {
        const Error& e = std::get<Error>(rendered);
        out = {{"error", e.message}, {"line", e.line}};
      }
    }
    std::cout << out.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace) << "\n" << std::flush;
  }
  return 0;
}
