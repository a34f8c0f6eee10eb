#include "tools/launch/child_process.h"

#include <signal.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <fstream>
#include <stdexcept>
#include <thread>

#include <fmt/format.h>
#include <spdlog/spdlog.h>

namespace ferry::launch {

ChildProcess::ChildProcess(std::string name, std::vector<std::string> argv) : name_(std::move(name)) {
  std::vector<char*> args;
  for (auto& a : argv) args.push_back(a.data());
  args.push_back(nullptr);
  const pid_t parent = getpid();
  pid_ = fork();
  if (pid_ < 0) throw std::runtime_error("fork failed for " + name_);
  if (pid_ == 0) {
    // The child dies with us even if we are killed without a chance to stop it.
    prctl(PR_SET_PDEATHSIG, SIGTERM);
    if (getppid() != parent) _exit(1);
    sigset_t none;
    sigemptyset(&none);
    sigprocmask(SIG_SETMASK, &none, nullptr);
    execv(args[0], args.data());
    fprintf(stderr, "cannot exec %s\n", args[0]);
    _exit(127);
  }
  spdlog::info("started {} (pid {}): {}", name_, pid_, fmt::join(argv, " "));
}

ChildProcess::~ChildProcess() {
  if (!exit_) Stop(std::chrono::seconds(5));
}

std::string ChildProcess::Describe(int status) const {
  if (WIFEXITED(status)) return fmt::format("exited with code {}", WEXITSTATUS(status));
  if (WIFSIGNALED(status)) return fmt::format("killed by signal {}", WTERMSIG(status));
  return "ended";
}

std::optional<std::string> ChildProcess::Exited() {
  if (exit_) return exit_;
  int status = 0;
  if (waitpid(pid_, &status, WNOHANG) == pid_) exit_ = Describe(status);
  return exit_;
}

std::string ChildProcess::Stop(std::chrono::milliseconds grace) {
  if (Exited()) return *exit_;
  kill(pid_, SIGTERM);
  const auto deadline = std::chrono::steady_clock::now() + grace;
  while (std::chrono::steady_clock::now() < deadline) {
    if (Exited()) return *exit_;
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  spdlog::warn("{} (pid {}) did not stop within {} ms; killing it", name_, pid_, grace.count());
  return Kill();
}

std::string ChildProcess::Kill() {
  if (Exited()) return *exit_;
  kill(pid_, SIGKILL);
  int status = 0;
  waitpid(pid_, &status, 0);
  exit_ = Describe(status);
  return *exit_;
}

nlohmann::json WaitForReadyFile(ChildProcess& child, const std::string& path, std::chrono::seconds timeout) {
  const auto deadline = std::chrono::steady_clock::now() + timeout;
  while (std::chrono::steady_clock::now() < deadline) {
    if (auto exit = child.Exited()) {
      throw std::runtime_error(fmt::format("{} (pid {}) {} before becoming ready", child.name(), child.pid(), *exit));
    }
    std::ifstream in(path);
    if (in) return nlohmann::json::parse(in);
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
  throw std::runtime_error(fmt::format("{} not ready after {} s", child.name(), timeout.count()));
}

}  // namespace ferry::launch
