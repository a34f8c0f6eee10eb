// A child service process: started with fork/exec, tied to our lifetime
// (PR_SET_PDEATHSIG), stopped with SIGTERM then SIGKILL after a grace period.
#pragma once

#include <sys/types.h>

#include <chrono>
#include <optional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

namespace ferry::launch {

class ChildProcess {
 public:
  ChildProcess(std::string name, std::vector<std::string> argv);
  ~ChildProcess();  // stops the child if still running
  ChildProcess(const ChildProcess&) = delete;
  ChildProcess& operator=(const ChildProcess&) = delete;

  const std::string& name() const { return name_; }
  pid_t pid() const { return pid_; }

  // Non-blocking: returns the exit description once the child has ended.
  std::optional<std::string> Exited();
  // SIGTERM, wait up to grace, then SIGKILL. Returns the exit description.
  std::string Stop(std::chrono::milliseconds grace);
  // SIGKILL (which also ends a stopped process) and reap. Returns the exit description.
  std::string Kill();

 private:
  std::string Describe(int status) const;

  std::string name_;
  pid_t pid_ = -1;
  std::optional<std::string> exit_;
};

// Polls for a ready file written by the child (see common/process.h) while
// checking that the child is alive. Throws std::runtime_error on exit/timeout.
nlohmann::json WaitForReadyFile(ChildProcess& child, const std::string& path, std::chrono::seconds timeout);

}  // namespace ferry::launch
