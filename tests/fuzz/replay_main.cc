// Runs a fuzz target's LLVMFuzzerTestOneInput on files, without libFuzzer: the normal (GCC) test
// suite's check that every seed and every input that once crashed or hung still passes. Arguments
// are files or directories (every regular file in them, sorted). An argument that does not exist
// is skipped, so a target may have no regressions directory yet; but no input at all is an error,
// since a check that ran nothing cannot fail.
#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <string>
#include <vector>

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size);

namespace {

std::vector<std::filesystem::path> Inputs(int argc, char** argv) {
  std::vector<std::filesystem::path> files;
  for (int i = 1; i < argc; ++i) {
    const std::filesystem::path arg(argv[i]);
    if (std::filesystem::is_regular_file(arg)) files.push_back(arg);
    if (!std::filesystem::is_directory(arg)) continue;
    std::vector<std::filesystem::path> in_dir;
    for (const auto& entry : std::filesystem::directory_iterator(arg)) {
      if (entry.is_regular_file()) in_dir.push_back(entry.path());
    }
    std::sort(in_dir.begin(), in_dir.end());
    files.insert(files.end(), in_dir.begin(), in_dir.end());
  }
  return files;
}

}  // namespace

int main(int argc, char** argv) {
  const std::vector<std::filesystem::path> files = Inputs(argc, argv);
  if (files.empty()) {
    std::fprintf(stderr, "no input files under the arguments given\n");
    return 1;
  }
  for (const auto& path : files) {
    std::ifstream in(path, std::ios::binary);
    const std::string bytes((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
    // Printed first: a crash or an abort in the target leaves the file's name as the last line.
    std::fprintf(stderr, "input %s (%zu bytes)\n", path.c_str(), bytes.size());
    const auto start = std::chrono::steady_clock::now();
    LLVMFuzzerTestOneInput(reinterpret_cast<const uint8_t*>(bytes.data()), bytes.size());
    const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    // libFuzzer's default -timeout is 1200 s; inputs kept for hangs must now take well under one.
    if (seconds > 10) {
      std::fprintf(stderr, "%s took %.1f s (limit 10 s)\n", path.c_str(), seconds);
      return 1;
    }
  }
  std::fprintf(stderr, "%zu inputs passed\n", files.size());
  return 0;
}
