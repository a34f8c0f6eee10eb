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

// Ignores SIGPIPE for the whole process (call first in main, with
// BlockShutdownSignals): a write to a socket or pipe whose reader is gone then
// fails with EPIPE in the code that wrote it, which reports it, instead of
// killing the process, SIGPIPE's default. Not every writer can say
// MSG_NOSIGNAL: Gloo's TCP transport writes with writev, and a CPU
// tensor-parallel rank whose peer died was killed that way (exit 141) where it
// should have thrown CommError (issue #53). The ignored disposition survives
// exec, so ferry-launch's children start with it too.
void IgnoreBrokenPipes();

}  // namespace ferry
