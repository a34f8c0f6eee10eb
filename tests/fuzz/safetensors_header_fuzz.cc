// The safetensors header parser (worker/checkpoint/safetensors.h's ParseSafetensorsHeader) on raw file
// bytes: the tensors or a std::runtime_error naming the file, never a crash. Every tensor it
// accepts lies inside the data section with no negative dimension, an element count within
// kMaxTensorElements and, for the readable dtypes, exactly the bytes its shape needs.
#include <cstddef>
#include <cstdint>
#include <stdexcept>

#include "tests/fuzz/fuzz_check.h"
#include "worker/checkpoint/safetensors.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  ExpectRefusalOrSuccess<std::runtime_error>([&] {
    uint64_t data_offset = 0;
    const auto tensors = ferry::worker::ParseSafetensorsHeader(data, size, "fuzz.safetensors", &data_offset);
    FUZZ_CHECK(data_offset >= 8 && data_offset <= size, "data offset %llu of %zu bytes",
               static_cast<unsigned long long>(data_offset), size);
    const uint64_t data_size = size - data_offset;
    for (const auto& [name, info] : tensors) {
      FUZZ_CHECK(info.begin <= info.end && info.end <= data_size, "tensor %s at [%llu, %llu) of %llu", name.c_str(),
                 static_cast<unsigned long long>(info.begin), static_cast<unsigned long long>(info.end),
                 static_cast<unsigned long long>(data_size));
      for (int64_t d : info.shape) FUZZ_CHECK(d >= 0, "tensor %s has dimension %lld", name.c_str(), static_cast<long long>(d));
      const int64_t count = info.num_elements();
      FUZZ_CHECK(count >= 0 && count <= ferry::worker::kMaxTensorElements, "tensor %s has %lld elements",
                 name.c_str(), static_cast<long long>(count));
      if (info.dtype == "F32" || info.dtype == "BF16" || info.dtype == "F16") {
        const uint64_t want = static_cast<uint64_t>(count) * ferry::worker::DtypeSize(info.dtype);
        FUZZ_CHECK(info.end - info.begin == want, "tensor %s: %llu bytes for %llu", name.c_str(),
                   static_cast<unsigned long long>(info.end - info.begin), static_cast<unsigned long long>(want));
      }
    }
  });
  return 0;
}
