// Process plumbing shared by the service mains: the ready file that tells a
// launcher (or a test) where a service listens, and waiting for SIGTERM/SIGINT.
#pragma once

#include <string>

#include <nlohmann/json.hpp>

namespace ferry {

// Writes JSON to path atomically (temp file + rename), so a reader polling for
// the file never sees half of it. No-op when path is empty.
void WriteReadyFile(const std::string& path, const nlohmann::json& content);

// Blocks SIGTERM and SIGINT in the calling thread (call first in main, before
// threads start, so every thread inherits the mask); WaitForShutdownSignal
// then returns the signal number when one arrives.
void BlockShutdownSignals();
int WaitForShutdownSignal();

}  // namespace ferry
