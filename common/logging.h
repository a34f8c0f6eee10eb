// spdlog setup shared by the services. Every line carries the service name;
// lines about a request carry "req=<id>".
#pragma once

#include <string>
#include <string_view>

namespace ferry {

// Installs a stderr logger named after the service. level: trace, debug,
// info, warn, error.
void InitLogging(std::string_view service, std::string_view level = "info");

}  // namespace ferry
