// Tests' scratch directories: a fresh directory under the temp dir, removed when destroyed.
// Named by a tag and the process id, so tests of one binary run under ctest -j do not collide.
#pragma once

#include <unistd.h>

#include <filesystem>
#include <string>

namespace ferry::testing {

class TempDir {
 public:
  explicit TempDir(const std::string& tag) {
    path_ = std::filesystem::temp_directory_path() / ("ferry_" + tag + "_" + std::to_string(::getpid()));
    std::filesystem::remove_all(path_);
    std::filesystem::create_directories(path_);
  }
  ~TempDir() { std::filesystem::remove_all(path_); }
  TempDir(const TempDir&) = delete;
  TempDir& operator=(const TempDir&) = delete;

  std::string str() const { return path_.string(); }
  std::string operator/(const std::string& name) const { return (path_ / name).string(); }

 private:
  std::filesystem::path path_;
};

}  // namespace ferry::testing
